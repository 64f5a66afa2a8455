//! The main job: a rolling Talos upgrade (or a node removal) of a simulated cluster
//! through the real rollout engine and drivers, with live progress in virtual time.
//!
//! ```text
//! cargo run --example rollout -- [--control-planes N] [--workers N] [--max-unavailable N]
//!     [--seed N] [--from V] [--to V] [--kubernetes V] [--faults LIST]
//!     [--operation upgrade|remove|kubernetes] [--node NAME] [--allow-two-control-planes]
//!     [--to-kubernetes V] [--trace FILE] [--json]
//!     [--etcd-snapshot-dir DIR] [--executor legacy|lifecycle|auto] [--prepull on|off]
//!     [--timeline FILE.svg] [--progress on|off] [--pass-interval-ms MS]
//!     [--plan [--history FILE]] [--window SCHEDULE;DURATION[;ZONE]]... [--blackout START;END]...
//! ```
//! With no arguments: 3 control planes and 5 workers (Kubernetes 1.34.1, storage on the
//! workers) from v1.14.3 to v1.14.4. Exit 0: completed. Exit 4: paused or failed because
//! of a fault. Exit 1: paused or failed for another reason. Exit 2: bad arguments, named.
//! Exit 3: refused at planning (a version two minors behind, a Kubernetes version the
//! target does not run, two control planes, the removal of a control plane that would
//! leave two without `--allow-two-control-planes`), nothing touched. Every failure, pause, wait
//! and refusal is printed with its reason, in the output, the trace and the JSON summary.
//!
//! `--operation kubernetes --to-kubernetes 1.35.0` upgrades the cluster's Kubernetes
//! instead (Talos stays on `--from`): each control plane's kube-apiserver,
//! kube-controller-manager and kube-scheduler, one control plane at a time, then each
//! node's kubelet (a control plane's kube-proxy image first), workers `--max-unavailable`
//! at once, each change a machine configuration applied with no reboot. The trace records
//! `config-apply` with the node and component before each change. Faults of its own:
//! `component-crashloop` (exit 4, no other control plane touched after it),
//! `kubelet-not-back` (exit 4), `removed-api-in-use` (exit 3, refused at planning).
//!
//! `--plan` runs nothing: it prints the upgrade's predicted makespan (p10, p50, p90 over
//! 200 runs drawn from an earlier run's trace, `--history FILE`, else from the simulator's
//! default durations, said so), the physical bound, the order and the machines the
//! preflight holds now, with why (`--json`: `{"plan": {"p10_s", "p50_s", "p90_s",
//! "bound_s", "held": [{"node", "reason"}], ...}}`). Exit 0; 2 for a history that does
//! not read, or that records a Kubernetes upgrade (its turns predict nothing of a Talos
//! upgrade's). The model and its limits: `docs/plan.md`. With maintenance windows
//! (`--window 'SCHEDULE;DURATION[;TIME-ZONE]'`, repeated, and `--blackout 'START;END'`) a
//! run starts machines only inside them, each only when its p90 turn ends before its
//! window does, and `--plan` says how many windows the median run needs (`"windows":
//! {"needed", "finish"}`, `null` when it does not fit).
//!
//! An upgrade streams an etcd snapshot from a simulated control plane before the first
//! control plane's Upgrade call, into `--etcd-snapshot-dir` (default: a new directory
//! under the system's temporary directory, removed when the run ends), and prints where it
//! is, its size and SHA-256. With the `snapshot-fails` fault it pauses before any Upgrade call (exit 4).

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use ichor_adapters::snapshot_store::DirectoryStore;
use ichor_examples::{EXIT_BAD_ARGUMENT, EXIT_OK, EXIT_REFUSED, ExecutorArg, Switch, executor_config, parse_args};
use ichor_sim::{
    Fault, Realism, Report, RunEnd, SimCluster, SimConfig, TraceEvent, TraceKind, run_operation, run_removal,
};
use ichor_timeline::History;
use ichor_upgrade_core::etcd::snapshot::SnapshotRecord;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::plan::{
    DEFAULT_RUNS, Models, PlanInput, PlanMachine, Recorded, StorageRate, describe_storage, models, plan,
};
use ichor_upgrade_core::preflight::{Preflight, PreflightConfig, describe};
use ichor_upgrade_core::rollout::removal_refusal;
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};
use ichor_upgrade_core::window::{BlackoutSpec, MaintenanceSpec, TurnP90, WindowSpec};

/// Exit code: paused or failed because of a fault.
const EXIT_FAULT: i32 = 4;
/// Exit code: paused or failed for another reason.
const EXIT_NOT_COMPLETED: i32 = 1;
/// The most passes of the controller before the run counts as a livelock.
const MAX_PASSES: usize = 200_000;

/// What to run on the simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Operation {
    /// Upgrade every machine to `--to`.
    Upgrade,
    /// Remove the machine `--node`.
    Remove,
    /// Upgrade every machine's Kubernetes to `--to-kubernetes`.
    Kubernetes,
}

