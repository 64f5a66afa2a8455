//! The Talos client against an apid stand-in built from the same proto subset, over real
//! mutual TLS on loopback, with talosconfigs written as `talosctl gen config` writes them:
//! Ed25519 keys under Talos's own `ED25519 PRIVATE KEY` label, and ECDSA under `EC PRIVATE
//! KEY`. The stand-in requires and verifies the client certificate.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_adapters::talos::{ClientOptions, SnapshotError, TalosClient};
use ichor_executor::cause::report;
use ichor_executor::talos_api::{
    ApplyConfigReply, ApplyConfigRequest, ApplyMode, InstallRequest, PullRequest, ResetRequest, TalosApi, TalosError,
    UpgradeRequest,
};
use ichor_talosconfig::{Overrides, TalosContext, parse};
use ichor_testkit::apid::{Apid, Behaviour, Served, serve};
use ichor_testkit::net::{BlackHole, refused_endpoint};
use ichor_testkit::pki::{Ca, KeyKind, Leaf, Validity, talosconfig};
use ichor_upgrade_core::machine::vocabulary::MachineStage;

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
    assert_eq!(alarms, vec![ichor_executor::talos_api::EtcdAlarm { member_id: 3, kind: 1 }]);
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
    assert_eq!(outcome.output.len(), ichor_executor::talos_api::INSTALL_OUTPUT_LINES);
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
    assert_eq!(c.apid.seen().reads, vec![ichor_executor::talos_api::BOOT_ID_PATH.to_owned()]);
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

// ApplyConfiguration and the machine configuration's COSI Get, against a double that
// decodes the requests and encodes its answers with messages written here from Talos's
// own field numbers and enum values, not with Ichor's proto subset: a wrong number on
// either side fails these tests.

/// Talos's `machine.ApplyConfigurationRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct TalosApplyRequest {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
    /// `Mode`: REBOOT 0, AUTO 1, NO_REBOOT 2, STAGED 3, TRY 4.
    #[prost(int32, tag = "4")]
    mode: i32,
    #[prost(bool, tag = "5")]
    dry_run: bool,
    #[prost(message, optional, tag = "6")]
    try_mode_timeout: Option<prost_types::Duration>,
}

/// Talos's `common.Metadata`, its first two fields.
#[derive(Clone, PartialEq, prost::Message)]
struct TalosMetadata {
    #[prost(string, tag = "1")]
    hostname: String,
    #[prost(string, tag = "2")]
    error: String,
}

/// Talos's `machine.ApplyConfiguration`.
#[derive(Clone, PartialEq, prost::Message)]
struct TalosApplied {
    #[prost(message, optional, tag = "1")]
    metadata: Option<TalosMetadata>,
    #[prost(string, repeated, tag = "2")]
    warnings: Vec<String>,
    #[prost(int32, tag = "3")]
    mode: i32,
    #[prost(string, tag = "4")]
    mode_details: String,
}

/// Talos's `machine.ApplyConfigurationResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct TalosApplyResponse {
    #[prost(message, repeated, tag = "1")]
    messages: Vec<TalosApplied>,
}

/// COSI's `cosi.resource.GetRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct CosiGetRequest {
    #[prost(string, tag = "1")]
    namespace: String,
    #[prost(string, tag = "2")]
    r#type: String,
    #[prost(string, tag = "3")]
    id: String,
}

/// COSI's `Spec`.
#[derive(Clone, PartialEq, prost::Message)]
struct CosiSpec {
    #[prost(bytes = "vec", tag = "1")]
    proto_spec: Vec<u8>,
    #[prost(string, tag = "2")]
    yaml_spec: String,
}

/// COSI's `Resource`, its spec (field 1, the metadata, left out).
#[derive(Clone, PartialEq, prost::Message)]
struct CosiResource {
    #[prost(message, optional, tag = "2")]
    spec: Option<CosiSpec>,
}

/// COSI's `GetResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct CosiGetResponse {
    #[prost(message, optional, tag = "1")]
    resource: Option<CosiResource>,
}

/// Talos's `resource.config.MachineConfigSpec`.
#[derive(Clone, PartialEq, prost::Message)]
struct TalosMachineConfigSpec {
    #[prost(bytes = "vec", tag = "1")]
    yaml_marshalled: Vec<u8>,
}

