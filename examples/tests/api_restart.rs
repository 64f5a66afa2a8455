//! The API server restarted in the middle of a rollout, as it is on Talos with every
//! control-plane reboot: on a server of the test's own (`scripts/kube-test-server.sh
//! start`, then `restart-apiserver`, so that the shared server's other tests go on), the
//! operator and its simulated fleet of 3 + 5 go on once it is back, with no machine called
//! twice and never two control planes down. How long after the server was ready again the
//! operator's next write came is measured and printed, not asserted (a wall-clock bound).
//! Measured here: 31, 52 and 116 s with kube-rs's default backoffs (the controller backs
//! its merged trigger stream off once more, up to 45 s, on every watch's 410 and 503);
//! 9.3 and 9.9 s with the engine's watch backoff (2 s at most) on both: every watch's 410
//! Gone, one after another, held all the controller's triggers 2 s each. With a 410
//! relisting at once and no watch error reaching the controller (`engine_watcher`,
//! `without_errors`): 4.5, 4.7 s (every watch caught up 2.9 s after /readyz, the last
//! held by the server's "storage is (re)initializing" 429; the rest is the fleet's own
//! pace: the next write is the next thing to do).
//! `ICHOR_TEST_RUST_LOG=info,kube_runtime=debug` shows the backoffs in the process's log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::operator_e2e::{Scene, all_on_target, upgrade_calls};
use crate::support::eventually;
use ichor_adapters::kubernetes::crd::TalosMachine;
use kube::api::{Api, ListParams};

/// A Kubernetes test server of the test's own, stopped (by PID) when dropped.
pub(crate) struct OwnServer {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/kube-test-server.sh")
}

impl OwnServer {
    /// A control plane of its own (etcd, the API server, the controller manager), stopped
    /// when dropped.
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new("bash").arg(script()).arg("start").arg(dir.path()).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "start: {}", String::from_utf8_lossy(&output.stderr));
        let line = stdout.lines().find_map(|l| l.strip_prefix("ICHOR_TEST_KUBECONFIG=")).expect("the kubeconfig line");
        Self { kubeconfig: PathBuf::from(line), dir }
    }

    /// Stops the API server, keeps it down `down`, starts it again: when it was ready
    /// again (Unix milliseconds).
    fn restart_apiserver(&self, down: Duration) -> i64 {
        let output = Command::new("bash")
            .arg(script())
            .arg("restart-apiserver")
            .arg(self.dir.path())
            .arg(down.as_secs().to_string())
            .output()
            .unwrap();
        assert!(output.status.success(), "restart: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().parse().expect("the ready time")
    }

    pub(crate) fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).arg("stop").arg(self.dir.path()).output();
    }
}

fn now_ms() -> i64 {
    i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The machines' resourceVersions, to tell when any was written.
async fn versions(machines: &Api<TalosMachine>) -> Option<Vec<String>> {
    let list = machines.list(&ListParams::default()).await.ok()?;
    Some(list.items.into_iter().map(|m| m.metadata.resource_version.unwrap_or_default()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Kubernetes test server's binaries: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn after_an_api_server_restart_mid_rollout_the_rollout_goes_on_with_no_repeated_call() {
    // The shared server is the sign that the binaries are built and cached.
    let _ = ichor_testkit::kube::kubeconfig();
    let server = OwnServer::start();
    let scene = Scene::on(server.kubeconfig(), "e2e-restart").await;
    let both = scene.fleet("3+5", &[]);
    scene.fleet_up(8).await;
    scene.create_operation("upgrade", "talos", None).await;
    let converged = |n: usize| {
        let scene = &scene;
        async move {
            let status = scene.operation("upgrade").await.and_then(|o| o.status).unwrap_or_default();
            status.machines.is_some_and(|m| m.converged >= i64::try_from(n).unwrap())
        }
    };
    // Mid-rollout: the control planes done, the workers under way.
    eventually("three machines converged", || converged(3)).await;
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let ready = server.restart_apiserver(Duration::from_secs(3));
    // The first write seen after the server is back (the test's own client backs off too:
    // its first read may come a moment after the server's return).
    let mut before = None;
    while before.is_none() {
        before = versions(&machines).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_read = now_ms() - ready;
    let mut resumed = None;
    for _ in 0..3600 {
        if let Some(now) = versions(&machines).await
            && Some(&now) != before.as_ref()
        {
            resumed = Some(now_ms() - ready);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resumed = resumed.expect("a machine written within three minutes of the API server's return");
    eprintln!(
        "the operator wrote again {resumed} ms after the API server was ready again (the test's first read: \
         {first_read} ms)"
    );
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    assert!(all_on_target(&scene.fleet_nodes().await));
    let calls = upgrade_calls(&both).await;
    assert_eq!(calls.len(), 8, "{calls:?}");
    assert!(calls.iter().all(|(_, n)| *n == 1.0), "one Upgrade call per machine across the restart: {calls:?}");
    assert_eq!(both.value("ichor_fleet_max_control_planes_down").await, Some(1.0));
    drop(both);
    scene.end().await;
}
