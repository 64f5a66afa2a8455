//! The Talos client against an apid stand-in built from the same proto subset, over real
//! mutual TLS on loopback, with talosconfigs written as `talosctl gen config` writes them:
//! Ed25519 keys under Talos's own `ED25519 PRIVATE KEY` label, and ECDSA under `EC PRIVATE
//! KEY`. The stand-in requires and verifies the client certificate.

use std::time::Duration;

use ichor_adapters::talos::{ClientOptions, SnapshotError, TalosClient};
use ichor_talos_executor::cause::report;
use ichor_talos_executor::talos_api::{
    InstallRequest, PullRequest, ResetRequest, TalosApi, TalosError, UpgradeRequest,
};
use ichor_talosconfig::{Overrides, TalosContext, parse};
use ichor_testkit::apid::{Apid, Behaviour};
use ichor_testkit::net::{BlackHole, refused_endpoint};
use ichor_testkit::pki::{Ca, KeyKind, Leaf, Validity, talosconfig};
use ichor_upgrade_core::talos_step::MachineStage;

/// Every test's own bound, so that a hang fails instead of stalling the suite.
const TEST_BOUND: Duration = Duration::from_secs(30);

/// A context read from a talosctl-style talosconfig for these endpoints.
fn context(endpoints: &[String], ca: &Ca, admin: &Leaf) -> TalosContext {
    let text = talosconfig("ichor-test", endpoints, &[], &ca.cert_pem, &admin.cert_pem, &admin.talos_key_pem);
    parse(&text, &Overrides::default()).expect("a talosctl-style talosconfig parses")
}

fn options() -> ClientOptions {
    ClientOptions::default().with_dial_timeout(Duration::from_secs(2)).with_call_timeout(Duration::from_secs(5))
}

/// A cluster: its CA, an apid stand-in, and a client with an admin certificate.
struct Cluster {
    ca: Ca,
    apid: Apid,
    client: TalosClient,
}

impl Cluster {
    fn start(kind: KeyKind, behaviour: Behaviour) -> Self {
        let ca = Ca::new(kind);
        let apid = Apid::start(&ca, &ca, behaviour);
        let client =
            TalosClient::new(&context(&[apid.endpoint()], &ca, &ca.admin(Validity::Current)), options()).unwrap();
        Self { ca, apid, client }
    }
}

async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, future).await.expect("the test's own bound")
}

fn upgrade_request(timeout: Duration) -> UpgradeRequest {
    UpgradeRequest { image: "factory.talos.dev/metal-installer/abc:v1.14.4".into(), timeout }
}

#[test]
fn a_client_is_made_outside_any_runtime_and_connects_on_first_use() {
    // The talos example builds its client in `main`, before its runtime exists.
    let ca = Ca::new(KeyKind::Ed25519);
    let client = TalosClient::new(&context(&["10.5.0.2".into()], &ca, &ca.admin(Validity::Current)), options());
    assert!(client.is_ok(), "{client:?}");
}

#[tokio::test]
async fn a_talosctl_written_ed25519_config_makes_calls_aimed_at_one_node() {
    let c = Cluster::start(
        KeyKind::Ed25519,
        Behaviour {
            stage: ichor_adapters::talos::proto::resource::machine_status_spec::Stage::Upgrading,
            ..Behaviour::default()
        },
    );
    bounded(async {
        assert_eq!(c.client.version("10.5.0.7").await.unwrap(), "v1.14.3");
        assert_eq!(c.client.nodename("10.5.0.7").await.unwrap(), "worker-7");
        assert_eq!(c.client.machine_stage("10.5.0.7").await.unwrap(), MachineStage::Upgrading);
        let members = c.client.etcd_members("10.5.0.2").await.unwrap();
        assert_eq!(
            members.iter().map(|m| (m.id, m.hostname.as_str(), m.is_learner)).collect::<Vec<_>>(),
            vec![(1, "cp-1", false), (2, "cp-2", true)]
        );
    })
    .await;
    assert_eq!(c.apid.seen().nodes(), vec!["10.5.0.7", "10.5.0.7", "10.5.0.7", "10.5.0.2"]);
}