/// How the wire double answers.
#[derive(Clone, Default)]
struct WireAnswer {
    /// The mode number of the ApplyConfiguration reply; `None`: the request's.
    mode: Option<i32>,
    /// A `metadata.error` in the reply.
    metadata_error: Option<String>,
    /// An error status instead of a reply.
    status: Option<(tonic::Code, &'static str)>,
    /// The machine configuration's YAML.
    config: Vec<u8>,
}

/// What the wire double decoded, with each call's `node` metadata.
#[derive(Default)]
struct WireSeen {
    applies: Vec<(String, TalosApplyRequest)>,
    gets: Vec<(String, CosiGetRequest)>,
}

#[derive(Clone)]
struct Wire {
    seen: Arc<Mutex<WireSeen>>,
    answer: WireAnswer,
}

impl Wire {
    fn apply(&self, request: tonic::Request<TalosApplyRequest>) -> Result<TalosApplyResponse, tonic::Status> {
        let node = node_of(&request);
        let request = request.into_inner();
        let mode = self.answer.mode.unwrap_or(request.mode);
        self.seen.lock().unwrap().applies.push((node, request));
        if let Some((code, message)) = self.answer.status {
            return Err(tonic::Status::new(code, message));
        }
        let metadata =
            self.answer.metadata_error.clone().map(|error| TalosMetadata { error, ..TalosMetadata::default() });
        let applied = TalosApplied {
            metadata,
            warnings: vec![format!("warning {mode}")],
            mode,
            mode_details: format!("details {mode}"),
        };
        Ok(TalosApplyResponse { messages: vec![applied] })
    }

