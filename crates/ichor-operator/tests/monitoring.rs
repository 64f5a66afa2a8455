//! The operator's alert rules (`deploy/monitoring/ichor-rules.yaml`) under the real
//! promtool (`ICHOR_TEST_PROMTOOL`: `bash scripts/monitoring.sh build`, then
//! `bash scripts/monitoring.sh env`): they load, and their unit tests
//! (`ichor-rules.test.yaml`: each alert fires when it should and stays quiet otherwise)
//! pass. That they read only what a running operator exports is tested against one
//! (`examples/tests/operator_monitoring.rs`).

use std::path::PathBuf;
use std::process::Command;

fn promtool(args: &[&str]) -> String {
    let promtool = std::env::var("ICHOR_TEST_PROMTOOL")
        .expect("ICHOR_TEST_PROMTOOL: the promtool binary (bash scripts/monitoring.sh build, then env)");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring");
    let out = Command::new(&promtool).args(args).current_dir(&dir).output().expect("promtool runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
#[ignore = "needs promtool: ICHOR_TEST_PROMTOOL (bash scripts/monitoring.sh build, then env)"]
fn the_alert_rules_load_and_pass_their_promtool_tests() {
    let checked = promtool(&["check", "rules", "ichor-rules.yaml"]);
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "ichor-rules.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}