#[tokio::test]
async fn an_ecdsa_config_with_a_sec1_key_works_too() {
    let c = Cluster::start(KeyKind::EcdsaP256, Behaviour::default());
    assert_eq!(bounded(c.client.version("10.5.0.7")).await.unwrap(), "v1.14.3");
}

#[tokio::test]
async fn the_upgrade_sends_the_image_without_force_or_preserve_and_its_deadline() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    let ack = bounded(c.client.upgrade("10.5.0.7", &upgrade_request(Duration::from_secs(540)))).await.unwrap();
    assert_eq!((ack.ack.as_str(), ack.actor_id.as_str()), ("Upgrade request received", "actor-1"));
    let seen = c.apid.seen();
    let sent = &seen.upgrades[0];
    assert_eq!(sent.image, "factory.talos.dev/metal-installer/abc:v1.14.4");
    assert!(!sent.force && !sent.preserve && !sent.stage);
    let deadline = seen.upgrade_deadlines[0].clone().expect("a grpc-timeout header");
    assert!(deadline.ends_with('m') || deadline.ends_with('S') || deadline.ends_with('u'), "{deadline}");
}

#[tokio::test]
async fn a_reply_with_metadata_error_is_an_answered_error() {
    let c = Cluster::start(
        KeyKind::Ed25519,
        Behaviour { upgrade_metadata_error: Some("upgrade locked".into()), ..Behaviour::default() },
    );
    let err = bounded(c.client.upgrade("10.5.0.7", &upgrade_request(Duration::from_secs(60)))).await.unwrap_err();
    assert_eq!(err, TalosError::Answered { code: "Unknown".into(), message: "upgrade locked".into() });
    assert!(!err.is_unreachable());
    let err = bounded(c.client.etcd_leave_cluster("10.5.0.2")).await.unwrap_err();
    assert!(matches!(err, TalosError::Answered { ref message, .. } if message.contains("etcd is not running")));
}

#[tokio::test]
async fn an_error_status_is_an_answered_error() {
    let c = Cluster::start(
        KeyKind::Ed25519,
        Behaviour { upgrade_status: Some(tonic::Code::FailedPrecondition), ..Behaviour::default() },
    );
    let err = bounded(c.client.upgrade("10.5.0.7", &upgrade_request(Duration::from_secs(60)))).await.unwrap_err();
    assert!(
        matches!(err, TalosError::Answered { ref code, ref message } if code == "FailedPrecondition" && message.contains("installer")),
        "{err:?}"
    );
}

#[tokio::test]
async fn apids_unavailable_for_a_node_it_cannot_reach_is_unreachable_not_a_failure() {
    let c =
        Cluster::start(KeyKind::Ed25519, Behaviour { unreachable: vec!["10.5.0.3".into()], ..Behaviour::default() });
    for err in [
        bounded(c.client.nodename("10.5.0.3")).await.unwrap_err(),
        bounded(c.client.machine_stage("10.5.0.3")).await.unwrap_err(),
        bounded(c.client.upgrade("10.5.0.3", &upgrade_request(Duration::from_secs(60)))).await.unwrap_err(),
    ] {
        assert!(matches!(&err, TalosError::Unreachable { code, .. } if code == "Unavailable"), "{err:?}");
        assert!(err.is_unreachable(), "{err:?}");
        assert!(report(&err).contains("connection refused"), "{}", report(&err));
    }
    assert_eq!(bounded(c.client.version("10.5.0.4")).await.unwrap(), "v1.14.3", "other nodes answer");
}

