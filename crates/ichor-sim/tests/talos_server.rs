//! The Talos API in front of any `TalosApi` (here the simulated cluster), reached by the
//! real Talos client over mutual TLS: how the simulated fleet is reached by an operator
//! running as in production.

use std::sync::Arc;
use std::time::Duration;

use ichor_adapters::talos::{ClientOptions, TalosClient, server};
use ichor_executor::talos_api::{
    ApplyConfigRequest, ApplyMode, InstallRequest, PullRequest, TalosApi, TalosError, UpgradeRequest,
};
use ichor_sim::{Realism, SimCluster, SimConfig};
use ichor_talosconfig::{Overrides, parse};
use ichor_testkit::apid::{Served, serve};
use ichor_testkit::pki::{Ca, KeyKind, Validity, talosconfig};
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::versions::TalosVersion;

/// The simulated cluster of `config` behind the Talos API on loopback over mutual TLS,
/// and the real client, with a talosconfig as `talosctl` writes one for it. The server
/// stops when the second value is dropped.
fn served(config: SimConfig) -> (Arc<SimCluster>, Served, TalosClient) {
    let sim = Arc::new(SimCluster::new(config));
    let ca = Ca::new(KeyKind::Ed25519);
    let cert = ca.server(&["127.0.0.1"]);
    let served = serve(&cert.cert_pem, &cert.key_pem, &ca.cert_pem, server::services(Arc::clone(&sim)));
    let admin = ca.admin(Validity::Current);
    let text = talosconfig("fleet", &[served.endpoint()], &[], &ca.cert_pem, &admin.cert_pem, &admin.talos_key_pem);
    let client = TalosClient::new(&parse(&text, &Overrides::default()).unwrap(), ClientOptions::default()).unwrap();
    (sim, served, client)
}

#[tokio::test]
async fn a_simulated_cluster_answers_the_real_client_as_apid_would() {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    // Served over real sockets in wall-clock time: the oracle model, with no virtual latency.
    let config = SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4")).with_storage(false).with_realism(Realism::oracle());
    let (sim, _served, client) = served(config);
    let worker = "10.5.0.5"; // worker-1: the sim numbers addresses from 10.5.0.2
    let run = async {
        assert_eq!(client.nodename(worker).await.unwrap(), "worker-1");
        assert_eq!(client.machine_stage(worker).await.unwrap(), MachineStage::Running);
        let members = client.etcd_members("10.5.0.2").await.unwrap();
        assert_eq!(members.len(), 3);
        let image = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";
        let ack = client
            .upgrade(worker, &UpgradeRequest { image: image.into(), timeout: Duration::from_secs(600) })
            .await
            .unwrap();
        assert_eq!(ack.ack, "Upgrade request received");
        assert_eq!(client.machine_stage(worker).await.unwrap(), MachineStage::Upgrading);
        // Another Upgrade on the same node is refused, as Talos refuses it.
        let again =
            client.upgrade(worker, &UpgradeRequest { image: image.into(), timeout: Duration::from_secs(600) }).await;
        assert!(
            matches!(again, Err(TalosError::Answered { ref code, .. }) if code == "FailedPrecondition"),
            "{again:?}"
        );
        // Rebooting: apid cannot reach it.
        sim.with_world(|w| {
            // Under the oracle the pull's least time is part of the install; the drain first.
            let d = &w.node("worker-1").unwrap().drawn;
            let t = w.now.saturating_add(d.pull + Duration::from_secs(d.drain + d.install + 1));
            w.advance_to(t);
        });
        let err = client.machine_stage(worker).await.unwrap_err();
        assert!(matches!(err, TalosError::Unreachable { ref code, .. } if code == "Unavailable"), "{err:?}");
    };
    tokio::time::timeout(Duration::from_secs(30), run).await.expect("the test's own bound");
}

