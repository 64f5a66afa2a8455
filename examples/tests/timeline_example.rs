//! The timeline as users draw it: `rollout --timeline FILE.svg`, and the `timeline`
//! example from a trace file, both as processes; and the live view's bars on a terminal.

use std::path::Path;
use std::process::{Command, Output};

use ichor_testkit::example_binary;

fn run(example: &str, args: &[&str]) -> Output {
    Command::new(example_binary(example)).args(args).output().expect("the example runs")
}

fn rows(svg: &str) -> Vec<(String, String)> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    doc.descendants()
        .filter(|n| n.attribute("class") == Some("row"))
        .map(|n| (n.attribute("data-node").unwrap().to_owned(), n.attribute("data-group").unwrap().to_owned()))
        .collect()
}

fn text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_main_job_draws_its_rollout_and_the_timeline_example_draws_the_same_from_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (svg, trace, redrawn) =
        (dir.path().join("run.svg"), dir.path().join("run.jsonl"), dir.path().join("again.svg"));
    let output = run(
        "rollout",
        &[
            "--control-planes",
            "3",
            "--workers",
            "12",
            "--max-unavailable",
            "3",
            "--faults",
            "ab-fallback,api-outage",
            "--seed",
            "3",
            "--timeline",
            svg.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(output.status.code().is_some_and(|c| c == 0 || c == 4), "{output:?}");
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).lines().last().unwrap()).unwrap();
    let drawn = text(&svg);
    let machines = rows(&drawn);
    assert_eq!(machines.len(), 15, "one row per machine");
    assert!(machines[..3].iter().all(|(node, group)| node.starts_with("cp-") && group == "control planes"));
    let doc = roxmltree::Document::parse(&drawn).unwrap();
    // The bound is drawn as the summary gives it: for an upgrade that completed only.
    let bound = doc.descendants().find(|n| n.attribute("class") == Some("bound"));
    match summary["lower_bound_s"].as_f64() {
        Some(expected) => {
            let at: f64 = bound.expect("the bound is drawn").attribute("data-t").unwrap().parse().unwrap();
            assert!((at - expected).abs() < 1e-6, "the bound is the summary's");
        }
        None => assert!(bound.is_none() && summary["outcome"] != "completed", "no bound: {summary}"),
    }
    if summary["outcome"] == "paused" {
        assert!(
            doc.descendants()
                .any(|n| n.attribute("class") == Some("marker") && n.attribute("data-kind") == Some("ab-fallback")),
            "the A/B fallback is marked"
        );
        assert!(
            doc.descendants()
                .any(|n| n.attribute("class") == Some("span") && n.attribute("data-kind") == Some("paused")),
            "the pause is shaded"
        );
    }

    let output = run("timeline", &[trace.to_str().unwrap(), "-o", redrawn.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("15 machines"), "{output:?}");
    assert_eq!(rows(&text(&redrawn)), machines, "the same rows from the trace file");
}

#[test]
fn drawn_as_density_bands_the_workers_in_turn_stay_within_the_runs_max_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, redrawn) = (dir.path().join("run.jsonl"), dir.path().join("bands.svg"));
    let output = run(
        "rollout",
        &[
            "--control-planes",
            "3",
            "--workers",
            "12",
            "--max-unavailable",
            "3",
            "--seed",
            "3",
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // As density bands (above 10 machines here), with the run's maxUnavailable as the
    // workers' limit: no more of them in turn at once than it.
    let output = run(
        "timeline",
        &[trace.to_str().unwrap(), "-o", redrawn.to_str().unwrap(), "--dense-above", "10", "--max-unavailable", "3"],
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let drawn = text(&redrawn);
    let doc = roxmltree::Document::parse(&drawn).unwrap();
    let workers = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("band") && n.attribute("data-role") == Some("worker"))
        .expect("the workers' band");
    let limit = workers.children().find(|n| n.attribute("class") == Some("limit")).expect("the limit's line");
    assert_eq!(limit.attribute("data-limit"), Some("3"));
    let in_turn: u32 = workers.attribute("data-most-active").unwrap().parse().unwrap();
    assert!((2..=3).contains(&in_turn), "up to maxUnavailable in turn at once, never more: {in_turn}");
}

#[test]
fn a_trace_that_cannot_be_read_is_exit_2_naming_the_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, svg) = (dir.path().join("bad.jsonl"), dir.path().join("out.svg"));
    std::fs::write(&trace, "{\"t\":1,\"node\":\"cp-1\",\"role\":\"control-plane\",\"event\":\"ready\"}\nnot json\n")
        .unwrap();
    let output = run("timeline", &[trace.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("line 2: not a trace record"), "{output:?}");
    assert!(!svg.exists(), "nothing written");

    let output = run("timeline", &[dir.path().join("missing.jsonl").to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let output = run("timeline", &[trace.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "-o is required: {output:?}");
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, "{\"t\":1,\"node\":\"cp-1\",\"role\":\"control-plane\",\"event\":\"ready\"}\n").unwrap();
    let output = run("timeline", &[good.to_str().unwrap(), "-o", svg.to_str().unwrap(), "--max-unavailable", "0"]);
    assert_eq!(output.status.code(), Some(2), "a limit of 0 is no limit: {output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--max-unavailable"), "{output:?}");
    assert!(!svg.exists(), "nothing written");
    let output = run("rollout", &["--timeline", "/nonexistent-dir/x.svg"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--timeline /nonexistent-dir/x.svg"), "{output:?}");
}

/// Runs `rollout ARGS` on a pseudo-terminal (util-linux `script`), as a user at a terminal.
fn on_a_terminal(args: &str) -> String {
    // util-linux is essential on Debian: a machine without it cannot run these tests.
    assert!(Path::new("/usr/bin/script").exists(), "/usr/bin/script (util-linux) is missing");
    let command = format!("{} {args}", example_binary("rollout").display());
    let output = Command::new("/usr/bin/script")
        .args(["-qec", &command, "/dev/null"])
        .env("COLUMNS", "120")
        .output()
        .expect("script runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn on_a_terminal_the_live_view_draws_a_bar_per_wave_and_counts_phases() {
    let screen = on_a_terminal("--control-planes 3 --workers 9 --max-unavailable 3");
    for needle in ["control planes [", "wave 1 [", "wave 3 [", "all machines [", "phases", "converged 12"] {
        assert!(screen.contains(needle), "{needle:?} on the terminal:\n{screen}");
    }
    assert!(screen.contains("outcome: completed"), "the summary follows the bars");
    assert!(!screen.contains("upgrade-call"), "routine changes are in the bars, not lines");

    let lines = on_a_terminal("--control-planes 3 --workers 9 --max-unavailable 3 --progress off");
    assert!(!lines.contains("wave 1 ["), "--progress off: no bars");
    assert!(lines.contains("upgrade-call") && lines.contains("outcome: completed"), "one line per change");
}
