//! The main job run as a user runs it: the built `rollout` binary, as a process. Its
//! command line and exit codes are a contract: 0 completed, 1 paused or failed otherwise,
//! 2 bad arguments, 3 refused at planning (nothing touched), 4 paused or failed because of
//! a fault; and every failure, pause, wait and refusal names its reason.

use std::process::{Command, Output};

use ichor_testkit::example_binary;
use serde_json::Value;

fn rollout(args: &[&str]) -> Output {
    Command::new(example_binary("rollout")).args(args).output().expect("the example runs")
}

fn summary(output: &Output) -> Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn trace(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn the_main_job_completes_with_no_arguments() {
    let output = rollout(&[]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("outcome: completed"));
}

#[test]
fn a_version_two_minors_behind_is_refused_at_planning_with_its_reason_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let trace_file = dir.path().join("trace.jsonl");
    let output = rollout(&["--from", "v1.12.0", "--to", "v1.14.4", "--trace", trace_file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("outcome: refused"), "{text}");
    assert!(text.contains("reason: UpgradePathRefused") && text.contains("v1.13"), "{text}");
    let refused: Vec<Value> = trace(&trace_file).into_iter().filter(|e| e["event"] == "refused").collect();
    assert_eq!(refused.len(), 1, "one refusal in the trace");
    assert_eq!(refused[0]["reason"], "UpgradePathRefused");

    let output = rollout(&["--from", "v1.12.0", "--to", "v1.14.4", "--json"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["outcome"], "refused");
    assert_eq!(json["reason"], "UpgradePathRefused");
    assert_eq!(json["upgrade_calls"], 0, "nothing touched");
    assert!(json["message"].as_str().unwrap().contains("cp-1"), "{json}");
}

// Issue 55 (papercuts): a release newer than any the engine knows was refused as a
// Kubernetes pairing problem and an 84-minor path, node by node.
#[test]
fn a_release_no_one_knows_is_refused_as_unknown_and_nothing_else() {
    let output = rollout(&["--to", "v1.99.0", "--json"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["reason"], "UnknownTalosRelease", "{json}");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains("Talos v1.99.0 is not a release this engine knows") && message.contains("v1.15"),
        "{json}"
    );
    assert!(!message.contains("pairing") && !message.contains("skips"), "{json}");
    assert_eq!(json["upgrade_calls"], 0, "nothing touched");
}

// Issue 55 (papercuts): every run given no --etcd-snapshot-dir left an ichor-rollout-*
// directory in the temporary folder. It is the run's own now, removed at its end, and the
// output says so; a directory given is kept.
#[test]
fn a_run_leaves_no_snapshot_directory_behind_unless_given_one() {
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new(example_binary("rollout"))
        .args(["--workers", "3"])
        .env("TMPDIR", tmp.path())
        .output()
        .expect("the example runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("etcd snapshot: ") && text.contains("removed with the run"), "{text}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind in the temporary folder: {left:?}");

    let kept = tempfile::tempdir().unwrap();
    let args = ["--workers", "3", "--json", "--etcd-snapshot-dir", kept.path().to_str().unwrap()];
    let output = Command::new(example_binary("rollout")).args(args).env("TMPDIR", tmp.path()).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["etcd_snapshot"]["kept"], true, "{json}");
    let location = json["etcd_snapshot"]["location"].as_str().unwrap();
    assert!(std::path::Path::new(location).is_file(), "a directory given keeps its snapshot: {location}");
}

#[test]
fn two_control_planes_are_refused_at_planning() {
    let output = rollout(&["--control-planes", "2", "--json"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(summary(&output)["reason"], "TwoControlPlanes");
}

#[test]
fn a_failure_names_its_machine_and_reason_in_the_output_the_trace_and_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let trace_file = dir.path().join("trace.jsonl");
    let args = ["--faults", "ab-fallback", "--seed", "3"];
    let output = rollout(&[&args[..], &["--trace", trace_file.to_str().unwrap()]].concat());
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("reason: MachineFailed"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("failed: ") && l.contains(": AbFallback: ")), "{text}");
    let events = trace(&trace_file);
    let failed: Vec<&Value> = events.iter().filter(|e| e["event"] == "failed").collect();
    assert!(!failed.is_empty() && failed.iter().all(|e| e["reason"] == "AbFallback"), "{failed:?}");
    assert!(events.iter().any(|e| e["event"] == "paused" && e["reason"] == "MachineFailed"));

    let output = rollout(&[&args[..], &["--json"]].concat());
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["outcome"], "paused");
    assert_eq!(json["reason"], "MachineFailed");
    let failed = json["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{json}");
    assert_eq!(failed[0]["reason"], "AbFallback");
    assert!(
        failed[0]["node"].as_str().unwrap().starts_with("worker-")
            || failed[0]["node"].as_str().unwrap().starts_with("cp-")
    );
}

#[test]
fn bad_arguments_are_exit_2_naming_them() {
    let output = rollout(&["--faults", "banana"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("banana"), "{output:?}");
    assert!(output.stdout.is_empty(), "errors go to stderr, not to a --json reader: {output:?}");
}

#[test]
fn the_summary_counts_what_a_real_cluster_would_pay_and_compares_the_peers() {
    let output = rollout(&["--workers", "12", "--max-unavailable", "3", "--seed", "4", "--json", "--compare"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let json = summary(&output);
    assert_eq!(json["wake"], "watch", "the realistic model is the default");
    for key in ["events", "lease_writes", "kube_reads", "status_bytes_max", "ideal_s", "wall_s", "kube_writes"] {
        assert!(json[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {json}");
    }
    let nodes = json["nodes"].as_f64().unwrap();
    assert!(json["events"].as_f64().unwrap() <= 2.0 * nodes + 5.0, "Events are about two per machine: {json}");
    let compare = &json["compare"];
    let ratio = |policy: &str| compare[policy].as_f64().unwrap_or_else(|| panic!("{policy}: {json}"));
    for policy in ["ideal", "mco-like", "topf-like", "tuppr-like", "runbook"] {
        assert!(ratio(policy) >= 1.0 - 1e-9, "no policy beats the physical bound: {policy} {json}");
    }
    assert!(ratio("ideal") <= ratio("mco-like") && ratio("ideal") <= ratio("tuppr-like"), "{json}");
    assert!(ratio("runbook") > ratio("engine"), "one at a time is the slowest: {json}");
    // The engine runs under watches and latency: without pre-pulls never faster than the
    // zero-overhead ideal (with them, the pull leaves the critical path, which the ideal
    // scheduler on the same durations does not take off).
    assert!(ratio("engine-no-prepull") >= ratio("ideal"), "{json}");
}

#[test]
fn the_etcd_snapshot_is_written_before_any_control_plane_and_its_record_matches_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let trace_file = dir.path().join("trace.jsonl");
    let snapshots = dir.path().join("snapshots");
    let args = ["--json", "--trace", trace_file.to_str().unwrap(), "--etcd-snapshot-dir", snapshots.to_str().unwrap()];
    let output = rollout(&args);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let json = summary(&output);
    let snapshot = &json["etcd_snapshot"];
    let location = snapshot["location"].as_str().expect("etcd_snapshot.location");
    let bytes = std::fs::read(location).unwrap();
    assert_eq!(snapshot["size"], bytes.len() as u64);
    let sha256: String = <sha2::Sha256 as sha2::Digest>::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(snapshot["sha256"], sha256);
    assert_eq!(std::fs::read_dir(&snapshots).unwrap().count(), 1, "one file, no partial one");

    let events = trace(&trace_file);
    let at = |pred: &dyn Fn(&Value) -> bool| events.iter().position(pred);
    let snapshot_at = at(&|e| e["event"] == "etcd-snapshot").expect("etcd-snapshot in the trace");
    let first_cp_call = at(&|e| e["event"] == "upgrade-call" && e["role"] == "control-plane").unwrap();
    assert!(snapshot_at < first_cp_call, "the snapshot precedes every control plane's Upgrade call");

    // Printed for people too.
    let output = rollout(&["--etcd-snapshot-dir", snapshots.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("etcd snapshot: ") && text.contains("sha256 "), "{text}");
}

#[test]
fn a_snapshot_that_fails_is_exit_4_with_no_upgrade_call_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let output = rollout(&["--faults", "snapshot-fails", "--json", "--etcd-snapshot-dir", snapshots.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["outcome"], "paused");
    assert_eq!(json["reason"], "EtcdSnapshotFailed");
    assert!(json["message"].as_str().unwrap().contains("snapshot"), "{json}");
    assert_eq!(json["upgrade_calls"], 0);
    assert_eq!(json["etcd_snapshot"], Value::Null);
    let left: Vec<_> =
        std::fs::read_dir(&snapshots).map(|d| d.map(|e| e.unwrap().file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "no partial snapshot left: {left:?}");
}

#[test]
fn workload_faults_hold_machines_at_the_preflight_gate_and_the_summary_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    for fault in ["pdb-zero", "single-replica"] {
        let trace_file = dir.path().join(format!("{fault}.jsonl"));
        let args = ["--workers", "12", "--max-unavailable", "3", "--faults", fault, "--json"];
        let output = rollout(&[&args[..], &["--trace", trace_file.to_str().unwrap()]].concat());
        assert_eq!(output.status.code(), Some(0), "{fault}: {output:?}");
        let json = summary(&output);
        assert!(json["preflight_waits"].as_f64().unwrap() > 0.0, "{fault}: {json}");
        let events = trace(&trace_file);
        let blocked = events.iter().filter(|e| e["event"] == "preflight-blocked").count();
        let cleared = events.iter().filter(|e| e["event"] == "preflight-clear").count();
        assert!(blocked > 0 && cleared > 0, "{fault}: {blocked} blocked, {cleared} cleared");
    }
}

/// The events of one node, by name, in order.
fn events_of(trace: &[Value], node: &str) -> Vec<String> {
    trace.iter().filter(|e| e["node"] == node).map(|e| e["event"].as_str().unwrap_or_default().to_owned()).collect()
}

fn position(events: &[String], event: &str) -> usize {
    events.iter().position(|e| e == event).unwrap_or_else(|| panic!("no {event} in {events:?}"))
}

#[test]
fn the_lifecycle_executor_pulls_installs_drains_reboots_and_uncordons_each_machine_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let trace_file = dir.path().join("trace.jsonl");
    let args = ["--executor", "lifecycle", "--prepull", "off", "--json", "--trace", trace_file.to_str().unwrap()];
    let output = rollout(&args);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let json = summary(&output);
    assert_eq!(json["upgrade_calls"], 0, "no legacy Upgrade call: {json}");
    assert_eq!((json["install_calls"].as_u64(), json["reboot_calls"].as_u64()), (Some(8), Some(8)), "{json}");
    let trace = trace(&trace_file);
    for node in ["cp-1", "worker-3"] {
        let events = events_of(&trace, node);
        let order =
            ["image-pull-start", "image-pulled", "install-start", "installed", "cordon", "drain", "reboot-call"];
        let at: Vec<usize> = order.iter().map(|e| position(&events, e)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{node}: {events:?}");
        let (reboot_end, uncordon, converged) =
            (position(&events, "reboot-end"), position(&events, "uncordon"), position(&events, "converged"));
        assert!(at[6] < reboot_end && reboot_end < uncordon && uncordon < converged, "{node}: {events:?}");
    }
    let storage = events_of(&trace, "worker-3");
    assert!(position(&storage, "evacuated") < position(&storage, "cordon"), "no drain with the evacuation open");
}

#[test]
fn an_ab_fallback_on_the_lifecycle_path_pauses_is_never_converged_and_is_not_rebooted_again() {
    let dir = tempfile::tempdir().unwrap();
    let trace_file = dir.path().join("trace.jsonl");
    let args =
        ["--executor", "lifecycle", "--faults", "ab-fallback", "--json", "--trace", trace_file.to_str().unwrap()];
    let output = rollout(&args);
    assert_eq!(output.status.code(), Some(4), "{}", String::from_utf8_lossy(&output.stderr));
    let json = summary(&output);
    let failed = json["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{json}");
    assert_eq!(failed[0]["reason"], "AbFallback", "{json}");
    let node = failed[0]["node"].as_str().unwrap();
    let events = events_of(&trace(&trace_file), node);
    assert!(!events.contains(&"converged".to_owned()), "{node}: {events:?}");
    assert_eq!(events.iter().filter(|e| *e == "reboot-call").count(), 1, "{node}: {events:?}");
}

#[test]
fn the_executor_and_prepull_options_are_checked() {
    let output = rollout(&["--executor", "fast"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let output = rollout(&["--prepull", "maybe"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[test]
fn a_larger_installer_makes_each_pull_longer_and_pre_pulling_worth_more() {
    let ratios = |mb: &str| {
        let output = rollout(&[
            "--workers",
            "30",
            "--max-unavailable",
            "3",
            "--seed",
            "2",
            "--installer-mb",
            mb,
            "--json",
            "--compare",
        ]);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let json = summary(&output);
        let ratio = |policy: &str| json["compare"][policy].as_f64().unwrap_or_else(|| panic!("{policy}: {json}"));
        (ratio("engine"), ratio("engine-no-prepull"))
    };
    let (small_on, small_off) = ratios("100");
    let (large_on, large_off) = ratios("1000");
    // The bound counts each pull, so it grows with the image; what pre-pulling saves of it
    // grows with it too.
    assert!(
        large_off - large_on > small_off - small_on,
        "100 MB: {small_on}/{small_off}, 1 GB: {large_on}/{large_off}"
    );
    assert!(large_on < 1.0, "a 1 GB installer pre-pulled: {large_on} of the bound");
    for bad in ["0", "many"] {
        let output = rollout(&["--installer-mb", bad]);
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("--installer-mb"), "{output:?}");
    }
}

/// Issue 34, item 3 (decision 0009): a cluster already on the target is done with nothing
/// done: no etcd snapshot, no call, no file in the snapshot directory.
#[test]
fn a_cluster_already_on_the_target_takes_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let output = rollout(&[
        "--from",
        "v1.14.4",
        "--to",
        "v1.14.4",
        "--etcd-snapshot-dir",
        snapshots.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["outcome"], "completed");
    assert_eq!(json["etcd_snapshot"], Value::Null, "{json}");
    assert_eq!((json["upgrade_calls"].as_u64(), json["install_calls"].as_u64()), (Some(0), Some(0)), "{json}");
    let files = std::fs::read_dir(&snapshots).map(|d| d.count()).unwrap_or(0);
    assert_eq!(files, 0, "no snapshot written");
}

/// Issue 34, item 2: the exit code follows the cause, not the flags. A snapshot directory
/// that cannot be written pauses the run before any call; with a fault on the command
/// line that did not cause it (`pdb-zero`), that is still exit 1, not 4. The fault that
/// breaks the snapshot stream (`snapshot-fails`) is 4.
#[test]
fn a_pause_the_environment_caused_is_exit_1_whatever_faults_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let unwritable = file.join("snapshots");
    let unwritable = unwritable.to_str().unwrap();
    for faults in [&[][..], &["--faults", "pdb-zero"][..]] {
        let output = rollout(&[faults, &["--etcd-snapshot-dir", unwritable, "--json"]].concat());
        assert_eq!(output.status.code(), Some(1), "{faults:?}: {output:?}");
        let json = summary(&output);
        assert_eq!((json["outcome"].as_str(), json["reason"].as_str()), (Some("paused"), Some("EtcdSnapshotFailed")));
        assert_eq!(json["upgrade_calls"], 0, "{json}");
    }
    let output = rollout(&["--faults", "snapshot-fails", "--json"]);
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    assert_eq!(summary(&output)["reason"], "EtcdSnapshotFailed");
}

#[test]
fn removing_a_control_plane_that_leaves_two_is_refused_at_planning_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let trace_file = dir.path().join("trace.jsonl");
    let trace_arg = trace_file.to_str().unwrap();
    let remove = ["--operation", "remove", "--node", "cp-2", "--json"];
    let output = rollout(&[&remove[..], &["--trace", trace_arg]].concat());
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let json = summary(&output);
    assert_eq!((json["outcome"].as_str(), json["reason"].as_str()), (Some("refused"), Some("LeavesTwoControlPlanes")));
    let message = json["message"].as_str().unwrap();
    assert!(message.contains("cp-2") && message.contains("tolerates no failure"), "{message}");
    assert!(message.contains("add a control plane first"), "says what to do: {message}");
    assert!(!trace_file.exists(), "refused before anything ran: no trace");

    // Allowed: it completes into two control planes.
    let output = rollout(&[&remove[..], &["--allow-two-control-planes"]].concat());
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(summary(&output)["outcome"], "completed");
    // Four control planes leave three; a worker is no control plane.
    let output = rollout(&["--control-planes", "4", "--operation", "remove", "--node", "cp-4", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(rollout(&["--operation", "remove", "--node", "worker-1", "--json"]).status.code(), Some(0));
    // The flag belongs to a removal.
    let output = rollout(&["--allow-two-control-planes"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("only for --operation remove"), "{output:?}");
}

#[test]
fn summaries_claim_ratios_and_bounds_only_for_a_completed_upgrade() {
    // Paused: no makespan, bound or ratio; the time it stopped at is there.
    let paused = rollout(&["--faults", "ab-fallback", "--seed", "3", "--json", "--compare"]);
    assert_eq!(paused.status.code(), Some(4), "{paused:?}");
    let json = summary(&paused);
    for key in ["makespan_s", "lower_bound_s", "ideal_s", "compare"] {
        assert!(json[key].is_null(), "{key} of a paused run: {json}");
    }
    assert!(json["elapsed_s"].as_f64().unwrap() > 0.0, "{json}");
    let text = String::from_utf8_lossy(&rollout(&["--faults", "ab-fallback", "--seed", "3"]).stdout).into_owned();
    assert!(text.contains("makespan: n/a (paused at "), "{text}");
    assert!(!text.contains("ratio 0.") && !text.contains("lower bound"), "{text}");

    // Completed: all of them.
    let json = summary(&rollout(&["--json"]));
    assert!(json["makespan_s"].as_f64().unwrap() >= json["lower_bound_s"].as_f64().unwrap(), "{json}");

    // A removal: its own summary, no upgrade's figures.
    let removal = rollout(&["--operation", "remove", "--node", "worker-2", "--json"]);
    let json = summary(&removal);
    assert_eq!(json["removal"]["node"], "worker-2", "{json}");
    assert_eq!(json["removal"]["node_deleted"], true, "{json}");
    assert!(json["removal"]["etcd_member_gone"].is_null(), "a worker has no member: {json}");
    assert_eq!(json["removal"]["replicas_moved"], 4, "{json}");
    // Four replicas of the simulator's sizes (each its move's seconds at 100 MiB/s).
    let bytes = json["removal"]["evacuated_bytes"].as_u64().expect("evacuated bytes");
    assert!(bytes >= 4 * (100 << 20) && bytes.is_multiple_of(100 << 20), "{json}");
    assert!(json["makespan_s"].is_null() && json["lower_bound_s"].is_null(), "{json}");
    let text = String::from_utf8_lossy(&rollout(&["--operation", "remove", "--node", "worker-2"]).stdout).into_owned();
    assert!(text.contains("node removed: worker-2 (Node deleted: yes)"), "{text}");
    assert!(text.contains("replicas moved off: 4 (") && text.contains(" GiB)"), "{text}");
    assert!(!text.contains("nodes on target") && !text.contains("(ratio") && !text.contains("lower bound"), "{text}");
    let text =
        String::from_utf8_lossy(&rollout(&["--control-planes", "4", "--operation", "remove", "--node", "cp-4"]).stdout)
            .into_owned();
    assert!(text.contains("etcd member gone: yes"), "{text}");

    // A refusal: nothing ran, nothing to hold a ratio against.
    let text = String::from_utf8_lossy(&rollout(&["--control-planes", "2"]).stdout).into_owned();
    assert!(!text.contains("ratio 0.000") && !text.contains("lower bound"), "{text}");
}

#[test]
fn with_json_stdout_is_one_json_line_whatever_the_end_and_errors_go_to_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let unwritable = dir.path().join("file");
    std::fs::write(&unwritable, b"").unwrap();
    let snapshot_dir = unwritable.join("snapshots").display().to_string();
    let ends: [(&[&str], i32); 7] = [
        (&[], 0),
        (&["--faults", "ab-fallback", "--seed", "3"], 4),
        (&["--control-planes", "2"], 3),
        (&["--operation", "remove", "--node", "cp-2"], 3),
        (&["--operation", "remove", "--node", "worker-2"], 0),
        (
            &[
                "--operation",
                "kubernetes",
                "--to-kubernetes",
                "1.35.0",
                "--faults",
                "component-crashloop",
                "--seed",
                "2",
            ],
            4,
        ),
        (&["--etcd-snapshot-dir", &snapshot_dir], 1),
    ];
    for (args, code) in ends {
        let output = rollout(&[args, &["--json"]].concat());
        assert_eq!(output.status.code(), Some(code), "{args:?}: {output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(stdout.lines().count(), 1, "{args:?}: one line on stdout: {stdout}");
        let json: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"));
        assert!(json["outcome"].is_string(), "{args:?}: {json}");
    }
    let output = rollout(&["--workers", "many", "--json"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "a bad argument is an error on stderr: {output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("many"), "{output:?}");
}