#[tokio::test]
async fn the_lifecycle_path_is_served_as_talos_serves_it() {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    let config = SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4")).with_storage(false).with_realism(Realism::oracle());
    let (sim, _served, client) = served(config);
    let worker = "10.5.0.5";
    let image =
        "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";
    let install = InstallRequest { image: image.into(), timeout: Duration::from_secs(600) };
    let run = async {
        // The install needs the image in the system namespace first, as Talos's does.
        let err = client.lifecycle_upgrade(worker, &install).await.unwrap_err();
        assert!(
            matches!(&err, TalosError::Answered { code, message } if code == "FailedPrecondition" && message.contains("not found in containerd store")),
            "{err:?}"
        );
        let pull = PullRequest { image: image.into(), timeout: Duration::from_secs(600) };
        assert_eq!(client.image_pull(worker, &pull).await.unwrap(), image);
        assert_eq!(
            client.image_list(worker).await.unwrap().into_iter().map(|i| i.name).collect::<Vec<_>>(),
            vec![image.to_owned()]
        );
        // No install under way: no installer PID (NotFound), which the client reads as
        // none; while one runs (set in the world: under the oracle an install takes no
        // time), the PID is there.
        assert_eq!(client.install_running(worker).await.unwrap(), Some(false));
        sim.with_world(|w| w.nodes[3].installing = true);
        assert_eq!(client.install_running(worker).await.unwrap(), Some(true));
        sim.with_world(|w| w.nodes[3].installing = false);
        let started = std::sync::atomic::AtomicBool::new(false);
        let outcome = client.lifecycle_upgrade_reporting(worker, &install, &started).await.unwrap();
        assert_eq!(outcome.exit_code, 0);
        assert!(started.load(std::sync::atomic::Ordering::Relaxed), "the stream's first message reports the start");
        // The install neither drains nor reboots: the node still runs, on its old boot.
        assert_eq!(client.machine_stage(worker).await.unwrap(), MachineStage::Running);
        let before = client.boot_id(worker).await.unwrap();
        assert!(!client.reboot(worker).await.unwrap().is_empty());
        let err = client.boot_id(worker).await.unwrap_err();
        assert!(matches!(&err, TalosError::Unreachable { code, .. } if code == "Unavailable"), "rebooting: {err:?}");
        sim.with_world(|w| {
            let d = &w.node("worker-1").unwrap().drawn;
            let t = w.now.saturating_add(d.pull + Duration::from_secs(d.install + d.reboot + 1));
            w.advance_to(t);
        });
        let after = client.boot_id(worker).await.unwrap();
        assert_ne!(before, after, "a new boot");
        sim.with_world(|w| {
            assert_eq!(w.node("worker-1").unwrap().version, v("v1.14.4"), "booted into the slot installed")
        });
        assert_eq!(sim.with_world(|w| (w.installs.len(), w.reboots.len())), (1, 1));
    };
    tokio::time::timeout(Duration::from_secs(30), run).await.expect("the test's own bound");
}

#[tokio::test]
async fn a_machine_configuration_is_read_and_applied_as_talos_serves_it() {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    let config = SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4"))
        .with_storage(false)
        .with_kubernetes("1.34.1")
        .with_realism(Realism::oracle());
    let (sim, _served, client) = served(config);
    let worker = "10.5.0.5"; // worker-1
    let applies = || sim.read_world(|w| w.node("worker-1").unwrap().kube.applies.clone());
    let run = async {
        // The COSI Get of config/MachineConfigs.config.talos.dev/v1alpha1: the node's YAML.
        let yaml = client.machine_config(worker).await.unwrap();
        assert_eq!(yaml, sim.machine_config(worker).await.unwrap(), "the bytes the node holds");
        let text = String::from_utf8(yaml.clone()).unwrap();
        assert!(text.contains("kubelet:v1.34.1"), "{text}");
        let changed = text.replace("kubelet:v1.34.1", "kubelet:v1.35.0").into_bytes();

        // A dry run: the mode the node would use and what would change; nothing stored.
        let dry = ApplyConfigRequest { data: changed.clone(), mode: ApplyMode::NoReboot, dry_run: true };
        let reply = client.apply_configuration(worker, &dry).await.unwrap();
        assert_eq!(reply.mode, ApplyMode::NoReboot);
        assert!(reply.mode_details.contains("kubelet:v1.35.0"), "{reply:?}");
        assert!(reply.warnings.is_empty(), "{reply:?}");
        assert_eq!(client.machine_config(worker).await.unwrap(), yaml, "a dry run stores nothing");
        assert!(applies().is_empty());

        // The apply itself.
        let apply = ApplyConfigRequest { dry_run: false, ..dry.clone() };
        let reply = client.apply_configuration(worker, &apply).await.unwrap();
        assert_eq!(reply.mode, ApplyMode::NoReboot);
        assert!(reply.mode_details.contains("kubelet:v1.35.0"), "{reply:?}");
        assert_eq!(client.machine_config(worker).await.unwrap(), changed, "the node holds the new configuration");
        assert_eq!(applies(), vec![Component::Kubelet]);
        // The same configuration again: nothing to change.
        let again = client.apply_configuration(worker, &apply).await.unwrap();
        assert_eq!((again.mode, again.mode_details.as_str()), (ApplyMode::NoReboot, "No changes."));

        // A configuration the node refuses: InvalidArgument, answered as such.
        let untagged = String::from_utf8(changed.clone()).unwrap().replace(":v1.35.0", "").into_bytes();
        let err = client
            .apply_configuration(worker, &ApplyConfigRequest { data: untagged, ..apply.clone() })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, TalosError::Answered { code, message } if code == "InvalidArgument" && message.contains("no version tag")),
            "{err:?}"
        );
        assert!(!err.is_unreachable());
        // A mode the simulator does not serve: its own code travels too.
        let err = client
            .apply_configuration(worker, &ApplyConfigRequest { mode: ApplyMode::Reboot, ..apply.clone() })
            .await
            .unwrap_err();
        assert!(matches!(&err, TalosError::Answered { code, .. } if code == "Unimplemented"), "{err:?}");
        assert_eq!(applies(), vec![Component::Kubelet], "nothing more applied");
    };
    tokio::time::timeout(Duration::from_secs(30), run).await.expect("the test's own bound");
}