    fn get(&self, request: tonic::Request<CosiGetRequest>) -> Result<CosiGetResponse, tonic::Status> {
        let node = node_of(&request);
        self.seen.lock().unwrap().gets.push((node, request.into_inner()));
        let spec = TalosMachineConfigSpec { yaml_marshalled: self.answer.config.clone() };
        let spec = CosiSpec { proto_spec: prost::Message::encode_to_vec(&spec), yaml_spec: String::new() };
        Ok(CosiGetResponse { resource: Some(CosiResource { spec: Some(spec) }) })
    }
}

fn node_of<T>(request: &tonic::Request<T>) -> String {
    request.metadata().get("node").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

/// One unary method, `answer`, run by tonic's own server machinery with prost's codec.
struct Method<F>(Arc<F>);

impl<Req, Resp, F> tonic::server::UnaryService<Req> for Method<F>
where
    F: Fn(tonic::Request<Req>) -> Result<Resp, tonic::Status>,
{
    type Response = Resp;
    type Future = std::future::Ready<Result<tonic::Response<Resp>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        std::future::ready((self.0)(request).map(tonic::Response::new))
    }
}

type HttpFuture = tonic::codegen::BoxFuture<http::Response<tonic::body::Body>, std::convert::Infallible>;

fn unary<Req, Resp, F>(request: http::Request<tonic::body::Body>, answer: F) -> HttpFuture
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: Fn(tonic::Request<Req>) -> Result<Resp, tonic::Status> + Send + Sync + 'static,
{
    Box::pin(async move {
        let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
        Ok(grpc.unary(Method(Arc::new(answer)), request).await)
    })
}

/// `machine.MachineService`, its ApplyConfiguration only.
#[derive(Clone)]
struct WireMachine(Wire);

impl tonic::server::NamedService for WireMachine {
    const NAME: &'static str = "machine.MachineService";
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for WireMachine {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = HttpFuture;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let wire = self.0.clone();
        match request.uri().path() {
            "/machine.MachineService/ApplyConfiguration" => unary(request, move |r| wire.apply(r)),
            path => {
                let status = tonic::Status::unimplemented(path.to_owned());
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// `cosi.resource.State`, its Get only.
#[derive(Clone)]
struct WireState(Wire);

impl tonic::server::NamedService for WireState {
    const NAME: &'static str = "cosi.resource.State";
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for WireState {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = HttpFuture;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let wire = self.0.clone();
        match request.uri().path() {
            "/cosi.resource.State/Get" => unary(request, move |r| wire.get(r)),
            path => {
                let status = tonic::Status::unimplemented(path.to_owned());
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// The wire double on loopback over mutual TLS, and a client of it.
struct WireCluster {
    seen: Arc<Mutex<WireSeen>>,
    client: TalosClient,
    _served: Served,
}

impl WireCluster {
    fn start(answer: WireAnswer) -> Self {
        let ca = Ca::new(KeyKind::Ed25519);
        let cert = ca.server(&["127.0.0.1"]);
        let wire = Wire { seen: Arc::default(), answer };
        let routes = tonic::service::Routes::new(WireMachine(wire.clone())).add_service(WireState(wire.clone()));
        let served = serve(&cert.cert_pem, &cert.key_pem, &ca.cert_pem, routes);
        let client =
            TalosClient::new(&context(&[served.endpoint()], &ca, &ca.admin(Validity::Current)), options()).unwrap();
        Self { seen: wire.seen, client, _served: served }
    }
}

const MODES: [(ApplyMode, i32); 5] = [
    (ApplyMode::Reboot, 0),
    (ApplyMode::Auto, 1),
    (ApplyMode::NoReboot, 2),
    (ApplyMode::Staged, 3),
    (ApplyMode::Try, 4),
];

#[tokio::test]
async fn apply_modes_and_fields_travel_by_talos_numbers_both_ways() {
    let c = WireCluster::start(WireAnswer::default());
    let data = |i: usize| format!("version: v1alpha1 # {i}\n").into_bytes();
    for (i, (mode, number)) in MODES.into_iter().enumerate() {
        let request = ApplyConfigRequest { data: data(i), mode, dry_run: i % 2 == 0 };
        let reply = bounded(c.client.apply_configuration("10.5.0.7", &request)).await.unwrap();
        // The double answers in the mode number it decoded: the client names it back.
        let expected = ApplyConfigReply {
            mode,
            mode_details: format!("details {number}"),
            warnings: vec![format!("warning {number}")],
        };
        assert_eq!(reply, expected, "{mode:?}");
    }
    let expected: Vec<(String, TalosApplyRequest)> = MODES
        .into_iter()
        .enumerate()
        .map(|(i, (_, mode))| {
            let request = TalosApplyRequest { data: data(i), mode, dry_run: i % 2 == 0, try_mode_timeout: None };
            ("10.5.0.7".to_owned(), request)
        })
        .collect();
    assert_eq!(
        c.seen.lock().unwrap().applies,
        expected,
        "data field 1, mode field 4 by Talos's numbers, dry_run field 5, no timeout"
    );
}

#[tokio::test]
async fn an_apply_answered_in_a_mode_ichor_does_not_know_is_an_error_naming_it() {
    let c = WireCluster::start(WireAnswer { mode: Some(9), ..WireAnswer::default() });
    let request = ApplyConfigRequest { data: b"x".to_vec(), mode: ApplyMode::NoReboot, dry_run: true };
    let err = bounded(c.client.apply_configuration("10.5.0.7", &request)).await.unwrap_err();
    assert!(matches!(&err, TalosError::Answered { message, .. } if message.contains("unknown mode 9")), "{err:?}");
}

#[tokio::test]
async fn an_apply_refused_or_failed_on_the_node_is_an_answered_error() {
    let request = ApplyConfigRequest { data: b"x".to_vec(), mode: ApplyMode::NoReboot, dry_run: false };
    let refused = WireCluster::start(WireAnswer {
        status: Some((tonic::Code::InvalidArgument, "failed to validate config")),
        ..WireAnswer::default()
    });
    let err = bounded(refused.client.apply_configuration("10.5.0.7", &request)).await.unwrap_err();
    assert_eq!(
        err,
        TalosError::Answered { code: "InvalidArgument".into(), message: "failed to validate config".into() }
    );
    assert!(!err.is_unreachable());
    let failed =
        WireCluster::start(WireAnswer { metadata_error: Some("apply failed".into()), ..WireAnswer::default() });
    let err = bounded(failed.client.apply_configuration("10.5.0.7", &request)).await.unwrap_err();
    assert_eq!(err, TalosError::Answered { code: "Unknown".into(), message: "apply failed".into() });
    let unreachable = WireCluster::start(WireAnswer {
        status: Some((tonic::Code::Unavailable, "connection error: connection refused")),
        ..WireAnswer::default()
    });
    let err = bounded(unreachable.client.apply_configuration("10.5.0.9", &request)).await.unwrap_err();
    assert!(matches!(&err, TalosError::Unreachable { code, .. } if code == "Unavailable"), "{err:?}");
}

#[tokio::test]
async fn the_machine_configuration_is_the_cosi_get_of_config_v1alpha1() {
    let yaml = b"version: v1alpha1\nmachine:\n  type: worker\n".to_vec();
    let c = WireCluster::start(WireAnswer { config: yaml.clone(), ..WireAnswer::default() });
    assert_eq!(bounded(c.client.machine_config("10.5.0.7")).await.unwrap(), yaml, "yaml_marshalled, field 1");
    let seen = c.seen.lock().unwrap();
    let get = CosiGetRequest {
        namespace: "config".into(),
        r#type: "MachineConfigs.config.talos.dev".into(),
        id: "v1alpha1".into(),
    };
    assert_eq!(seen.gets, vec![("10.5.0.7".to_owned(), get)]);
}

/// Decision 0014 rule 19: the client knows its certificate's Talos roles (its subject's
/// Organizations), with no call made: planning refuses a Kubernetes upgrade to a
/// talosconfig that is not os:admin before anything changes.
#[test]
fn the_client_reads_its_talos_roles_from_its_certificate() {
    use ichor_executor::talos_api::TalosApi;
    let ca = Ca::new(KeyKind::Ed25519);
    let endpoints = ["127.0.0.1:1".to_owned()];
    let admin = TalosClient::new(&context(&endpoints, &ca, &ca.admin(Validity::Current)), options()).unwrap();
    assert_eq!(admin.client_roles(), Some(vec!["os:admin".to_owned()]));
    let operator = TalosClient::new(&context(&endpoints, &ca, &ca.client("os:operator")), options()).unwrap();
    assert_eq!(operator.client_roles(), Some(vec!["os:operator".to_owned()]));
    let none = TalosClient::new(&context(&endpoints, &ca, &ca.client("")), options()).unwrap();
    assert_eq!(none.client_roles(), Some(Vec::new()), "no role named: left to the Talos API");
}