/// Roll a simulated Talos cluster to a new version (or remove a node) with the real engine.
#[derive(Debug, Parser)]
#[command(name = "rollout")]
struct Args {
    /// Control planes (cp-1, cp-2, ...).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    control_planes: u16,
    /// Workers (worker-1, ...).
    #[arg(long, default_value_t = 5)]
    workers: u16,
    /// How many workers may be unavailable at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    max_unavailable: u32,
    /// The simulation's seed: the same seed replays the same run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The version every node runs at the start.
    #[arg(long, default_value = "v1.14.3", value_parser = TalosVersion::parse)]
    from: TalosVersion,
    /// The release set's version, the target.
    #[arg(long, default_value = "v1.14.4", value_parser = TalosVersion::parse)]
    to: TalosVersion,
    /// The cluster's Kubernetes version.
    #[arg(long, default_value = "1.34.1", value_parser = KubernetesVersion::parse)]
    kubernetes: KubernetesVersion,
    /// Faults, comma-separated: ab-fallback, controller-crash, api-outage, evacuation-stuck,
    /// slow-reboot, pdb-blocked, etcd-lag, not-ready, call-lost, control-plane-not-ready,
    /// snapshot-fails, pdb-zero, single-replica, hold-during-install, pause-during-install,
    /// delete-during-install; for --operation kubernetes: component-crashloop,
    /// removed-api-in-use, kubelet-not-back.
    #[arg(long, value_delimiter = ',', value_parser = parse_fault)]
    faults: Vec<Fault>,
    /// Upgrade the cluster, or remove one node.
    #[arg(long, value_enum, default_value_t = Operation::Upgrade)]
    operation: Operation,
    /// The node to remove (with --operation remove).
    #[arg(long)]
    node: Option<String>,
    /// With --operation remove: go on with the removal of a control plane that leaves two
    /// (refused otherwise: a two-member etcd tolerates no failure).
    #[arg(long)]
    allow_two_control_planes: bool,
    /// The Kubernetes version to upgrade to (with --operation kubernetes).
    #[arg(long, value_name = "V", value_parser = KubernetesVersion::parse)]
    to_kubernetes: Option<KubernetesVersion>,
    /// Write the world's events as JSON lines to this file.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Draw the rollout as an SVG timeline into this file (as the `timeline` example draws
    /// a trace), with the physical bound as a line.
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<PathBuf>,
    /// Print a final JSON object instead of the summary (progress goes to standard error).
    #[arg(long)]
    json: bool,
    /// How the controller learns of changes: `watch` (as a real controller: watch events
    /// after a delay, API calls taking time, the Node reporting late) or `oracle` (woken at
    /// every change, instantly; the old model, only for comparison).
    #[arg(long, value_enum, default_value_t = WakeArg::Watch)]
    wake: WakeArg,
    /// Also schedule the same drawn durations with other tools' policies (ideal, mco-like,
    /// topf-like, tuppr-like, runbook), run the engine again on the same world with
    /// pre-pulls the other way (`engine-no-prepull` or `engine-prepull`), and print each
    /// one's makespan against the physical bound; `--json` gains `compare: {policy: ratio}`.
    #[arg(long)]
    compare: bool,
    /// Where the etcd snapshot goes, kept (default: a new directory under the temporary
    /// one, removed when the run ends).
    #[arg(long, value_name = "DIR")]
    etcd_snapshot_dir: Option<PathBuf>,
    /// Which Talos executor upgrades the machines: `legacy` (MachineService.Upgrade: Talos
    /// pulls, drains, installs and reboots), `lifecycle` (ImageService.Pull,
    /// LifecycleService.Upgrade, the engine's own cordon and drain, Reboot; Talos 1.13 and
    /// later) or `auto` (lifecycle from Talos 1.18, where the legacy call is gone).
    #[arg(long, value_enum, default_value_t = ExecutorArg::Auto)]
    executor: ExecutorArg,
    /// Pull the installer image onto the machines expected to start next while the current
    /// ones upgrade (`on`, the default), or only in each machine's own turn (`off`).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    prepull: Switch,
    /// The live view as bars (a bar per wave and a count of machines per phase, redrawn in
    /// place), or as one line per change (`off`). Default: bars on a terminal. Failures,
    /// pauses and waits are printed as lines either way.
    #[arg(long, value_enum)]
    progress: Option<Switch>,
    /// The least time between the starts of two passes woken from outside, in milliseconds
    /// (default: the engine's, 2,000); what arrives meanwhile folds into the next pass. 0
    /// passes at every wake.
    #[arg(long, value_name = "MS")]
    pass_interval_ms: Option<u64>,
    /// The installer image's compressed size in MB (default: the simulator's 100, a metal
    /// installer from the Image Factory; system extensions such as GPU drivers make it
    /// several times larger). Pulls share the registry's bandwidth: a larger image makes
    /// the pull a larger part of each machine's time, and pre-pulling worth more.
    #[arg(long, value_name = "MB", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    installer_mb: Option<u64>,
    /// Print a plan of the upgrade instead of running it, touching nothing: its makespan's
    /// p10, p50 and p90 over 200 runs drawn from the durations of `--history` (else the
    /// simulator's default durations, said so), the physical bound, the order, and the
    /// machines the preflight holds now, with why.
    #[arg(long)]
    plan: bool,
    /// With `--plan`: the trace of an earlier run (`--trace FILE`) whose machines' turns,
    /// lead and reaction times the plan draws from.
    #[arg(long, value_name = "FILE", requires = "plan")]
    history: Option<PathBuf>,
    /// A maintenance window, `SCHEDULE;DURATION[;TIME-ZONE]` (five cron fields, such as
    /// `0 2 * * SAT,SUN;4h;Europe/Berlin`), repeated for a union: a machine starts only
    /// inside one, and only when its p90 turn ends before the window does. The simulated
    /// clock starts at 2026-01-01T00:00:00Z. `--plan` says how many windows the rollout
    /// needs.
    #[arg(long = "window", value_name = "WINDOW")]
    windows: Vec<String>,
    /// A blackout, `START;END` (RFC 3339 instants with offsets): nothing starts in it, and
    /// no turn runs into it.
    #[arg(long = "blackout", value_name = "BLACKOUT")]
    blackouts: Vec<String>,
}

/// The maintenance windows of `--window` and `--blackout`, read as the operator reads
/// `spec.maintenance`; a bad one exits 2, naming it.
fn maintenance(args: &Args, start: ichor_upgrade_core::Timestamp) -> Option<MaintenanceSpec> {
    if args.windows.is_empty() && args.blackouts.is_empty() {
        return None;
    }
    let windows = args
        .windows
        .iter()
        .map(|text| {
            let parts: Vec<&str> = text.split(';').map(str::trim).collect();
            match parts.as_slice() {
                [schedule, duration] | [schedule, duration, ""] => {
                    WindowSpec { schedule: (*schedule).to_owned(), duration: (*duration).to_owned(), time_zone: None }
                }
                [schedule, duration, zone] => WindowSpec {
                    schedule: (*schedule).to_owned(),
                    duration: (*duration).to_owned(),
                    time_zone: Some((*zone).to_owned()),
                },
                _ => bad_argument(&format!(
                    "--window {text:?}: a window is SCHEDULE;DURATION[;TIME-ZONE], such as \"0 2 * * SAT;4h;Europe/Berlin\""
                )),
            }
        })
        .collect();
    let blackouts = args
        .blackouts
        .iter()
        .map(|text| match text.split(';').map(str::trim).collect::<Vec<_>>().as_slice() {
            [start, end] => BlackoutSpec { start: (*start).to_owned(), end: (*end).to_owned(), reason: None },
            _ => bad_argument(&format!(
                "--blackout {text:?}: a blackout is START;END, such as \"2026-01-01T00:00:00Z;2026-01-02T00:00:00Z\""
            )),
        })
        .collect();
    let spec = MaintenanceSpec { windows, blackouts };
    if let Err(problem) = ichor_executor::calendar::calendar(&spec, start) {
        bad_argument(&format!("--window/--blackout: {problem}"));
    }
    Some(spec)
}

/// The wake models on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WakeArg {
    /// Watch events and requeues, with latency.
    Watch,
    /// Every change, at once.
    Oracle,
}

fn parse_fault(text: &str) -> Result<Fault, String> {
    Fault::from_name(text).ok_or_else(|| {
        let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
        format!("unknown fault {text:?}; known: {}", known.join(", "))
    })
}

fn bad_argument(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(EXIT_BAD_ARGUMENT)
}

