//! The production binary as a process: what it refuses and how it says so. It carries no
//! simulated fleet (that is the `operator` example's, `--features fleet`).

use std::process::Command;

fn ichor_operator(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ichor-operator")).args(args).output().unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn the_production_binary_has_no_simulated_fleet() {
    let (code, stderr) = ichor_operator(&["--simulate-fleet", "3+5"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unexpected argument '--simulate-fleet'"), "{stderr}");
}

#[test]
fn an_unusable_kubeconfig_is_named_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let (code, stderr) = ichor_operator(&["--kubeconfig", &missing.display().to_string()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no-such-kubeconfig"), "{stderr}");
}

#[test]
fn version_names_the_binary() {
    let output = Command::new(env!("CARGO_BIN_EXE_ichor-operator")).arg("--version").output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with(&format!("ichor-operator {}", env!("CARGO_PKG_VERSION"))), "{stdout}");
}