/// The bootstrap manifests, as Talos lists them (COSI List of
/// `Manifests.kubernetes.talos.dev` in `controlplane`, a stream of resources whose specs
/// hold each object as a `google.protobuf.Struct`), read by the real client: on a
/// control plane, kube-proxy's objects with the image its configuration holds, whole
/// numbers as integers; on a worker, none.
#[tokio::test]
async fn the_bootstrap_manifests_are_listed_as_talos_lists_them() {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    let config = SimConfig::new(1, 1, v("v1.14.3"), v("v1.14.4"))
        .with_storage(false)
        .with_kubernetes("1.34.1")
        .with_realism(Realism::oracle());
    let (sim, _served, client) = served(config);
    let run = async {
        let objects = client.bootstrap_manifests("10.5.0.2").await.unwrap(); // cp-1
        assert_eq!(objects, sim.bootstrap_manifests("10.5.0.2").await.unwrap(), "every object, as rendered");
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(kinds, ["Secret", "ServiceAccount", "DaemonSet"]);
        let daemonset = &objects[2];
        assert_eq!(
            daemonset["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.k8s.io/kube-proxy:v1.34.1"
        );
        assert_eq!(
            serde_json::to_string(&daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"]).unwrap(),
            "1",
            "a whole number reads as an integer"
        );
        assert!(client.bootstrap_manifests("10.5.0.3").await.unwrap().is_empty(), "a worker renders none");
    };
    tokio::time::timeout(Duration::from_secs(30), run).await.expect("the test's own bound");
}

/// Issue 53 item 12: the admin kubeconfig a control plane generates
/// (`MachineService.Kubeconfig`), a `.tar.gz` of one file on the wire, read by the real
/// client into the kubeconfig itself; a worker refuses it, as Talos's does.
#[tokio::test]
async fn the_admin_kubeconfig_is_read_from_a_control_plane_as_talos_serves_it() {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    let config = SimConfig::new(1, 1, v("v1.14.3"), v("v1.14.4")).with_storage(false).with_realism(Realism::oracle());
    let (sim, _served, client) = served(config);
    let run = async {
        let kubeconfig = client.admin_kubeconfig("10.5.0.2").await.unwrap(); // cp-1
        assert_eq!(kubeconfig, ichor_sim::SIM_ADMIN_KUBECONFIG.as_bytes());
        let refused = client.admin_kubeconfig("10.5.0.3").await.unwrap_err(); // worker-1
        assert!(
            matches!(&refused, TalosError::Answered { code, message } if code == "FailedPrecondition" && message.contains("control plane")),
            "{refused:?}"
        );
        assert_eq!(sim.read_world(|w| w.counters.admin_kubeconfigs), 1);
    };
    tokio::time::timeout(Duration::from_secs(30), run).await.expect("the test's own bound");
}