fn main() {
    let args: Args = parse_args();
    let control_planes = usize::from(args.control_planes);
    let workers = usize::from(args.workers);
    match (args.operation, &args.node) {
        (Operation::Remove, None) => bad_argument("--operation remove needs --node NAME"),
        (Operation::Upgrade, Some(_)) => bad_argument("--node is only for --operation remove"),
        (Operation::Remove, Some(node)) => {
            let exists = node
                .strip_prefix("cp-")
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| (1..=control_planes).contains(&n))
                || node
                    .strip_prefix("worker-")
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| (1..=workers).contains(&n));
            if !exists {
                bad_argument(&format!(
                    "--node: no node {node:?} in a cluster of {control_planes} control planes and {workers} workers"
                ));
            }
            if node.starts_with("cp-") && control_planes == 1 {
                bad_argument("--node: the only control plane cannot be removed");
            }
            // Refused at planning, nothing touched, as the operator refuses it.
            let role = if node.starts_with("cp-") { MachineRole::ControlPlane } else { MachineRole::Worker };
            let others = if role == MachineRole::ControlPlane { control_planes - 1 } else { control_planes };
            if let Some(refusal) = removal_refusal(args.allow_two_control_planes, node, role, others) {
                refuse(&args, refusal.reason(), &refusal.to_string());
            }
        }
        (Operation::Upgrade | Operation::Kubernetes, None) => {}
        (Operation::Kubernetes, Some(_)) => bad_argument("--node is only for --operation remove"),
    }
    if args.allow_two_control_planes && args.operation != Operation::Remove {
        bad_argument("--allow-two-control-planes is only for --operation remove");
    }
    match (args.operation, &args.to_kubernetes) {
        (Operation::Kubernetes, None) => bad_argument("--operation kubernetes needs --to-kubernetes VERSION"),
        (Operation::Upgrade | Operation::Remove, Some(_)) => {
            bad_argument("--to-kubernetes is only for --operation kubernetes")
        }
        _ => {}
    }
    if args.plan {
        if args.operation != Operation::Upgrade {
            bad_argument("--plan plans a Talos upgrade: it cannot be used with --operation remove or kubernetes");
        }
        if args.trace.is_some() || args.timeline.is_some() || args.compare || args.etcd_snapshot_dir.is_some() {
            bad_argument(
                "--plan runs nothing: --trace, --timeline, --compare and --etcd-snapshot-dir have nothing to write",
            );
        }
    }
    let trace_file = args.trace.as_ref().map(|path| match File::create(path) {
        Ok(file) => file,
        Err(e) => bad_argument(&format!("--trace {}: {e}", path.display())),
    });
    let timeline_file = args.timeline.as_ref().map(|path| match File::create(path) {
        Ok(file) => file,
        Err(e) => bad_argument(&format!("--timeline {}: {e}", path.display())),
    });
    let mut config = SimConfig::new(control_planes, workers, args.from.clone(), args.to.clone())
        .with_seed(args.seed)
        .with_kubernetes(args.kubernetes.to_string())
        .with_faults(args.faults.clone())
        .with_realism(match args.wake {
            WakeArg::Watch => Realism::cluster(),
            WakeArg::Oracle => Realism::oracle(),
        });
    if let Some(mb) = args.installer_mb {
        config.registry.image_bytes = mb * 1_000_000;
    }
    if let Some(spec) = maintenance(&args, SIMULATED_START) {
        config = config.with_maintenance(spec);
    }
    let sim = SimCluster::new(config.clone());
    if args.plan {
        print_plan(&args, &config, &sim);
        std::process::exit(EXIT_OK);
    }
    // Given no --etcd-snapshot-dir, the simulated cluster's snapshot goes to a directory of
    // the run's own, removed when it ends (each run left one behind).
    let scratch = args.etcd_snapshot_dir.is_none().then(|| {
        tempfile::Builder::new().prefix("ichor-rollout-").tempdir().unwrap_or_else(|e| {
            eprintln!("error: a temporary directory for the etcd snapshot: {e} (or give --etcd-snapshot-dir DIR)");
            std::process::exit(EXIT_NOT_COMPLETED)
        })
    });
    let snapshot_dir = match (&args.etcd_snapshot_dir, &scratch) {
        (Some(dir), _) => dir.clone(),
        (None, Some(scratch)) => scratch.path().to_path_buf(),
        (None, None) => unreachable!("a scratch directory is made when none is given"),
    };
    sim.set_snapshot_store(std::sync::Arc::new(DirectoryStore::new(snapshot_dir)));
    let started = std::time::Instant::now();
    let runtime = ichor_sim::runtime();
    let mut progress = Progress::new(args.json, control_planes + workers, args.to.to_string());
    progress.kubernetes.clone_from(&args.to_kubernetes);
    if let Some(target) = &args.to_kubernetes {
        progress.target = format!("Kubernetes {target}");
    }
    progress.bars(args.progress, control_planes, args.max_unavailable as usize);
    let mut executor = executor_config(args.executor, args.prepull);
    if let Some(ms) = args.pass_interval_ms {
        executor = executor.with_pass_interval(std::time::Duration::from_millis(ms));
    }
    // A start is admitted into a window on the p90 of the simulator's own turns.
    executor.turn_p90 = models(None, &config.plan_defaults(executor.pass_interval)).p90();
    let end = match (args.operation, &args.node) {
        (Operation::Remove, Some(node)) => {
            progress.header(&format!("removing {node} from {control_planes} control planes + {workers} workers"));
            let end = runtime.block_on(run_removal(&sim, node, &executor, MAX_PASSES));
            progress.show(&sim);
            end
        }
        (Operation::Kubernetes, _) => {
            let target = args.to_kubernetes.clone().unwrap_or_else(|| args.kubernetes.clone());
            progress.header(&format!(
                "upgrading Kubernetes of {control_planes} control planes + {workers} workers from {} to {target} (maxUnavailable {}, seed {})",
                args.kubernetes, args.max_unavailable, args.seed
            ));
            let spec =
                OperationSpec { kind: "kubernetes".into(), target_version: target.to_string(), ..upgrade_spec(&args) };
            sim.create_operation("kubernetes", spec);
            runtime.block_on(run_operation(&sim, "kubernetes", &executor, MAX_PASSES, |sim| progress.show(sim)))
        }
        _ => {
            progress.header(&format!(
                "upgrading {control_planes} control planes + {workers} workers from {} to {} (maxUnavailable {}, seed {})",
                args.from, args.to, args.max_unavailable, args.seed
            ));
            let spec = upgrade_spec(&args);
            sim.create_operation("upgrade", spec.clone());
            runtime.block_on(run_operation(&sim, "upgrade", &executor, MAX_PASSES, |sim| progress.show(sim)))
        }
    };
    progress.finish();
    // The same world (seed, durations) with pre-pulls the other way, for --compare.
    let other_prepull = (args.compare && args.operation == Operation::Upgrade).then(|| {
        let other = SimCluster::new(config.clone());
        other.create_operation("upgrade", upgrade_spec(&args));
        let toggled = executor.clone().with_prepull(!executor.prepull.enabled);
        let end = runtime.block_on(run_operation(&other, "upgrade", &toggled, MAX_PASSES, |_| {}));
        (toggled.prepull.enabled, end, other.report(args.max_unavailable as usize))
    });
    if let Some(file) = trace_file
        && let Err(e) = write_trace(file, &sim)
    {
        eprintln!("error: writing the trace: {e}");
        exit_removing(scratch, EXIT_NOT_COMPLETED);
    }
    let report = sim.report(args.max_unavailable as usize);
    if let Some(file) = timeline_file
        && let Err(e) = write_timeline(file, &sim, &report, &args, end == RunEnd::Completed)
    {
        eprintln!("error: writing the timeline: {e}");
        exit_removing(scratch, EXIT_NOT_COMPLETED);
    }
    let wall_s = started.elapsed().as_secs_f64();
    let compare = args.compare.then(|| {
        let peers = sim.with_world(|w| ichor_sim::peers::peers(w, args.max_unavailable as usize));
        let ratio = |makespan: f64| if report.lower_bound_s > 0.0 { makespan / report.lower_bound_s } else { 0.0 };
        let mut rows = vec![("engine", report.makespan_s, ratio(report.makespan_s))];
        if let Some((prepull, end, other)) = &other_prepull
            && *end == RunEnd::Completed
        {
            let policy = if *prepull { "engine-prepull" } else { "engine-no-prepull" };
            rows.push((policy, other.makespan_s, ratio(other.makespan_s)));
        }
        rows.extend(peers.iter().map(|p| (p.policy, p.makespan_s, ratio(p.makespan_s))));
        rows
    });
    let outcome = match end {
        RunEnd::Completed => "completed",
        RunEnd::Paused => "paused",
        RunEnd::Refused => "refused",
        RunEnd::Deleted => "deleted",
        RunEnd::Stalled(_) | RunEnd::PassBound => "failed",
    };
    let mut why = Why::of(&sim, &end);
    why.snapshot_removed = scratch.is_some();
    let removal = args
        .node
        .as_deref()
        .filter(|_| args.operation == Operation::Remove)
        .map(|node| Removal::of(&sim, node, report.makespan_s));
    // Ratios and bounds are an upgrade's that completed: a pause, a refusal or a removal
    // has none (issue 34).
    let measured = end == RunEnd::Completed && removal.is_none();
    if let Some(target) = &args.to_kubernetes {
        let summary = KubernetesSummary::of(&sim, target, &report);
        if args.json {
            println!("{}", summary.json(outcome, &why, wall_s));
        } else {
            summary.print(outcome, &end, &why, wall_s);
        }
        exit_removing(scratch, exit_code(&end, &why, &sim, &args));
    }
    if args.json {
        let mut summary = json_summary(outcome, &report, &why, wall_s, args.wake, measured);
        if let Some(removal) = &removal {
            summary["removal"] = removal.json();
        }
        if let Some(rows) = compare.as_ref().filter(|_| measured) {
            let ratios: serde_json::Map<String, serde_json::Value> =
                rows.iter().map(|(policy, _, ratio)| ((*policy).to_owned(), serde_json::json!(ratio))).collect();
            summary["compare"] = serde_json::Value::Object(ratios);
        }
        println!("{summary}");
    } else {
        print_summary(outcome, &end, &report, &sim, &why, wall_s, removal.as_ref());
        if let Some(rows) = compare.as_ref().filter(|_| measured) {
            println!();
            println!("{:<18} {:>10} {:>16}", "policy", "makespan", "makespan / bound");
            for (policy, makespan, ratio) in rows {
                println!("{policy:<18} {:>10} {ratio:>16.3}", clock(*makespan));
            }
        }
    }
    exit_removing(scratch, exit_code(&end, &why, &sim, &args));
}

