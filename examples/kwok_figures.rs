//! The operator's figures on the project's real API server with kwok Nodes, beside the
//! simulator's ideal scheduler (issue 57 item 3). Run it through `scripts/kwok-figures.sh`,
//! which starts the API server, the scheduler, the controllers and kwok, builds this and the
//! operator in release, and stops the server afterwards:
//!
//! ```text
//! bash scripts/kwok-figures.sh [--workers 1000] [--max-unavailable 50] [--time-scale 10]
//! ```
//!
//! It runs the scenario of the kwok end-to-end test (`examples/tests/operator_kwok.rs`: 30
//! Deployments of 20 and 20 StatefulSets of 3 under budgets, placed by kube-scheduler on
//! the fleet's Nodes) with the release operator under its least-privilege ServiceAccount,
//! and prints, each beside its goal:
//!
//! - the operator's API requests and writes per machine (its `/metrics`);
//! - its peak RSS (`VmHWM`);
//! - the makespan in fleet time against the ideal scheduler on the same machines' turns
//!   (each machine's turn as the fleet recorded it, from the call that began it to its
//!   Node Ready on the target; `ichor_sim::peers::makespan_against_ideal`).
//!
//! Not a test: it asserts nothing (the test does), and `cargo test` does not run it. Exit
//! 0 when every figure meets its goal, 1 when one misses, 2 on bad arguments.
#![allow(dead_code, unused_imports, reason = "the test modules it shares hold tests it does not build")]

#[path = "tests/operator_e2e.rs"]
mod operator_e2e;
#[path = "tests/operator_kwok.rs"]
mod operator_kwok;
#[path = "tests/support/mod.rs"]
mod support;

use clap::Parser;
use ichor_sim::peers::makespan_against_ideal;

/// The goals of issue 57.
const REQUESTS_PER_MACHINE: f64 = 12.0;
const WRITES_PER_MACHINE: f64 = 8.0;
const PEAK_RSS_MIB: f64 = 64.0;
const MAKESPAN_OVER_IDEAL: f64 = 1.05;

/// The command line.
#[derive(Debug, Parser)]
#[command(about = "The operator's figures on a real API server with kwok Nodes")]
struct Args {
    /// Control planes.
    #[arg(long, default_value_t = 3)]
    control_planes: usize,
    /// Workers.
    #[arg(long, default_value_t = 1_000)]
    workers: usize,
    /// Workers upgraded at once.
    #[arg(long, default_value_t = 50)]
    max_unavailable: i64,
    /// Fleet seconds per wall-clock second (the operator's own intervals are sped up as
    /// much, as `--time-scale` does for the operator example).
    #[arg(long, default_value = "10")]
    time_scale: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if std::env::var_os("ICHOR_TEST_KUBECONFIG").is_none() {
        eprintln!("kwok-figures: ICHOR_TEST_KUBECONFIG is not set: run it through scripts/kwok-figures.sh");
        std::process::exit(2);
    }
    let Ok(k) = usize::try_from(args.max_unavailable) else {
        eprintln!("kwok-figures: --max-unavailable must be at least 1");
        std::process::exit(2);
    };
    let Some(scale) = args.time_scale.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 1.0) else {
        eprintln!("kwok-figures: --time-scale must be a number of at least 1, got {:?}", args.time_scale);
        std::process::exit(2);
    };
    // The operator's least time between passes, sped up as the fleet is (2 s at scale 1):
    // it meets the fleet's changes as it would a real cluster's.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "2,000 ms over at least 1")]
    let interval = format!("{}", (2_000.0 / scale).round() as u64);
    let run = operator_kwok::kwok_rollout(
        args.control_planes,
        args.workers,
        args.max_unavailable,
        &args.time_scale,
        &["--executor", "lifecycle", "--pass-interval-ms", &interval],
    )
    .await;
    let (requests, writes) = operator_kwok::requests_and_writes(&run.metrics);
    #[allow(clippy::cast_precision_loss, reason = "thousands of machines")]
    let per = |n: f64| n / run.machines as f64;
    #[allow(clippy::cast_precision_loss, reason = "KiB")]
    let peak_mib = run.peak_kib as f64 / 1024.0;
    let turns = operator_kwok::turns(&run.fleet_metrics);
    let measured = makespan_against_ideal(&turns, k.max(1));
    let mut met = true;
    let mut line = |figure: &str, value: String, goal: String, ok: bool| {
        met &= ok;
        println!("| {figure} | {value} | {goal} | {} |", if ok { "met" } else { "missed" });
    };
    println!(
        "kwok fleet {}+{}, maxUnavailable {}, time scale {}: {} pods on {} Nodes; fleet Ready in {:.1} s; rollout {:.1} s \
         of wall time; {} of {} machines' turns recorded",
        args.control_planes,
        args.workers,
        args.max_unavailable,
        args.time_scale,
        run.pods,
        run.spread,
        run.fleet_up.as_secs_f64(),
        run.rollout.as_secs_f64(),
        turns.iter().filter(|t| t.ended_s.is_some()).count(),
        run.machines,
    );
    println!();
    println!("| figure | measured | goal | |");
    println!("|---|---|---|---|");
    line(
        "API requests per machine",
        format!("{:.1} ({requests})", per(requests)),
        format!("≤ {REQUESTS_PER_MACHINE}"),
        per(requests) <= REQUESTS_PER_MACHINE,
    );
    line(
        "writes per machine",
        format!("{:.1} ({writes})", per(writes)),
        format!("≤ {WRITES_PER_MACHINE}"),
        per(writes) <= WRITES_PER_MACHINE,
    );
    line(
        "the operator's peak RSS",
        format!("{peak_mib:.1} MiB"),
        format!("≤ {PEAK_RSS_MIB} MiB"),
        peak_mib <= PEAK_RSS_MIB,
    );
    match measured {
        Some((makespan, ideal)) => line(
            "makespan in fleet time / the ideal scheduler's on the same turns",
            format!("{:.4} ({makespan:.0} s / {ideal:.0} s)", makespan / ideal),
            format!("≤ {MAKESPAN_OVER_IDEAL}"),
            makespan / ideal <= MAKESPAN_OVER_IDEAL,
        ),
        None => line("makespan / ideal", "a turn never ended".to_owned(), format!("≤ {MAKESPAN_OVER_IDEAL}"), false),
    }
    println!();
    println!("Where the requests went, the most first:");
    for series in operator_kwok::busiest(&run.metrics, 10) {
        println!("  {series}");
    }
    if !run.stayed.is_empty() {
        println!("{} pods were never evicted: {:?}", run.stayed.len(), run.stayed);
        met = false;
    }
    let operator_kwok::KwokRun { scene, mut fleet, .. } = run;
    fleet.terminate();
    scene.end().await;
    std::process::exit(i32::from(!met));
}