#[tokio::test]
async fn a_slow_upgrade_is_cut_at_its_deadline() {
    let c =
        Cluster::start(KeyKind::Ed25519, Behaviour { upgrade_takes: Duration::from_secs(5), ..Behaviour::default() });
    let err = bounded(c.client.upgrade("10.5.0.7", &upgrade_request(Duration::from_millis(300)))).await.unwrap_err();
    assert!(err.is_unreachable() && !err.never_sent(), "the node may have the call: {err:?}");
}

#[tokio::test]
async fn etcd_status_and_alarms_are_read_for_the_gate() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    let status = bounded(c.client.etcd_status("10.5.0.3")).await.unwrap();
    assert_eq!((status.member_id, status.leader, status.errors.clone()), (2, 1, vec!["slow fdatasync".to_owned()]));
    let alarms = bounded(c.client.etcd_alarms("10.5.0.3")).await.unwrap();
    assert_eq!(alarms, vec![ichor_talos_executor::talos_api::EtcdAlarm { member_id: 3, kind: 1 }]);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn an_etcd_snapshot_is_streamed_with_its_size_and_checksum() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    let mut out = Vec::new();
    let snapshot = bounded(c.client.etcd_snapshot("10.5.0.2", &mut out)).await.unwrap();
    assert_eq!(out, b"etcd snapshot bytes");
    assert_eq!(snapshot.size, 19);
    assert_eq!(snapshot.sha256, sha256_hex(b"etcd snapshot bytes"), "the checksum of exactly the bytes written");
}

#[tokio::test]
async fn a_snapshot_file_appears_only_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd.snapshot");
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    let snapshot = bounded(c.client.etcd_snapshot_to_file("10.5.0.2", &path)).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"etcd snapshot bytes");
    assert_eq!(snapshot.sha256, sha256_hex(b"etcd snapshot bytes"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left beside it");

    let broken = Cluster::start(KeyKind::Ed25519, Behaviour { snapshot_fails_after: Some(2), ..Behaviour::default() });
    let path = dir.path().join("broken.snapshot");
    let err = bounded(broken.client.etcd_snapshot_to_file("10.5.0.2", &path)).await.unwrap_err();
    assert!(matches!(err, SnapshotError::Talos(_)), "{err:?}");
    assert!(report(&err).contains("snapshot stream broken"), "{}", report(&err));
    assert!(!path.exists(), "no partial snapshot at the target");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("etcd.snapshot")], "and no temporary file");
}

#[tokio::test]
async fn the_reset_is_graceful_and_powers_off() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    bounded(c.client.reset("10.5.0.7", &ResetRequest { graceful: true, reboot: false })).await.unwrap();
    assert_eq!(bounded(c.client.reboot("10.5.0.8")).await.unwrap(), "actor-r");
    assert_eq!(
        c.apid.seen().resets,
        vec![ichor_adapters::talos::proto::machine::ResetRequest { graceful: true, reboot: false }]
    );
}

#[tokio::test]
async fn a_refused_port_is_a_dial_error_that_says_connection_refused() {
    let ca = Ca::new(KeyKind::Ed25519);
    let client =
        TalosClient::new(&context(&[refused_endpoint()], &ca, &ca.admin(Validity::Current)), options()).unwrap();
    let err = bounded(client.version("10.5.0.7")).await.unwrap_err();
    assert!(matches!(err, TalosError::Dial { .. }) && err.is_unreachable() && err.never_sent(), "{err:?}");
    assert!(report(&err).contains("connection refused"), "{}", report(&err));
}

