//! Replays every committed fuzz corpus (`fuzz/corpus/<target>/*`) through the same check the
//! target runs: CI exercises them with no fuzzer.

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).collect();
    assert!(!entries.is_empty(), "{}: an empty corpus", dir.display());
    for entry in entries {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let result = std::panic::catch_unwind(|| check(&data));
        assert!(result.is_ok(), "{target}: {} fails its check", path.display());
    }
}

#[test]
fn versions_corpus() {
    replay("versions", ichor_fuzz_checks::versions);
}

#[test]
fn marker_corpus() {
    replay("marker", ichor_fuzz_checks::marker);
}

#[test]
fn talosconfig_corpus() {
    replay("talosconfig", ichor_fuzz_checks::talosconfig);
}

#[test]
fn step_corpus() {
    replay("step", ichor_fuzz_checks::step);
}

#[test]
fn rollout_corpus() {
    replay("rollout", ichor_fuzz_checks::rollout);
}
