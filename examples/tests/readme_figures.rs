//! What the README says a command shows is what that command shows (issue 34, item 6):
//! the picture `docs/timeline.svg` is the one its command draws today, and each figure
//! the README quotes beside it is read from the same run's trace. The command is read out
//! of the README itself, so that the text, the command and the picture cannot drift apart.
//!
//! `ICHOR_WRITE_README_FIGURES=1` writes the picture anew (then commit it).

use std::path::{Path, PathBuf};
use std::process::Command;

use ichor_testkit::example_binary;
use serde_json::Value;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The arguments of the README's `cargo run --example rollout -- ... --timeline
/// docs/timeline.svg` (wrapped over lines in the text), without `--timeline` and its file.
fn readme_command(readme: &str) -> Vec<String> {
    let start = readme.find("`cargo run --example rollout -- ").expect("the README's drawing command");
    let rest = &readme[start + 1..];
    let command = &rest[..rest.find('`').unwrap()];
    let words: Vec<&str> = command.split_whitespace().skip(5).collect();
    let at = words.iter().position(|w| *w == "--timeline").expect("the command draws a timeline");
    assert_eq!(words.get(at + 1), Some(&"docs/timeline.svg"), "{command}");
    words.iter().enumerate().filter(|(i, _)| *i != at && *i != at + 1).map(|(_, w)| (*w).to_owned()).collect()
}

#[test]
fn the_readmes_picture_and_its_figures_come_from_the_command_beside_them() {
    let root = repository();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let args = readme_command(&readme);
    let dir = tempfile::tempdir().unwrap();
    let (svg, trace) = (dir.path().join("timeline.svg"), dir.path().join("trace.jsonl"));
    let output = Command::new(example_binary("rollout"))
        .args(&args)
        .args(["--progress", "off", "--timeline"])
        .arg(&svg)
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{args:?}: {output:?}");

    let drawn = std::fs::read_to_string(&svg).unwrap();
    let committed = root.join("docs/timeline.svg");
    if std::env::var_os("ICHOR_WRITE_README_FIGURES").is_some() {
        std::fs::write(&committed, &drawn).unwrap();
    }
    assert!(
        std::fs::read_to_string(&committed).unwrap() == drawn,
        "docs/timeline.svg is not what `{}` draws today: ICHOR_WRITE_README_FIGURES=1 cargo test -p ichor-examples \
         --test suite readme_figures, then commit it",
        args.join(" ")
    );

    let events: Vec<Value> =
        std::fs::read_to_string(&trace).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let at = |node: &str, event: &str| {
        events.iter().find(|e| e["node"] == node && e["event"] == event).and_then(|e| e["t"].as_f64()).unwrap()
    };
    // "the etcd snapshot (from cp-2)"
    let snapshot = events.iter().find(|e| e["event"] == "etcd-snapshot").expect("a snapshot");
    let quoted = format!("the etcd snapshot (from {})", snapshot["node"].as_str().unwrap());
    assert!(readme.contains(&quoted), "the README should say: {quoted}");
    // "cp-3's lagging member keeps it verifying, and every worker waiting, for N minutes":
    // from its Node Ready to its convergence.
    let verifying = (at("cp-3", "converged") - at("cp-3", "ready")) / 60.0;
    let quoted = format!("keeps it verifying, and every worker waiting, for {verifying:.1} minutes");
    let unwrapped = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(unwrapped.contains(&quoted), "the README should say: {quoted}");
    let first_worker = events
        .iter()
        .filter(|e| e["role"] == "worker" && e["event"] == "evacuation-start")
        .filter_map(|e| e["t"].as_f64())
        .fold(f64::MAX, f64::min);
    assert!(first_worker >= at("cp-3", "converged"), "no worker starts before cp-3 converged");
}