#[tokio::test]
async fn a_peer_that_never_speaks_tls_ends_within_the_dial_bound() {
    let hole = BlackHole::start();
    let ca = Ca::new(KeyKind::Ed25519);
    let options = options().with_dial_timeout(Duration::from_millis(500));
    let client = TalosClient::new(&context(&[hole.endpoint()], &ca, &ca.admin(Validity::Current)), options).unwrap();
    let err = bounded(client.version("10.5.0.7")).await.unwrap_err();
    assert!(matches!(err, TalosError::Dial { .. }), "{err:?}");
    assert!(report(&err).contains("TLS handshake did not complete within 500ms"), "{}", report(&err));
    assert_eq!(hole.accepted(), 1);
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_a_tls_error_and_no_call_is_made() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    let stranger = Ca::new(KeyKind::Ed25519);
    let client =
        TalosClient::new(&context(&[c.apid.endpoint()], &c.ca, &stranger.admin(Validity::Current)), options()).unwrap();
    let err = bounded(client.version("10.5.0.7")).await.unwrap_err();
    assert!(matches!(err, TalosError::Tls { .. }) && !err.is_unreachable(), "{err:?}");
    assert!(report(&err).contains("alert"), "the server's refusal is named: {}", report(&err));
    assert!(c.apid.seen().calls.is_empty(), "the server never saw the call");
}

#[tokio::test]
async fn a_server_the_talosconfig_does_not_trust_is_a_tls_error() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    let trusting = |ca: &Ca| {
        let mut ctx = context(&[c.apid.endpoint()], &c.ca, &c.ca.admin(Validity::Current));
        ctx.ca_pem = ca.cert_pem.clone();
        TalosClient::new(&ctx, options()).unwrap()
    };
    // Another cluster's talosconfig: its CA has the same name (every Talos OS CA is
    // O=talos), so the server's certificate is found to be signed by another key.
    let err = bounded(trusting(&Ca::new(KeyKind::Ed25519)).version("10.5.0.7")).await.unwrap_err();
    assert!(matches!(err, TalosError::Tls { .. }), "{err:?}");
    assert!(report(&err).contains("BadSignature"), "{}", report(&err));
    // A CA of another name: an unknown issuer.
    let err = bounded(trusting(&Ca::named(KeyKind::Ed25519, "elsewhere")).version("10.5.0.7")).await.unwrap_err();
    assert!(matches!(err, TalosError::Tls { .. }), "{err:?}");
    assert!(report(&err).contains("UnknownIssuer"), "{}", report(&err));
    assert!(c.apid.seen().calls.is_empty());
}

#[tokio::test]
async fn expired_certificates_either_way_are_tls_errors() {
    let ca = Ca::new(KeyKind::Ed25519);
    // The client's admin certificate expired (Talos issues them for a year).
    let apid = Apid::start(&ca, &ca, Behaviour::default());
    let client = TalosClient::new(&context(&[apid.endpoint()], &ca, &ca.admin(Validity::Expired)), options()).unwrap();
    let err = bounded(client.version("10.5.0.7")).await.unwrap_err();
    assert!(matches!(err, TalosError::Tls { .. }), "{err:?}");
    // The server's certificate expired.
    let server = ca.admin(Validity::Expired);
    let expired = Apid::start_with(&server.cert_pem, &server.key_pem, &ca.cert_pem, Behaviour::default());
    let client =
        TalosClient::new(&context(&[expired.endpoint()], &ca, &ca.admin(Validity::Current)), options()).unwrap();
    let err = bounded(client.version("10.5.0.7")).await.unwrap_err();
    assert!(matches!(err, TalosError::Tls { .. }), "{err:?}");
    assert!(report(&err).to_lowercase().contains("expired"), "{}", report(&err));
}

#[tokio::test]
async fn the_next_endpoint_is_tried_when_one_cannot_be_reached() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    let endpoints = [refused_endpoint(), c.apid.endpoint()];
    let client = TalosClient::new(&context(&endpoints, &c.ca, &c.ca.admin(Validity::Current)), options()).unwrap();
    assert_eq!(bounded(client.version("10.5.0.7")).await.unwrap(), "v1.14.3");
    assert_eq!(c.apid.seen().nodes(), vec!["10.5.0.7"]);
}

