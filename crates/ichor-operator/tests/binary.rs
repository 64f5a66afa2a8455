//! The production binary as a process: what it refuses and how it says so. It carries no
//! simulated fleet (that is the `operator` example's, `ichor_sim::fleet`).

use std::process::Command;

fn ichor_operator(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ichor-operator")).args(args).output().unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Whatever else the workspace builds, the binary has no simulated fleet to start.
#[test]
fn the_binary_has_no_simulated_fleet() {
    let (code, stderr) = ichor_operator(&["--simulate-fleet", "3+5"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unexpected argument '--simulate-fleet'"), "{stderr}");
}

/// `cargo build -p ichor-operator`, as the Dockerfile builds it, links no simulator and no
/// test kit, with any of its features.
#[test]
fn the_production_build_links_no_simulator_and_no_test_kit() {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", "ichor-operator", "-e", "normal", "--prefix", "none", "--all-features"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(output.status.success(), "cargo tree: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(tree.contains("ichor-adapters"), "{tree}");
    for linked in ["ichor-sim", "ichor-testkit"] {
        assert!(!tree.contains(linked), "the production build links {linked}:\n{tree}");
    }
    // tokio's test-util (the simulator's paused clock) is not among its features either.
    let features = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", "ichor-operator", "-e", "normal,features", "-i", "tokio", "--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(features.status.success(), "cargo tree: {}", String::from_utf8_lossy(&features.stderr));
    let features = String::from_utf8_lossy(&features.stdout);
    assert!(features.contains("tokio feature \"rt\""), "{features}");
    assert!(!features.contains("test-util"), "tokio's test-util in the production build:\n{features}");
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