/// Removes the run's own snapshot directory, if it made one, and exits with `code` (an
/// exit runs no destructor).
fn exit_removing(scratch: Option<tempfile::TempDir>, code: i32) -> ! {
    if let Some(scratch) = scratch
        && let Err(e) = scratch.close()
    {
        eprintln!("warning: removing the run's etcd snapshot directory: {e}");
    }
    std::process::exit(code)
}

/// The exit code of a run that ended so, by its cause, not by the flags: a pause an
/// injected fault caused is 4, one the environment caused is 1 (an etcd snapshot that
/// failed with no stream broken by `snapshot-fails`: the snapshot directory could not be
/// written), and a deletion is 4 only when `delete-during-install` made it.
fn exit_code(end: &RunEnd, why: &Why, sim: &SimCluster, args: &Args) -> i32 {
    let by_fault = match end {
        RunEnd::Completed => return EXIT_OK,
        RunEnd::Refused => return EXIT_REFUSED,
        RunEnd::Deleted => args.faults.contains(&Fault::DeleteDuringInstall),
        RunEnd::Paused if why.reason == "EtcdSnapshotFailed" => {
            sim.with_world(|w| w.counters.snapshot_streams_broken) > 0
        }
        _ => !args.faults.is_empty(),
    };
    if by_fault { EXIT_FAULT } else { EXIT_NOT_COMPLETED }
}

/// What a Kubernetes upgrade comes to: where every component stands, and what was applied.
struct KubernetesSummary {
    target: KubernetesVersion,
    nodes: usize,
    /// Kubelets on the target.
    kubelets_on_target: usize,
    /// Control planes whose three static pods run the target, Ready.
    control_planes_on_target: usize,
    control_planes: usize,
    /// Every apply, by component.
    applies: std::collections::BTreeMap<&'static str, usize>,
    /// The same change applied twice to one node (must be 0).
    repeated_applies: usize,
    makespan_s: f64,
    max_control_planes_down: usize,
    /// The bootstrap manifests' server-side applies, and the version kube-proxy's
    /// DaemonSet runs after them.
    manifest_applies: usize,
    kube_proxy: KubernetesVersion,
    restarts: u64,
    talos_calls: u64,
    passes: u64,
}

impl KubernetesSummary {
    fn of(sim: &SimCluster, target: &KubernetesVersion, report: &Report) -> Self {
        use ichor_upgrade_core::machine::vocabulary::MachineRole;
        sim.read_world(|w| {
            let mut applies = std::collections::BTreeMap::new();
            let mut repeated_applies = 0;
            for n in &w.nodes {
                for (k, c) in n.kube.applies.iter().enumerate() {
                    *applies.entry(c.as_str()).or_insert(0) += 1;
                    repeated_applies += usize::from(n.kube.applies[..k].contains(c));
                }
            }
            let control_planes: Vec<_> = w.nodes.iter().filter(|n| n.role == MachineRole::ControlPlane).collect();
            // When a component restarts, from the trace: how many control planes had one
            // restarting (applied, not yet back) at once.
            let mut down: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
            let mut max_control_planes_down = 0;
            for e in &w.trace {
                let component = e.component.unwrap_or_default();
                let static_pod = component.starts_with("kube-") && component != "kube-proxy";
                if e.role != "control-plane" || !static_pod {
                    continue;
                }
                match e.event {
                    TraceKind::ConfigApply => {
                        down.insert(e.node.as_str());
                    }
                    TraceKind::ComponentReady => {
                        down.remove(e.node.as_str());
                    }
                    _ => {}
                }
                max_control_planes_down = max_control_planes_down.max(down.len());
            }
            Self {
                target: target.clone(),
                nodes: w.nodes.len(),
                kubelets_on_target: w.nodes.iter().filter(|n| &n.kube.kubelet == target).count(),
                control_planes_on_target: control_planes
                    .iter()
                    .filter(|n| n.kube.pods.values().all(|p| &p.version == target && p.ready))
                    .count(),
                control_planes: control_planes.len(),
                applies,
                repeated_applies,
                makespan_s: w
                    .trace
                    .iter()
                    .filter(|e| e.event == TraceKind::ConfigApply || e.event == TraceKind::ComponentReady)
                    .map(|e| e.t)
                    .fold(0.0, f64::max),
                max_control_planes_down,
                manifest_applies: w.bootstrap.applies,
                kube_proxy: w.kube_proxy_version(),
                restarts: w.counters.restarts,
                talos_calls: report.talos_calls,
                passes: report.passes,
            }
        })
    }

    fn json(&self, outcome: &str, why: &Why, wall_s: f64) -> serde_json::Value {
        let failed: Vec<serde_json::Value> = why
            .failed
            .iter()
            .map(|(node, reason, message)| serde_json::json!({ "node": node, "reason": reason, "message": message }))
            .collect();
        serde_json::json!({
            "outcome": outcome,
            "operation": "kubernetes",
            "target": self.target.to_string(),
            "reason": why.reason,
            "message": why.message,
            "failed": failed,
            "nodes": self.nodes,
            "kubelets_on_target": self.kubelets_on_target,
            "control_planes_on_target": self.control_planes_on_target,
            "control_planes": self.control_planes,
            "applies": self.applies,
            "repeated_applies": self.repeated_applies,
            "max_control_planes_restarting": self.max_control_planes_down,
            "manifest_applies": self.manifest_applies,
            "kube_proxy": self.kube_proxy.to_string(),
            // A completed upgrade's; null otherwise (issue 34).
            "makespan_s": (outcome == "completed").then_some(self.makespan_s),
            "controller_restarts": self.restarts,
            "talos_calls": self.talos_calls,
            "passes": self.passes,
            "wall_s": wall_s,
        })
    }

