//! The `talos` example run as a user runs it: the built binary, as a process, with a
//! talosconfig written as `talosctl gen config` writes it, against an apid stand-in on
//! loopback (mutual TLS, client certificate required).

use std::path::Path;
use std::process::{Command, Output};

use ichor_testkit::apid::{Apid, Behaviour};
use ichor_testkit::example_binary;
use ichor_testkit::net::{BlackHole, refused_endpoint};
use ichor_testkit::pki::{Ca, KeyKind, Leaf, Validity, talosconfig};
use serde_json::Value;

/// Writes a talosctl-style talosconfig for `endpoints` into `dir`.
fn write_config(dir: &Path, endpoints: &[String], ca: &Ca, admin: &Leaf) -> std::path::PathBuf {
    let path = dir.join("talosconfig");
    let text = talosconfig("ichor-test", endpoints, &[], &ca.cert_pem, &admin.cert_pem, &admin.talos_key_pem);
    std::fs::write(&path, text).unwrap();
    path
}

fn talos(config: &Path, args: &[&str]) -> Output {
    Command::new(example_binary("talos"))
        .arg("--talosconfig")
        .arg(config)
        .args(args)
        .output()
        .expect("the example runs")
}

fn stdout_json(output: &Output) -> Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The error the example reports: one JSON object on stderr, nothing on stdout.
fn error_text(output: &Output) -> String {
    assert!(output.stdout.is_empty(), "errors go to stderr: {output:?}");
    let text = String::from_utf8_lossy(&output.stderr);
    let json: Value =
        serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {text}"));
    json["error"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn a_talosctl_written_ed25519_talosconfig_works() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let apid = Apid::start(&ca, &ca, Behaviour::default());
    let config = write_config(dir.path(), &[apid.endpoint()], &ca, &ca.admin(Validity::Current));
    let output = talos(&config, &["--nodes", "10.5.0.2", "version"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(stdout_json(&output), serde_json::json!({ "node": "10.5.0.2", "version": "v1.14.3" }));
    assert_eq!(apid.seen().nodes(), vec!["10.5.0.2"]);
}

#[test]
fn an_ecdsa_talosconfig_works() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::EcdsaP256);
    let apid = Apid::start(&ca, &ca, Behaviour::default());
    let config = write_config(dir.path(), &[apid.endpoint()], &ca, &ca.admin(Validity::Current));
    let output = talos(&config, &["--nodes", "10.5.0.2", "etcd-status"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(stdout_json(&output)["member_id"], "0000000000000002");
}

#[test]
fn a_refused_port_says_connection_refused_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let config = write_config(dir.path(), &[refused_endpoint()], &ca, &ca.admin(Validity::Current));
    let output = talos(&config, &["--nodes", "10.5.0.2", "version"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(error_text(&output).contains("connection refused"), "{}", error_text(&output));
}

#[test]
fn a_peer_that_never_speaks_tls_ends_within_the_dial_bound_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let hole = BlackHole::start();
    let ca = Ca::new(KeyKind::Ed25519);
    let config = write_config(dir.path(), &[hole.endpoint()], &ca, &ca.admin(Validity::Current));
    let output = talos(&config, &["--nodes", "10.5.0.2", "version"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(error_text(&output).contains("TLS handshake did not complete within 15s"), "{}", error_text(&output));
}

#[test]
fn a_certificate_the_server_refuses_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let apid = Apid::start(&ca, &ca, Behaviour::default());
    let config = write_config(dir.path(), &[apid.endpoint()], &ca, &ca.admin(Validity::Expired));
    let output = talos(&config, &["--nodes", "10.5.0.2", "version"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let error = error_text(&output);
    assert!(error.contains("TLS") && error.contains("alert"), "{error}");
    assert!(apid.seen().calls.is_empty());
}

#[test]
fn apids_unavailable_is_reported_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let apid = Apid::start(&ca, &ca, Behaviour { unreachable: vec!["10.5.0.3".into()], ..Behaviour::default() });
    let config = write_config(dir.path(), &[apid.endpoint()], &ca, &ca.admin(Validity::Current));
    let output = talos(&config, &["--nodes", "10.5.0.3", "version"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let error = error_text(&output);
    assert!(error.starts_with("Unavailable: ") && error.contains("connection refused"), "{error}");
}

#[test]
fn a_key_that_does_not_parse_or_match_is_exit_2_and_nothing_is_dialled() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let hole = BlackHole::start();
    let admin = ca.admin(Validity::Current);
    let mismatched = Leaf { talos_key_pem: ca.admin(Validity::Current).talos_key_pem, ..admin };
    let config = write_config(dir.path(), &[hole.endpoint()], &ca, &mismatched);
    let output = talos(&config, &["--nodes", "10.5.0.2", "version"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("crt/key"), "{text}");
    let text = std::fs::read_to_string(&config).unwrap().replace("key: ", "key: bm90IGEga2V5");
    std::fs::write(&config, text).unwrap();
    let output = talos(&config, &["--nodes", "10.5.0.2", "version"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("key"), "{output:?}");
    assert_eq!(hole.accepted(), 0, "no connection was attempted");
}

#[test]
fn an_etcd_snapshot_file_is_written_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let apid = Apid::start(&ca, &ca, Behaviour::default());
    let config = write_config(dir.path(), &[apid.endpoint()], &ca, &ca.admin(Validity::Current));
    let out = dir.path().join("db.snapshot");
    let output = talos(&config, &["--nodes", "10.5.0.2", "etcd-snapshot", out.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(stdout_json(&output)["size"], 19);
    assert_eq!(std::fs::read(&out).unwrap(), b"etcd snapshot bytes");

    let broken = Apid::start(&ca, &ca, Behaviour { snapshot_fails_after: Some(1), ..Behaviour::default() });
    let config = write_config(dir.path(), &[broken.endpoint()], &ca, &ca.admin(Validity::Current));
    let partial = dir.path().join("broken.snapshot");
    let output = talos(&config, &["--nodes", "10.5.0.2", "etcd-snapshot", partial.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(error_text(&output).contains("snapshot stream broken"), "{}", error_text(&output));
    let mut names: Vec<_> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, vec!["db.snapshot", "talosconfig"], "no partial file, no temporary file");
}

const INSTALLER: &str =
    "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";

#[test]
fn pull_then_a_lifecycle_upgrade_then_the_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let apid = Apid::start(&ca, &ca, Behaviour::default());
    let config = write_config(dir.path(), &[apid.endpoint()], &ca, &ca.admin(Validity::Current));
    let pulled = talos(&config, &["--nodes", "10.5.0.7", "pull", "--image", INSTALLER]);
    assert_eq!(pulled.status.code(), Some(0), "{pulled:?}");
    assert_eq!(stdout_json(&pulled), serde_json::json!({ "node": "10.5.0.7", "image": INSTALLER }));
    let images = talos(&config, &["--nodes", "10.5.0.7", "images"]);
    assert_eq!(stdout_json(&images)[0]["name"], INSTALLER);
    let upgraded = talos(&config, &["--nodes", "10.5.0.7", "upgrade", "--image", INSTALLER, "--lifecycle"]);
    assert_eq!(upgraded.status.code(), Some(0), "{upgraded:?}");
    let result = stdout_json(&upgraded);
    assert_eq!((result["exit_code"].as_i64(), result["meaning"].as_str()), (Some(0), Some("success")));
    assert_eq!(talos(&config, &["--nodes", "10.5.0.7", "boot-id"]).status.code(), Some(0));
    let rebooted = talos(&config, &["--nodes", "10.5.0.7", "reboot"]);
    assert_eq!(stdout_json(&rebooted)["actor_id"], "actor-r");
    let seen = apid.seen();
    assert!(seen.pulls.iter().all(|(image, system)| image == INSTALLER && *system), "{:?}", seen.pulls);
    assert_eq!(seen.installs, vec![INSTALLER.to_owned()]);
    assert!(!seen.nodes_key, "the node key only");
}

#[test]
fn a_lifecycle_upgrade_whose_installer_fails_exits_1_with_its_code_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(KeyKind::Ed25519);
    let behaviour = Behaviour {
        install_output: vec!["host version check: upgrade from v1.12.0 is not supported".into()],
        install_exit: Some(4),
        ..Behaviour::default()
    };
    let apid = Apid::start(&ca, &ca, behaviour);
    let config = write_config(dir.path(), &[apid.endpoint()], &ca, &ca.admin(Validity::Current));
    let output = talos(&config, &["--nodes", "10.5.0.7", "upgrade", "--image", INSTALLER, "--lifecycle"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let result = stdout_json(&output);
    assert_eq!(result["exit_code"], 4);
    assert!(result["meaning"].as_str().unwrap().contains("environment"), "{result}");
    assert!(result["output"][0].as_str().unwrap().contains("host version check"), "{result}");
}
