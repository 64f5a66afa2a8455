//! The real talosctl (built from the Talos project's Go module, `scripts/talosctl.sh`)
//! against Ichor's Talos API stand-in over mutual TLS: `talosctl gen config` writes the
//! talosconfig and the OS CA that Ichor's client and the stand-in use (no hand-made PKI
//! here), and talosctl's own calls must be answered as Talos answers them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use ichor_adapters::talos::{ClientOptions, TalosClient, server};
use ichor_executor::talos_api::TalosApi;
use ichor_sim::{Realism, SimCluster, SimConfig};
use ichor_talosconfig::{Overrides, parse};
use ichor_testkit::apid::{Served, serve};
use ichor_testkit::pki::Ca;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::versions::TalosVersion;

/// The variable naming the talosctl binary the tests run.
const TALOSCTL_VAR: &str = "ICHOR_TEST_TALOSCTL";

/// A control plane and a worker of the simulated cluster (it numbers from 10.5.0.2).
const CONTROL_PLANE: &str = "10.5.0.2";
const WORKER: &str = "10.5.0.5";
const OTHER_WORKER: &str = "10.5.0.6";
const IMAGE: &str =
    "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";

fn talosctl() -> PathBuf {
    match std::env::var_os(TALOSCTL_VAR) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "this test needs talosctl: {TALOSCTL_VAR}=<path> is not set (build it with `bash scripts/talosctl.sh build`, \
             then `bash scripts/talosctl.sh env` prints the line; `bash .ci/run` does it all)"
        ),
    }
}