    fn print(&self, outcome: &str, end: &RunEnd, why: &Why, wall_s: f64) {
        println!();
        println!(
            "outcome: {outcome}{}",
            if let RunEnd::Stalled(phase) = end { format!(" ({phase})") } else { String::new() }
        );
        if *end != RunEnd::Completed {
            println!("reason: {}: {}", why.reason, why.message);
        }
        for (node, reason, message) in &why.failed {
            println!("failed: {node}: {reason}: {message}");
        }
        println!(
            "control planes on Kubernetes {}: {}/{}; kubelets on it: {}/{}",
            self.target, self.control_planes_on_target, self.control_planes, self.kubelets_on_target, self.nodes
        );
        let applies: Vec<String> = self.applies.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!(
            "configuration applies (no reboot): {} ({}); the same change applied twice: {}",
            self.applies.values().sum::<usize>(),
            if applies.is_empty() { "none".to_owned() } else { applies.join(", ") },
            self.repeated_applies
        );
        println!("most control planes restarting a component at once: {}", self.max_control_planes_down);
        println!(
            "bootstrap manifests applied server-side (field manager talos): {} objects; kube-proxy's DaemonSet on {}",
            self.manifest_applies, self.kube_proxy
        );
        if *end == RunEnd::Completed {
            println!("makespan: {}; wall time {wall_s:.1} s", clock(self.makespan_s));
        }
        println!("Talos calls: {}, passes: {}, controller restarts: {}", self.talos_calls, self.passes, self.restarts);
    }
}

/// The upgrade the main job runs.
/// `--plan`: the plan of the upgrade from `--history` (else the simulator's default
/// durations), with the machines the preflight holds in `sim` now; touches nothing.
fn print_plan(args: &Args, config: &SimConfig, sim: &SimCluster) {
    let history = args.history.as_ref().map(|path| {
        let file = File::open(path).unwrap_or_else(|e| bad_argument(&format!("--history {}: {e}", path.display())));
        let records = ichor_timeline::read_trace(std::io::BufReader::new(file))
            .unwrap_or_else(|e| bad_argument(&format!("--history {}: {e}", path.display())));
        let history = History::from_timeline(&ichor_timeline::Timeline::from_records(&records));
        if history.turns.is_empty() {
            bad_argument(&format!(
                "--history {}: no machine converged in it, so it has no durations to learn from",
                path.display()
            ));
        }
        // A Kubernetes upgrade's turns are configuration applies, minutes shorter than a
        // Talos turn's install and reboot: never learnt from, nor mixed with Talos turns.
        let kubernetes = history.turns.iter().filter(|t| t.is_kubernetes()).count();
        if kubernetes > 0 {
            bad_argument(&format!(
                "--history {}: it records a Kubernetes upgrade ({kubernetes} of its {} turns are configuration \
                 applies, with no Talos install or reboot); --plan plans a Talos upgrade, so give it a Talos \
                 upgrade's trace",
                path.display(),
                history.turns.len()
            ));
        }
        history
    });
    let recorded = history.as_ref().map(|h| {
        let (control_plane_turns, worker_turns) = ichor_operator::dry_run::recorded_turns(h);
        Recorded {
            control_plane_turns,
            worker_turns,
            lead: h.lead,
            reaction: h.reaction,
            // The bytes each evacuation-start recorded, over its evacuation: the rate.
            storage: h.storage_rate().map(|bytes_per_s| StorageRate { bytes_per_s }),
        }
    });
    let pass = ichor_executor::ExecutorConfig::default().pass_interval;
    let Models { control_plane, worker, lead_s, reaction_s, storage, mut assumed } =
        models(recorded.as_ref(), &config.plan_defaults(pass));
    // The preflight's verdict on every machine now, from what the cluster shows.
    // Each node with the bytes on it now (the simulator's sizes).
    let nodes: Vec<(String, MachineRole, u64)> =
        sim.with_world(|w| w.nodes.iter().map(|n| (n.name.clone(), n.role, n.drawn.bytes_left(n.replicas))).collect());
    let names: Vec<&str> = nodes.iter().map(|(name, _, _)| name.as_str()).collect();
    let facts = sim.with_world(|w| w.preflight_facts(&names));
    let preflight = PreflightConfig::default();
    let gate = Preflight::new(&facts, &preflight);
    let mut machines: Vec<PlanMachine> = nodes
        .iter()
        .map(|(node, role, bytes)| {
            let blockers = gate.blockers(node);
            let held = (!blockers.is_empty()).then(|| describe(&blockers));
            PlanMachine { node: node.clone(), role: *role, held, bytes: Some(*bytes) }
        })
        .collect();
    assumed.extend(describe_storage(&machines, storage));
    // The engine's order: control planes first, then by name (the simulation sets no
    // order labels).
    machines.sort_by(|a, b| {
        (a.role != MachineRole::ControlPlane, &a.node).cmp(&(b.role != MachineRole::ControlPlane, &b.node))
    });
    let input = PlanInput {
        machines: &machines,
        control_plane,
        worker,
        lead_s,
        reaction_s,
        storage,
        max_unavailable: args.max_unavailable as usize,
        runs: DEFAULT_RUNS,
        seed: args.seed,
    };
    let plan = plan(&input);
    let source = args.history.as_ref().map(|p| p.display().to_string());
    // Through the maintenance windows: the median run, each start admitted on its role's p90.
    let windows = config.maintenance.as_ref().map(|spec| {
        let calendar = ichor_executor::calendar::calendar(spec, SIMULATED_START).expect("read before");
        let p90 = TurnP90 { control_plane: secs(input.control_plane.p90()), worker: secs(input.worker.p90()) };
        plan.through_windows(&calendar, SIMULATED_START.saturating_add(secs(input.lead_s)), p90, input.max_unavailable)
    });
    if args.json {
        let value = serde_json::json!({
            "plan": {
                "p10_s": plan.p10_s,
                "p50_s": plan.p50_s,
                "p90_s": plan.p90_s,
                "bound_s": plan.bound_s,
                "held": plan.held.iter().map(|h| serde_json::json!({"node": h.node, "reason": h.reason})).collect::<Vec<_>>(),
                "order": plan.order,
                "runs": plan.runs,
                "history": source,
                "assumed": assumed,
                "windows": windows.map(|fitted| fitted.map(|f| serde_json::json!({
                    "needed": f.windows, "finish": f.finish.rfc3339(),
                }))),
                "phases": plan.phases.iter().map(|f| serde_json::json!({
                    "role": f.role.as_str(), "phase": f.phase, "samples": f.samples,
                    "p10_s": f.p10_s, "p50_s": f.p50_s, "p90_s": f.p90_s, "recorded": f.recorded,
                })).collect::<Vec<_>>(),
            }
        });
        println!("{value}");
        return;
    }
    println!(
        "plan: upgrading {} control planes + {} workers from {} to {} (maxUnavailable {}), {} runs drawn from {}",
        args.control_planes,
        args.workers,
        args.from,
        args.to,
        args.max_unavailable,
        plan.runs,
        source.as_deref().map_or_else(
            || "the simulator's default durations (no --history)".to_owned(),
            |s| format!("the history {s}")
        )
    );
    println!(
        "makespan: p10 {}, p50 {}, p90 {}; physical bound {}",
        clock(plan.p10_s),
        clock(plan.p50_s),
        clock(plan.p90_s),
        clock(plan.bound_s)
    );
    println!("order: {}", plan.order.join(", "));
    match windows {
        None => {}
        Some(Some(fitted)) => println!(
            "windows: the median run needs {} maintenance window{}, its last turn ending at {} (the simulated clock starts at {})",
            fitted.windows,
            if fitted.windows == 1 { "" } else { "s" },
            fitted.finish.rfc3339(),
            SIMULATED_START.rfc3339()
        ),
        Some(None) => println!(
            "windows: the rollout does not fit: a turn's p90 is longer than every window of the next {} days",
            ichor_executor::calendar::HORIZON.as_secs() / 86_400
        ),
    }
    if plan.held.is_empty() {
        println!("held now: none");
    }
    for held in &plan.held {
        println!("held now: {}: {}", held.node, held.reason);
    }
    for fit in &plan.phases {
        let source = if fit.recorded { format!("{} recorded", fit.samples) } else { "default range".to_owned() };
        println!(
            "phase: {} {}: p10 {:.0} s, p50 {:.0} s, p90 {:.0} s ({source})",
            fit.role.as_str(),
            fit.phase,
            fit.p10_s,
            fit.p50_s,
            fit.p90_s
        );
    }
    for line in &assumed {
        println!("assumed: {line}");
    }
}