#[tokio::test]
async fn a_call_about_a_node_prefers_an_endpoint_that_is_not_that_node() {
    let ca = Ca::new(KeyKind::Ed25519);
    let (by_ip, by_name) = (Apid::start(&ca, &ca, Behaviour::default()), Apid::start(&ca, &ca, Behaviour::default()));
    let endpoints = [by_ip.endpoint(), format!("localhost:{}", by_name.addr().port())];
    let client = TalosClient::new(&context(&endpoints, &ca, &ca.admin(Validity::Current)), options()).unwrap();
    // About the node 127.0.0.1 (rebooting, say): through the other endpoint.
    bounded(client.version("127.0.0.1")).await.unwrap();
    // About any other node: the first endpoint.
    bounded(client.version("10.5.0.9")).await.unwrap();
    assert_eq!(by_name.seen().nodes(), vec!["127.0.0.1"]);
    assert_eq!(by_ip.seen().nodes(), vec!["10.5.0.9"]);
}

#[tokio::test]
async fn a_call_that_was_answered_is_never_sent_through_another_endpoint() {
    let ca = Ca::new(KeyKind::Ed25519);
    let first = Apid::start(&ca, &ca, Behaviour { unreachable: vec!["10.5.0.3".into()], ..Behaviour::default() });
    let second = Apid::start(&ca, &ca, Behaviour::default());
    let client = TalosClient::new(
        &context(&[first.endpoint(), second.endpoint()], &ca, &ca.admin(Validity::Current)),
        options(),
    )
    .unwrap();
    let err = bounded(client.upgrade("10.5.0.3", &upgrade_request(Duration::from_secs(60)))).await.unwrap_err();
    assert!(matches!(err, TalosError::Unreachable { .. }), "{err:?}");
    assert!(second.seen().calls.is_empty(), "one Upgrade call, not two");
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused_before_any_connection() {
    let ca = Ca::new(KeyKind::Ed25519);
    let (admin, other) = (ca.admin(Validity::Current), ca.admin(Validity::Current));
    let text = talosconfig("t", &["127.0.0.1".into()], &[], &ca.cert_pem, &admin.cert_pem, &other.talos_key_pem);
    let err = TalosClient::new(&parse(&text, &Overrides::default()).unwrap(), options()).unwrap_err();
    assert!(report(&err).contains("crt/key"), "{}", report(&err));
}

#[tokio::test]
async fn an_etcd_member_is_removed_by_id_through_another_control_plane() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour::default());
    bounded(c.client.etcd_remove_member("10.5.0.2", 0x3c2b_9f01_aa10_0001)).await.unwrap();
    let seen = c.apid.seen();
    assert_eq!(seen.removed_members, vec![0x3c2b_9f01_aa10_0001], "the uint64 ID on the wire");
    assert_eq!(seen.calls, vec![("EtcdRemoveMemberByID", "10.5.0.2".to_owned())]);
}

// The lifecycle path (Talos 1.13 and later): ImageService, LifecycleService, Reboot and the
// boot ID, each aimed at one node with the `node` key (LifecycleService refuses `nodes`).

const INSTALLER: &str =
    "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";

#[tokio::test]
async fn an_image_is_pulled_into_the_system_namespace_and_listed() {
    let c = Cluster::start(
        KeyKind::Ed25519,
        Behaviour { images: vec!["registry.k8s.io/pause:3.10".into()], ..Behaviour::default() },
    );
    let pull = PullRequest { image: INSTALLER.into(), timeout: Duration::from_secs(60) };
    assert_eq!(bounded(c.client.image_pull("10.5.0.7", &pull)).await.unwrap(), INSTALLER);
    let listed: Vec<String> =
        bounded(c.client.image_list("10.5.0.7")).await.unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(listed, vec![INSTALLER.to_owned(), "registry.k8s.io/pause:3.10".to_owned()]);
    let seen = c.apid.seen();
    assert_eq!(seen.pulls, vec![(INSTALLER.to_owned(), true)], "the system containerd namespace");
    assert_eq!(seen.nodes(), vec!["10.5.0.7", "10.5.0.7"]);
    assert!(!seen.nodes_key, "never the deprecated nodes key");
}

