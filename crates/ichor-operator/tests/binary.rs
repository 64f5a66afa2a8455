//! The production binary as a process: what it refuses and how it says so. It carries no
//! simulated fleet (that is the `operator` example's, `--features fleet`).

use std::process::Command;

fn ichor_operator(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ichor-operator")).args(args).output().unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The binary carries the simulated fleet exactly when built with the feature `fleet`. A
/// workspace build turns it on (the examples need it: cargo unifies features), so this
/// test checks whichever was built; the next one checks the production build's graph.
#[test]
fn the_binary_has_a_simulated_fleet_only_with_the_fleet_feature() {
    let (code, stderr) = ichor_operator(&["--simulate-fleet", "0+5"]);
    assert_eq!(code, Some(2), "{stderr}");
    if cfg!(feature = "fleet") {
        assert!(stderr.contains("control plane"), "the fleet's own check answers: {stderr}");
    } else {
        assert!(stderr.contains("unexpected argument '--simulate-fleet'"), "{stderr}");
    }
}

/// `cargo build -p ichor-operator`, as the Dockerfile builds it, links no test kit.
#[test]
fn the_production_build_links_no_test_kit() {
    let tree = |features: &[&str]| {
        let output = Command::new(env!("CARGO"))
            .args(["tree", "--offline", "-p", "ichor-operator", "-e", "normal", "--prefix", "none"])
            .args(features)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(output.status.success(), "cargo tree: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let production = tree(&[]);
    assert!(production.contains("ichor-adapters"), "{production}");
    assert!(!production.contains("ichor-testkit"), "the production build links the test kit:\n{production}");
    assert!(tree(&["--features", "fleet"]).contains("ichor-testkit"), "the fleet feature brings it");
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