/// When the simulated clock starts: 2026-01-01T00:00:00Z.
const SIMULATED_START: ichor_upgrade_core::Timestamp = ichor_upgrade_core::Timestamp::from_unix_secs(1_767_225_600);

/// `seconds` as a duration (none for a negative or endless one).
fn secs(seconds: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(std::time::Duration::MAX)
}

/// Prints a refusal at planning (nothing was touched) and exits 3.
fn refuse(args: &Args, reason: &str, message: &str) -> ! {
    if args.json {
        println!("{}", serde_json::json!({ "outcome": "refused", "reason": reason, "message": message }));
    } else {
        println!("refused: {reason}: {message}");
    }
    std::process::exit(EXIT_REFUSED);
}

fn upgrade_spec(args: &Args) -> OperationSpec {
    OperationSpec {
        preflight: None,
        allow_two_control_planes: false,
        etcd_snapshot: None,
        kind: "talos".into(),
        target_version: args.to.to_string(),
        max_unavailable: i64::from(args.max_unavailable).into(),
        machine: None,
    }
}

fn write_trace(file: File, sim: &SimCluster) -> std::io::Result<()> {
    let mut out = BufWriter::new(file);
    let trace: Vec<TraceEvent> = sim.with_world(|w| w.trace.clone());
    for event in &trace {
        serde_json::to_writer(&mut out, event)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// A simulator's trace record as the timeline reads it.
fn trace_record(e: &TraceEvent) -> ichor_timeline::TraceRecord {
    ichor_timeline::TraceRecord {
        t: e.t,
        node: e.node.clone(),
        role: e.role.to_owned(),
        event: e.event.name().to_owned(),
        version: e.version.clone(),
        reason: e.reason.clone(),
        message: e.message.clone(),
        bytes: e.bytes,
    }
}

fn write_timeline(
    mut file: File,
    sim: &SimCluster,
    report: &Report,
    args: &Args,
    completed: bool,
) -> std::io::Result<()> {
    let records: Vec<ichor_timeline::TraceRecord> = sim.read_world(|w| w.trace.iter().map(trace_record).collect());
    let timeline = ichor_timeline::Timeline::from_records(&records);
    let (from, to) = match &args.to_kubernetes {
        Some(target) => (format!("Kubernetes {}", args.kubernetes), target.to_string()),
        None => (args.from.to_string(), args.to.to_string()),
    };
    let title = format!(
        "{} control planes + {} workers, {from} to {to}, maxUnavailable {}, seed {}{}",
        args.control_planes,
        args.workers,
        args.max_unavailable,
        args.seed,
        if args.faults.is_empty() {
            String::new()
        } else {
            format!(", faults {}", args.faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(","))
        }
    );
    let options = ichor_timeline::Options {
        title,
        // The physical bound is a Talos upgrade's (drains, installs, reboots), and drawn,
        // as the summary gives it, for one that completed (issue 34).
        bound_s: (completed
            && report.lower_bound_s > 0.0
            && args.to_kubernetes.is_none()
            && args.operation == Operation::Upgrade)
            .then_some(report.lower_bound_s),
        max_unavailable: Some(args.max_unavailable as usize),
        ..ichor_timeline::Options::default()
    };
    file.write_all(ichor_timeline::render(&timeline, &options).to_string().as_bytes())?;
    file.flush()
}

/// Why the run ended as it did: the operation's last reason, and each failed machine's.
struct Why {
    /// The CamelCase reason of the operation's phase, or of the removal's last outcome.
    reason: String,
    /// What it says, for people.
    message: String,
    /// Each failed machine: its node, reason and message.
    failed: Vec<(String, String, String)>,
    /// The etcd snapshot the operation recorded, if any.
    snapshot: Option<SnapshotRecord>,
    /// Whether the snapshot's directory is the run's own, removed when it ends.
    snapshot_removed: bool,
}

impl Why {
    fn of(sim: &SimCluster, end: &RunEnd) -> Self {
        sim.with_world(|w| {
            let failed: Vec<(String, String, String)> = w
                .trace
                .iter()
                .filter(|e| e.event == TraceKind::Failed)
                .map(|e| (e.node.clone(), e.reason.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
                .collect();
            let (reason, message) = match w.operations.values().next() {
                Some(op) => (op.info.status.phase.reason().to_owned(), op.info.status.phase.to_string()),
                None => match (end, failed.first()) {
                    (RunEnd::Completed, _) => ("Removed".to_owned(), "the node was removed".to_owned()),
                    (_, Some((_, reason, message))) => (reason.clone(), message.clone()),
                    (_, None) => ("Stalled".to_owned(), format!("{end:?}")),
                },
            };
            let snapshot = w
                .operations
                .values()
                .find_map(|op| op.info.status.etcd_snapshot.as_ref().and_then(|s| s.taken()).cloned());
            Self { reason, message, failed, snapshot, snapshot_removed: false }
        })
    }
}

/// What a removal did, read from the world after it.
struct Removal {
    node: String,
    /// Its Node object was deleted.
    node_deleted: bool,
    /// It was a control plane, and its etcd member is gone.
    etcd_member_gone: Option<bool>,
    /// Storage replicas moved off it.
    replicas_moved: u32,
    /// Their bytes (the simulator's sizes: each replica's move at
    /// `REPLICA_BYTES_PER_SECOND`).
    evacuated_bytes: u64,
    /// From the start to the end, virtual seconds.
    duration_s: f64,
}

impl Removal {
    fn of(sim: &SimCluster, node: &str, duration_s: f64) -> Self {
        sim.with_world(|w| {
            let n = w.nodes.iter().find(|n| n.name == node);
            let (replicas_moved, evacuated_bytes) = n.map_or((0, 0), |n| {
                let before =
                    if n.labels.contains_key(ichor_sim::world::STORAGE_LABEL) { w.config.replicas_per_node } else { 0 };
                let bytes = n.drawn.bytes_left(before).saturating_sub(n.drawn.bytes_left(n.replicas));
                (before.saturating_sub(n.replicas), bytes)
            });
            Self {
                node: node.to_owned(),
                node_deleted: n.is_some_and(|n| n.removed),
                etcd_member_gone: n.filter(|n| n.role == MachineRole::ControlPlane).map(|n| n.etcd.is_none()),
                replicas_moved,
                evacuated_bytes,
                duration_s,
            }
        })
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "node": self.node,
            "node_deleted": self.node_deleted,
            "etcd_member_gone": self.etcd_member_gone,
            "replicas_moved": self.replicas_moved,
            "evacuated_bytes": self.evacuated_bytes,
            "duration_s": self.duration_s,
        })
    }
}

fn json_summary(outcome: &str, r: &Report, why: &Why, wall_s: f64, wake: WakeArg, measured: bool) -> serde_json::Value {
    let failed: Vec<serde_json::Value> = why
        .failed
        .iter()
        .map(|(node, reason, message)| serde_json::json!({ "node": node, "reason": reason, "message": message }))
        .collect();
    serde_json::json!({
        "outcome": outcome,
        "reason": why.reason,
        "message": why.message,
        "failed": failed,
        "nodes": r.nodes,
        "on_target": r.on_target,
        "upgrade_calls": r.upgrade_calls,
        "install_calls": r.install_calls,
        "reboot_calls": r.reboot_calls,
        "evictions": r.evictions,
        "max_control_planes_down": r.max_control_planes_down,
        "max_workers_down": r.max_workers_down,
        // An upgrade's that completed; null otherwise (a pause, a refusal, a removal).
        "makespan_s": measured.then_some(r.makespan_s),
        "lower_bound_s": measured.then_some(r.lower_bound_s),
        "ideal_s": measured.then_some(r.ideal_s),
        // Virtual time from the start to the end, whatever the end.
        "elapsed_s": r.makespan_s,
        "wall_s": wall_s,
        "wake": match wake { WakeArg::Watch => "watch", WakeArg::Oracle => "oracle" },
        "kube_writes": r.kube_writes,
        "status_writes": r.status_writes,
        "condition_writes": r.condition_writes,
        "storage_writes": r.storage_writes,
        "events": r.events,
        "lease_writes": r.lease_writes,
        "kube_reads": r.kube_reads,
        "status_bytes_max": r.status_bytes_max,
        "talos_calls": r.talos_calls,
        "talos_calls_by_method": r.talos_calls_by_method,
        "passes": r.passes,
        "preflight_waits": r.preflight_waits_s,
        "etcd_snapshot": why.snapshot.as_ref().map(|s| serde_json::json!({
            "size": s.size,
            "sha256": s.sha256,
            "location": s.location,
            "node": s.node,
            "kept": !why.snapshot_removed,
        })),
    })
}

fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

fn print_summary(
    outcome: &str,
    end: &RunEnd,
    r: &Report,
    sim: &SimCluster,
    why: &Why,
    wall_s: f64,
    removal: Option<&Removal>,
) {
    let restarts = sim.with_world(|w| w.counters.restarts);
    println!();
    println!(
        "outcome: {outcome}{}",
        if let RunEnd::Stalled(phase) = end { format!(" ({phase})") } else { String::new() }
    );
    if *end != RunEnd::Completed {
        println!("reason: {}: {}", why.reason, why.message);
    }
    for (node, reason, message) in &why.failed {
        println!("failed: {node}: {reason}: {message}");
    }
    if let Some(s) = &why.snapshot {
        let kept = if why.snapshot_removed { " (removed with the run: --etcd-snapshot-dir DIR keeps it)" } else { "" };
        println!("etcd snapshot: {} ({} bytes, sha256 {}) from {}{kept}", s.location, s.size, s.sha256, s.node);
    }
    if let Some(removal) = removal {
        let yes = |b: bool| if b { "yes" } else { "no" };
        println!("node removed: {} (Node deleted: {})", removal.node, yes(removal.node_deleted));
        if let Some(gone) = removal.etcd_member_gone {
            println!("etcd member gone: {}", yes(gone));
        }
        #[allow(clippy::cast_precision_loss, reason = "bytes shown to a tenth of a GiB")]
        let gib = removal.evacuated_bytes as f64 / f64::from(1u32 << 30);
        println!("replicas moved off: {} ({gib:.1} GiB)", removal.replicas_moved);
        println!("duration: {}; wall time {wall_s:.1} s", clock(removal.duration_s));
        println!(
            "Kubernetes writes: {} (status {}, conditions {}, storage {}), Events {}, reads {}; Talos calls: {}",
            r.kube_writes, r.status_writes, r.condition_writes, r.storage_writes, r.events, r.kube_reads, r.talos_calls
        );
        return;
    }
    println!("nodes on target: {}/{}", r.on_target, r.nodes);
    println!("acknowledged Upgrade calls: {}", r.upgrade_calls);
    if r.install_calls + r.reboot_calls > 0 {
        println!(
            "lifecycle installs: {}, Reboot calls: {}, pods evicted: {}",
            r.install_calls, r.reboot_calls, r.evictions
        );
    }
    println!("most control planes down at once: {}", r.max_control_planes_down);
    println!("most workers down at once: {}", r.max_workers_down);
    if *end == RunEnd::Completed {
        println!(
            "makespan: {} (lower bound {}, ratio {:.3})",
            clock(r.makespan_s),
            clock(r.lower_bound_s),
            if r.lower_bound_s > 0.0 { r.makespan_s / r.lower_bound_s } else { 0.0 }
        );
        println!(
            "ideal scheduler: {} (ratio {:.3}); wall time {wall_s:.1} s",
            clock(r.ideal_s),
            if r.ideal_s > 0.0 { r.makespan_s / r.ideal_s } else { 0.0 }
        );
    } else {
        // Not completed: no makespan, so no bound or ratio to hold it against.
        println!("makespan: n/a ({outcome} at {}); ratios: n/a; wall time {wall_s:.1} s", clock(r.makespan_s));
    }
    println!(
        "Kubernetes writes: {} (status {}, conditions {}, storage {}), Events {}, Lease writes {}, reads {}",
        r.kube_writes, r.status_writes, r.condition_writes, r.storage_writes, r.events, r.lease_writes, r.kube_reads
    );
    println!("Talos calls: {}, passes: {}, controller restarts: {restarts}", r.talos_calls, r.passes);
    if r.preflight_waits_s > 0.0 {
        println!("held back by the preflight gate: {:.0} machine-seconds", r.preflight_waits_s);
    }
}

/// Live progress: one line per change of the world, and a progress bar; or, on a
/// terminal, bars redrawn in place (see [`Bars`]).
struct Progress {
    /// A Kubernetes upgrade's target: progress counts kubelets on it.
    kubernetes: Option<KubernetesVersion>,
    to_stderr: bool,
    tty: bool,
    shown: usize,
    nodes: usize,
    target: String,
    last_bar: Option<usize>,
    bars: Option<Bars>,
}

impl Progress {
    fn new(to_stderr: bool, nodes: usize, target: String) -> Self {
        let tty = if to_stderr { std::io::stderr().is_terminal() } else { std::io::stdout().is_terminal() };
        Self { kubernetes: None, to_stderr, tty, shown: 0, nodes, target, last_bar: None, bars: None }
    }

    /// Turns the bars on when asked, or by default on a terminal.
    fn bars(&mut self, asked: Option<Switch>, control_planes: usize, wave_size: usize) {
        if asked.map_or(self.tty, |s| s == Switch::On) {
            let target = if self.to_stderr {
                indicatif::ProgressDrawTarget::stderr()
            } else {
                indicatif::ProgressDrawTarget::stdout()
            };
            self.bars = Some(Bars::new(target, control_planes, self.nodes - control_planes, wave_size));
        }
    }

    /// Ends the bars, leaving their last state on the terminal.
    fn finish(&mut self) {
        if let Some(bars) = self.bars.take() {
            bars.finish();
        }
    }

    fn line(&self, text: &str) {
        if let Some(bars) = &self.bars {
            bars.multi.println(text).ok();
        } else if self.to_stderr {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    fn header(&self, text: &str) {
        self.line(text);
    }

    fn show(&mut self, sim: &SimCluster) {
        let (events, on_target, now) = sim.read_world(|w| {
            let new: Vec<TraceEvent> = w.trace[self.shown.min(w.trace.len())..].to_vec();
            // A node's version changes only with a traced event (its reboot's end).
            let on_target = match (self.last_bar, &self.kubernetes) {
                (Some(count), _) if new.is_empty() => count,
                (_, Some(target)) => w.nodes.iter().filter(|n| &n.kube.kubelet == target).count(),
                (_, None) => w.nodes.iter().filter(|n| n.version == w.config.to).count(),
            };
            (new, on_target, w.now.saturating_since(w.start).as_secs_f64())
        });
        self.shown += events.len();
        if let Some(bars) = &mut self.bars {
            for e in &events {
                bars.observe(e);
                // Routine changes are in the bars; what needs reading stays as lines.
                if e.reason.is_some() || e.event == TraceKind::ControllerRestart {
                    let detail = match (&e.reason, &e.message) {
                        (Some(reason), Some(message)) => format!(": {reason}: {message}"),
                        (Some(reason), None) => format!(": {reason}"),
                        _ => String::new(),
                    };
                    bars.multi.println(format!("[{}] {:<10} {}{detail}", clock(e.t), e.node, e.event.name())).ok();
                }
            }
            bars.redraw(now);
            return;
        }
        for e in events.iter().filter(|e| e.event != TraceKind::Listed) {
            let detail = match (e.event, &e.reason, &e.message) {
                (TraceKind::RebootEnd, _, _) => format!(" into {}", e.version.as_deref().unwrap_or("?")),
                (_, None, Some(message)) if e.component.is_some() => format!(" {message}"),
                (_, Some(reason), Some(message)) => format!(": {reason}: {message}"),
                (_, Some(reason), None) => format!(": {reason}"),
                _ => String::new(),
            };
            self.line(&format!("[{}] {:<10} {}{detail}", clock(e.t), e.node, e.event.name()));
        }
        if self.last_bar != Some(on_target) || (self.tty && !events.is_empty()) {
            self.last_bar = Some(on_target);
            let width = 30;
            let filled = on_target * width / self.nodes.max(1);
            self.line(&format!(
                "[{}] [{}{}] {on_target}/{} on {}",
                clock(now),
                "#".repeat(filled),
                "-".repeat(width - filled),
                self.nodes,
                self.target
            ));
        }
    }
}

/// The live view on a terminal: a bar for the control planes, one per wave of workers (the
/// machines in the order they started, `maxUnavailable` to a wave; the last few waves
/// shown), one for the whole cluster, and a line counting the machines in each phase.
struct Bars {
    multi: indicatif::MultiProgress,
    tracker: ichor_timeline::Tracker,
    control_planes: indicatif::ProgressBar,
    waves: Vec<indicatif::ProgressBar>,
    /// Each started worker's wave.
    wave_of: std::collections::HashMap<String, usize>,
    workers: usize,
    wave_size: usize,
    total: indicatif::ProgressBar,
    phases: indicatif::ProgressBar,
}

/// The most wave bars on the screen at once: the older finished ones make room.
const WAVE_BARS_SHOWN: usize = 6;

impl Bars {
    fn new(target: indicatif::ProgressDrawTarget, control_planes: usize, workers: usize, wave_size: usize) -> Self {
        let multi = indicatif::MultiProgress::with_draw_target(target);
        let style = indicatif::ProgressStyle::with_template("{prefix:>15} [{bar:30}] {pos:>5}/{len:<5} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("#>-");
        let bar = |len: usize, prefix: String| {
            indicatif::ProgressBar::new(len as u64).with_style(style.clone()).with_prefix(prefix)
        };
        let control_planes_bar = multi.add(bar(control_planes, "control planes".to_owned()));
        let total = multi.add(bar(control_planes + workers, "all machines".to_owned()));
        let phases = multi.add(
            indicatif::ProgressBar::new(0)
                .with_style(
                    indicatif::ProgressStyle::with_template("{prefix:>15} {msg}")
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                )
                .with_prefix("phases"),
        );
        Self {
            multi,
            tracker: ichor_timeline::Tracker::new(),
            control_planes: control_planes_bar,
            waves: Vec::new(),
            wave_of: std::collections::HashMap::new(),
            workers,
            wave_size: wave_size.max(1),
            total,
            phases,
        }
    }

    fn observe(&mut self, e: &TraceEvent) {
        let record = trace_record(e);
        let before = self.tracker.machine(&e.node).and_then(ichor_timeline::Machine::phase);
        self.tracker.observe(&record);
        let Some(machine) = self.tracker.machine(&e.node) else { return };
        let after = machine.phase();
        let (started, control_plane) = (machine.started.is_some(), machine.is_control_plane());
        if !control_plane && started && !self.wave_of.contains_key(&e.node) {
            let wave = self.wave_of.len() / self.wave_size;
            self.wave_of.insert(e.node.clone(), wave);
            if wave == self.waves.len() {
                let len = self.wave_size.min(self.workers - wave * self.wave_size);
                let bar = indicatif::ProgressBar::new(len as u64)
                    .with_style(self.control_planes.style())
                    .with_prefix(format!("wave {}", wave + 1));
                let bar = self.multi.insert_before(&self.total, bar);
                self.waves.push(bar);
                self.make_room();
            }
        }
        let done = |p: Option<ichor_timeline::Phase>| {
            p.is_some_and(|p| matches!(p, ichor_timeline::Phase::Converged | ichor_timeline::Phase::Removed))
        };
        if done(after) && !done(before) {
            self.total.inc(1);
            if control_plane {
                self.control_planes.inc(1);
            } else if let Some(bar) = self.wave_of.get(&e.node).and_then(|w| self.waves.get(*w)) {
                bar.inc(1);
                if bar.position() == bar.length().unwrap_or(0) {
                    bar.finish();
                }
            }
        }
    }

    /// Removes the oldest finished wave bars beyond [`WAVE_BARS_SHOWN`].
    fn make_room(&mut self) {
        let mut shown: Vec<&indicatif::ProgressBar> = self.waves.iter().filter(|b| !b.is_hidden()).collect();
        while shown.len() > WAVE_BARS_SHOWN {
            match shown.iter().position(|b| b.is_finished()) {
                Some(i) => {
                    self.multi.remove(shown[i]);
                    shown[i].set_draw_target(indicatif::ProgressDrawTarget::hidden());
                    shown.remove(i);
                }
                None => break,
            }
        }
    }

    fn redraw(&mut self, now: f64) {
        let (counts, idle) = self.tracker.counts();
        let mut text: Vec<String> = counts.iter().map(|(phase, n)| format!("{} {n}", phase.label())).collect();
        let unseen = self.total.length().unwrap_or(0) as usize - self.tracker.machines().len();
        if idle + unseen > 0 {
            text.push(format!("waiting their turn {}", idle + unseen));
        }
        self.phases.set_message(format!("[{}] {}", clock(now), text.join(" · ")));
    }

    fn finish(self) {
        for bar in self.waves.iter().chain([&self.control_planes, &self.total, &self.phases]) {
            bar.abandon();
        }
    }
}