#[tokio::test]
async fn an_install_streams_its_output_and_ends_with_its_exit_code() {
    let c = Cluster::start(
        KeyKind::Ed25519,
        Behaviour { install_output: vec!["a".into(), "b".into()], install_exit: Some(4), ..Behaviour::default() },
    );
    let install = InstallRequest { image: INSTALLER.into(), timeout: Duration::from_secs(60) };
    let outcome = bounded(c.client.lifecycle_upgrade("10.5.0.7", &install)).await.unwrap();
    assert_eq!(outcome.exit_code, 4, "a non-zero code is a message, not an error");
    assert_eq!(outcome.output, vec!["a".to_owned(), "b".to_owned()]);
    assert_eq!(c.apid.seen().installs, vec![INSTALLER.to_owned()]);
    assert!(!c.apid.seen().nodes_key);
}

#[tokio::test]
async fn an_install_keeps_only_the_installers_last_lines() {
    let lines: Vec<String> = (0..50).map(|i| format!("line {i}")).collect();
    let c = Cluster::start(KeyKind::Ed25519, Behaviour { install_output: lines, ..Behaviour::default() });
    let install = InstallRequest { image: INSTALLER.into(), timeout: Duration::from_secs(60) };
    let outcome = bounded(c.client.lifecycle_upgrade("10.5.0.7", &install)).await.unwrap();
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(outcome.output.len(), ichor_talos_executor::talos_api::INSTALL_OUTPUT_LINES);
    assert_eq!(outcome.output.last().map(String::as_str), Some("line 49"));
}

#[tokio::test]
async fn an_install_stream_that_ends_without_an_exit_code_broke_off() {
    let c = Cluster::start(KeyKind::Ed25519, Behaviour { install_exit: None, ..Behaviour::default() });
    let install = InstallRequest { image: INSTALLER.into(), timeout: Duration::from_secs(60) };
    let err = bounded(c.client.lifecycle_upgrade("10.5.0.7", &install)).await.unwrap_err();
    assert!(matches!(err, TalosError::Transport { .. }) && err.is_unreachable(), "{err:?}");
    assert!(report(&err).contains("without the installer's exit code"), "{}", report(&err));
}

#[tokio::test]
async fn the_boot_id_is_read_from_the_kernel_as_talosctl_reads_it() {
    let c =
        Cluster::start(KeyKind::Ed25519, Behaviour { boot_id: "7e2d9c40-13b1-4c8f".into(), ..Behaviour::default() });
    assert_eq!(bounded(c.client.boot_id("10.5.0.7")).await.unwrap(), "7e2d9c40-13b1-4c8f");
    assert_eq!(c.apid.seen().reads, vec![ichor_talos_executor::talos_api::BOOT_ID_PATH.to_owned()]);
}

#[tokio::test]
async fn lifecycle_calls_to_a_node_apid_cannot_reach_are_unreachable() {
    let c =
        Cluster::start(KeyKind::Ed25519, Behaviour { unreachable: vec!["10.5.0.9".into()], ..Behaviour::default() });
    let install = InstallRequest { image: INSTALLER.into(), timeout: Duration::from_secs(60) };
    let err = bounded(c.client.lifecycle_upgrade("10.5.0.9", &install)).await.unwrap_err();
    assert!(matches!(&err, TalosError::Unreachable { code, .. } if code == "Unavailable"), "{err:?}");
    let err = bounded(c.client.boot_id("10.5.0.9")).await.unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
    let pull = PullRequest { image: INSTALLER.into(), timeout: Duration::from_secs(60) };
    assert!(bounded(c.client.image_pull("10.5.0.9", &pull)).await.unwrap_err().is_unreachable());
}
