//! The kubectl plugin as krew installs it: `scripts/krew.sh package` makes the archive of
//! the built `kubectl-ichor` and `deploy/krew/ichor.yaml` for it, the real krew (built from
//! its Go module: `ICHOR_TEST_KREW`, `bash scripts/krew.sh build`) validates and installs
//! it, and kubectl (the one beside `ICHOR_TEST_KUBECONFIG`) finds it as `kubectl ichor`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KREW_VAR: &str = "ICHOR_TEST_KREW";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// krew with its root in `home` (no index, no upgrade check: nothing leaves the machine).
fn krew(home: &Path) -> Command {
    let path = match std::env::var_os(KREW_VAR) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "this test needs krew: {KREW_VAR}=<path> is not set (build it with `bash scripts/krew.sh build`, \
             then `bash scripts/krew.sh env` prints the line; `bash .ci/run` does it all)"
        ),
    };
    let mut command = Command::new(path);
    command.env("KREW_ROOT", home).env("KREW_NO_UPGRADE_CHECK", "1");
    command
}

/// The archive and manifest of the built plugin, in `dir`: (manifest, archive).
fn package(dir: &Path) -> (PathBuf, PathBuf) {
    let output = Command::new("bash")
        .arg(root().join("scripts/krew.sh"))
        .args(["package", env!("CARGO_BIN_EXE_kubectl-ichor")])
        .arg(dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "krew.sh package: {}", text(&output));
    let archive = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "gz"))
        .expect("an archive");
    (dir.join("ichor.yaml"), archive)
}

#[test]
#[ignore = "needs krew and kubectl: ICHOR_TEST_KREW (bash scripts/krew.sh build), ICHOR_TEST_KUBECONFIG"]
fn krew_installs_the_plugin_from_its_manifest_and_kubectl_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let (manifest, archive) = package(&dir.path().join("dist"));
    let home = dir.path().join("krew");
    let installed = krew(&home)
        .arg("install")
        .arg(format!("--manifest={}", manifest.display()))
        .arg(format!("--archive={}", archive.display()))
        .output()
        .unwrap();
    assert!(installed.status.success(), "krew install: {}", text(&installed));
    assert!(text(&installed).contains("Installed plugin: ichor"), "{}", text(&installed));
    // Its receipt (`krew list` needs the index, which this test never fetches).
    let receipt = std::fs::read_to_string(home.join("receipts/ichor.yaml")).expect("krew's receipt");
    assert!(receipt.contains("name: ichor") && receipt.contains(&format!("version: v{}", env!("CARGO_PKG_VERSION"))));

    // kubectl finds it on PATH as `kubectl ichor`.
    let kubeconfig = ichor_testkit::kube::kubeconfig();
    let kubectl = kubeconfig.parent().unwrap().join("kubectl");
    let path = format!("{}:{}", home.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let version = Command::new(&kubectl).args(["ichor", "--version"]).env("PATH", &path).output().unwrap();
    assert_eq!(text(&version).trim(), format!("kubectl-ichor {}", env!("CARGO_PKG_VERSION")));
    let plugins = Command::new(&kubectl).args(["plugin", "list"]).env("PATH", &path).output().unwrap();
    assert!(text(&plugins).contains(&home.join("bin/kubectl-ichor").display().to_string()), "{}", text(&plugins));
}

/// The manifest's description names every command the plugin has.
#[test]
fn the_krew_manifest_describes_every_command_of_the_plugin() {
    let manifest = std::fs::read_to_string(root().join("deploy/krew/ichor.yaml")).unwrap();
    let help = Command::new(env!("CARGO_BIN_EXE_kubectl-ichor")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let commands: Vec<&str> = help
        .split("Commands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 6, "{commands:?}");
    for command in commands {
        assert!(manifest.contains(&format!("kubectl ichor {command} ")), "the manifest does not describe {command}");
    }
}

/// An archive that is not the one the manifest names (its sha256 differs) is refused, and
/// nothing is installed.
#[test]
#[ignore = "needs krew: ICHOR_TEST_KREW (bash scripts/krew.sh build)"]
fn krew_refuses_an_archive_whose_checksum_is_not_the_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let (manifest, archive) = package(&dir.path().join("dist"));
    let text_of = std::fs::read_to_string(&manifest).unwrap();
    let sha = text_of.lines().find_map(|l| l.trim().strip_prefix("sha256: ")).unwrap().to_owned();
    let other = if sha.starts_with('0') { "1" } else { "0" };
    std::fs::write(&manifest, text_of.replace(&sha, &format!("{other}{}", &sha[1..]))).unwrap();
    let home = dir.path().join("krew");
    let refused = krew(&home)
        .arg("install")
        .arg(format!("--manifest={}", manifest.display()))
        .arg(format!("--archive={}", archive.display()))
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).to_lowercase().contains("checksum") || text(&refused).contains("sha256"),
        "{}",
        text(&refused)
    );
    assert!(!home.join("bin/kubectl-ichor").exists());
}