/// Runs talosctl with `args`, bounded (its output read as it comes, so that a chatty run
/// never blocks on a full pipe), and returns what it printed.
fn run(args: &[&str]) -> Output {
    let child = Command::new(talosctl())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("talosctl starts");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()).ok());
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(output) => output.expect("talosctl's output"),
        Err(_) => {
            Command::new("kill").args(["-KILL", &pid.to_string()]).status().ok();
            let output = rx.recv().expect("talosctl ended").expect("its output");
            panic!(
                "talosctl {args:?} did not end within 60 s:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

fn ok(args: &[&str]) -> String {
    let output = run(args);
    assert!(
        output.status.success(),
        "talosctl {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The OS CA `talosctl gen config` wrote into the control plane's machine configuration.
fn os_ca(dir: &Path) -> Ca {
    #[derive(serde::Deserialize)]
    struct Config {
        machine: Machine,
    }
    #[derive(serde::Deserialize)]
    struct Machine {
        ca: Pair,
    }
    #[derive(serde::Deserialize)]
    struct Pair {
        crt: String,
        key: String,
    }
    use base64::Engine;
    let text = std::fs::read_to_string(dir.join("controlplane.yaml")).expect("controlplane.yaml");
    // The machine configuration is the first document.
    let first = text.split("\n---").next().unwrap_or_default();
    let config: Config = serde_saphyr::from_str(first).expect("a machine configuration");
    let decode = |b64: &str| {
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).expect("base64")).expect("PEM")
    };
    Ca::from_pem(&decode(&config.machine.ca.crt), &decode(&config.machine.ca.key))
}

/// The simulated cluster behind the stand-in, served with a certificate of the generated
/// OS CA, which also verifies its clients (as apid does).
struct Scene {
    dir: tempfile::TempDir,
    sim: Arc<SimCluster>,
    served: Served,
}

impl Scene {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_str().unwrap();
        ok(&["gen", "config", "demo", "https://127.0.0.1:6443", "--output-dir", out, "--with-docs=false"]);
        let ca = os_ca(dir.path());
        let cert = ca.server(&["127.0.0.1"]);
        let v = |t: &str| TalosVersion::parse(t).unwrap();
        let config =
            SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4")).with_storage(false).with_realism(Realism::oracle());
        let sim = Arc::new(SimCluster::new(config));
        let served = serve(&cert.cert_pem, &cert.key_pem, &ca.cert_pem, server::services(Arc::clone(&sim)));
        Self { dir, sim, served }
    }

    fn talosconfig(&self) -> String {
        self.dir.path().join("talosconfig").to_str().unwrap().to_owned()
    }

    /// talosctl with the generated talosconfig, the stand-in as its endpoint, on `node`.
    fn talosctl(&self, node: &str, args: &[&str]) -> Output {
        let (config, endpoint) = (self.talosconfig(), self.served.endpoint());
        let mut all = vec!["--talosconfig", &config, "--endpoints", &endpoint, "--nodes", node];
        all.extend_from_slice(args);
        run(&all)
    }

    /// What talosctl printed, its progress (on stderr) after its output.
    fn talosctl_ok(&self, node: &str, args: &[&str]) -> String {
        let output = self.talosctl(node, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "talosctl {args:?} on {node}: {}\n{stderr}", output.status);
        format!("{}{stderr}", String::from_utf8_lossy(&output.stdout))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs talosctl: ICHOR_TEST_TALOSCTL (bash scripts/talosctl.sh build)"]
async fn ichors_client_uses_the_talosconfig_talosctl_generated() {
    let scene = tokio::task::spawn_blocking(Scene::new).await.unwrap();
    let text = std::fs::read_to_string(scene.talosconfig()).unwrap();
    let overrides = Overrides { endpoints: vec![scene.served.endpoint()], ..Overrides::default() };
    let context = parse(&text, &overrides).expect("Ichor reads talosctl's talosconfig");
    let client = TalosClient::new(&context, ClientOptions::default()).expect("a client from it");
    let run = async {
        assert_eq!(client.nodename(WORKER).await.unwrap(), "worker-1");
        assert_eq!(client.version(WORKER).await.unwrap(), "v1.14.3");
        assert_eq!(client.machine_stage(WORKER).await.unwrap(), MachineStage::Running);
    };
    tokio::time::timeout(Duration::from_secs(30), run).await.expect("the test's own bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs talosctl: ICHOR_TEST_TALOSCTL (bash scripts/talosctl.sh build)"]
async fn talosctl_is_answered_by_the_stand_in_as_by_talos() {
    let scene = Arc::new(tokio::task::spawn_blocking(Scene::new).await.unwrap());
    let s = Arc::clone(&scene);
    tokio::task::spawn_blocking(move || {
        // version: the server's tag, under the node's hostname.
        let version = s.talosctl_ok(WORKER, &["version"]);
        assert!(version.contains("Tag:") && version.contains("v1.14.3"), "{version}");
        // etcd members: the three control planes, as the node sees them.
        let members = s.talosctl_ok(CONTROL_PLANE, &["etcd", "members"]);
        for cp in ["cp-1", "cp-2", "cp-3"] {
            assert!(members.contains(cp), "{cp} in:\n{members}");
        }
        // etcd snapshot: the whole stream, into a file.
        let db = s.dir.path().join("etcd.snapshot");
        let out = s.talosctl_ok(CONTROL_PLANE, &["etcd", "snapshot", db.to_str().unwrap()]);
        let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
        assert!(size > 0, "a snapshot written: {out}");
        // image pull: into the CRI namespace (talosctl's default), and into the system one,
        // where the installer is pulled (what Ichor's pre-pull does); the list shows it.
        s.talosctl_ok(WORKER, &["image", "pull", IMAGE]);
        s.talosctl_ok(WORKER, &["image", "pull", "--namespace", "system", IMAGE]);
        let images = s.talosctl_ok(WORKER, &["image", "list", "--namespace", "system"]);
        assert!(images.contains("metal-installer"), "{images}");
        // upgrade, as talosctl 1.14 makes it: the installer pulled, LifecycleService's
        // install streamed to its exit code, then the reboot (its drain needs a Kubernetes
        // API, which the stand-in does not serve: left out), not waited for.
        let out = s.talosctl_ok(WORKER, &["upgrade", "--image", IMAGE, "--drain=false", "--wait=false"]);
        assert!(out.contains("upgrade successful"), "{out}");
        // The legacy MachineService.Upgrade, on the other worker.
        // (--drain, on by default, would make it wait, on events the stand-in does not serve.)
        s.talosctl_ok(OTHER_WORKER, &["upgrade", "--legacy", "--image", IMAGE, "--drain=false", "--wait=false"]);
    })
    .await
    .unwrap();
    // The stand-in took both as Talos would: the first rebooting into its new slot, the
    // other upgrading.
    let rebooting = scene.sim.machine_stage(WORKER).await;
    assert!(rebooting.as_ref().is_err_and(ichor_executor::TalosError::is_unreachable), "{rebooting:?}");
    let (installs, reboots) = scene.sim.read_world(|w| (w.counters.install_calls, w.counters.reboot_calls));
    assert_eq!((installs, reboots), (1, 1));
    assert_eq!(scene.sim.machine_stage(OTHER_WORKER).await.unwrap(), MachineStage::Upgrading);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs talosctl: ICHOR_TEST_TALOSCTL (bash scripts/talosctl.sh build)"]
async fn talosctl_apply_config_is_answered_by_the_stand_in_as_by_talos() {
    let scene = Arc::new(tokio::task::spawn_blocking(Scene::new).await.unwrap());
    // The worker's own configuration (the simulated cluster runs Kubernetes 1.34.1), its
    // kubelet moved on a minor.
    let text = String::from_utf8(scene.sim.machine_config(WORKER).await.unwrap()).unwrap();
    let changed = text.replace("kubelet:v1.34.1", "kubelet:v1.35.0");
    assert_ne!(changed, text, "{text}");
    let file = scene.dir.path().join("worker-1.yaml");
    std::fs::write(&file, &changed).unwrap();
    let untagged = scene.dir.path().join("untagged.yaml");
    std::fs::write(&untagged, changed.replace(":v1.35.0", "")).unwrap();
    let s = Arc::clone(&scene);
    let applies = move || s.sim.read_world(|w| w.node("worker-1").unwrap().kube.applies.clone());
    let s = Arc::clone(&scene);
    tokio::task::spawn_blocking(move || {
        let (file, untagged) = (file.to_str().unwrap(), untagged.to_str().unwrap());
        // A dry run: the node's account of the change (talosctl prints mode_details);
        // nothing applied.
        let out = s.talosctl_ok(WORKER, &["apply-config", "--dry-run", "--mode", "no-reboot", "--file", file]);
        assert!(out.contains("kubelet: image ghcr.io/siderolabs/kubelet:v1.35.0"), "{out}");
        assert!(applies().is_empty(), "a dry run applies nothing");
        // The apply, in talosctl's default mode (AUTO), which the node takes with no reboot.
        let out = s.talosctl_ok(WORKER, &["apply-config", "--file", file]);
        assert!(out.contains("kubelet:v1.35.0"), "{out}");
        assert_eq!(applies(), vec![Component::Kubelet]);
        // A configuration the node refuses: talosctl reports the node's InvalidArgument.
        let refused = s.talosctl(WORKER, &["apply-config", "--mode", "no-reboot", "--file", untagged]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{stderr}");
        assert!(stderr.contains("InvalidArgument") && stderr.contains("no version tag"), "{stderr}");
        assert_eq!(applies(), vec![Component::Kubelet], "nothing more applied");
    })
    .await
    .unwrap();
    assert_eq!(scene.sim.machine_config(WORKER).await.unwrap(), changed.into_bytes(), "the node holds it");
}

/// Issue 53 item 12: `talosctl kubeconfig` (which unpacks the node's `.tar.gz` as Talos
/// sends it) reads the stand-in's admin kubeconfig, so the archive Ichor's client unpacks
/// and its server writes is the one Talos's tool expects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs talosctl: ICHOR_TEST_TALOSCTL (bash scripts/talosctl.sh build)"]
async fn talosctl_kubeconfig_reads_the_admin_kubeconfig_the_stand_in_serves() {
    use base64::Engine;
    let scene = Arc::new(tokio::task::spawn_blocking(Scene::new).await.unwrap());
    // An admin kubeconfig in the structure Talos generates (talosctl checks it: PEM
    // certificates, a key that matches), from a CA of its own.
    let ca = Ca::new(ichor_testkit::pki::KeyKind::Ed25519);
    let admin = ca.admin(ichor_testkit::pki::Validity::Current);
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    server: https://127.0.0.1:6443\n    \
         certificate-authority-data: {}\nusers:\n- name: admin@demo\n  user:\n    client-certificate-data: {}\n    \
         client-key-data: {}\ncontexts:\n- name: admin@demo\n  context:\n    cluster: demo\n    namespace: default\n    \
         user: admin@demo\ncurrent-context: admin@demo\n",
        b64(&ca.cert_pem),
        b64(&admin.cert_pem),
        b64(&admin.key_pem)
    );
    scene.sim.with_world(|w| w.admin_kubeconfig.clone_from(&kubeconfig));
    let s = Arc::clone(&scene);
    let client_key = b64(&admin.key_pem);
    tokio::task::spawn_blocking(move || {
        let out = s.dir.path().join("admin.kubeconfig");
        s.talosctl_ok(CONTROL_PLANE, &["kubeconfig", "--force", out.to_str().unwrap()]);
        let written = std::fs::read_to_string(&out).expect("talosctl wrote the kubeconfig");
        // talosctl merges into an existing file; a new one holds the served document.
        assert!(written.contains("server: https://127.0.0.1:6443"), "{written}");
        assert!(written.contains(&client_key), "{written}");
        // A worker serves none: talosctl reports the node's refusal.
        let refused = s.talosctl(WORKER, &["kubeconfig", "--force", out.to_str().unwrap()]);
        assert!(!refused.status.success(), "{}", String::from_utf8_lossy(&refused.stderr));
    })
    .await
    .unwrap();
    assert_eq!(scene.sim.read_world(|w| w.counters.admin_kubeconfigs), 1);
}
