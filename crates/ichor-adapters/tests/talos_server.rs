//! The Talos API in front of any `TalosApi` (here the simulated cluster), reached by the
//! real Talos client over mutual TLS: how the simulated fleet is reached by an operator
//! running as in production.

use std::sync::Arc;
use std::time::Duration;

use ichor_adapters::sim::{Realism, SimCluster, SimConfig};
use ichor_adapters::talos::{ClientOptions, TalosClient, server};
use ichor_talos_executor::talos_api::{InstallRequest, PullRequest, TalosApi, TalosError, UpgradeRequest};
use ichor_talosconfig::{Overrides, parse};
use ichor_testkit::apid::serve;
use ichor_testkit::pki::{Ca, KeyKind, Validity, talosconfig};
use ichor_upgrade_core::talos_step::MachineStage;
use ichor_upgrade_core::versions::TalosVersion;

#[tokio::test]
async fn a_simulated_cluster_answers_the_real_client_as_apid_would() {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    // Served over real sockets in wall-clock time: the oracle model, with no virtual latency.
    let config = SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4")).with_storage(false).with_realism(Realism::oracle());
    let sim = Arc::new(SimCluster::new(config));
    let ca = Ca::new(KeyKind::Ed25519);
    let cert = ca.server(&["127.0.0.1"]);
    let served = serve(&cert.cert_pem, &cert.key_pem, &ca.cert_pem, server::services(Arc::clone(&sim)));
    let admin = ca.admin(Validity::Current);
    let text = talosconfig("fleet", &[served.endpoint()], &[], &ca.cert_pem, &admin.cert_pem, &admin.talos_key_pem);
    let client = TalosClient::new(&parse(&text, &Overrides::default()).unwrap(), ClientOptions::default()).unwrap();
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
    let sim = Arc::new(SimCluster::new(config));
    let ca = Ca::new(KeyKind::Ed25519);
    let cert = ca.server(&["127.0.0.1"]);
    let served = serve(&cert.cert_pem, &cert.key_pem, &ca.cert_pem, server::services(Arc::clone(&sim)));
    let admin = ca.admin(Validity::Current);
    let text = talosconfig("fleet", &[served.endpoint()], &[], &ca.cert_pem, &admin.cert_pem, &admin.talos_key_pem);
    let client = TalosClient::new(&parse(&text, &Overrides::default()).unwrap(), ClientOptions::default()).unwrap();
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
