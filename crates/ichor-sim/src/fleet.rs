//! A simulated Talos fleet on a real Kubernetes API server, for trying the operator on any
//! cluster (kind, k3d) with no Talos machine, and for the end-to-end tests.
//!
//! In one namespace it creates (when absent) a `TalosCluster` named `demo` at
//! [`TARGET`], its `TalosMachine`s (`demo-cp-1..`, `demo-worker-1..`) and a Secret with a
//! talosconfig; it publishes a Node per machine and keeps each Node's status (`osImage`,
//! `bootID`, `Ready`) and Lease as a kubelet would; it acts as the kubelet of the pods bound
//! to those Nodes (they run at once; a pod being deleted is gone at once); and it answers
//! the Talos API (apid over mutual TLS on a loopback port) from the simulator
//! ([`crate`]). The simulator's virtual durations (install, reboot, Ready)
//! are divided by the time scale.
//!
//! With [`FleetConfig::kwok`], kwok is the kubelet instead: the fleet labels its Nodes
//! [`KWOK_LABEL`], says whether each machine's kubelet runs with the annotation
//! [`KUBELET_ANNOTATION`] (`running`, `stopped` while it reboots), and writes the Nodes'
//! `nodeInfo` (`osImage`, `bootID`) as the machines report them; kwok, started with the
//! stages in `scripts/kube-server/kwok-stages.yaml`, turns that into the `Ready` condition,
//! renews the Leases, and runs and deletes the pods a scheduler binds to the Nodes.
//!
//! What it must not do: stand in front of real machines, or touch any Node it did not
//! create. Its Nodes are named `<machine>.<namespace>` (Nodes are cluster-wide), carry the
//! label [`FLEET_LABEL`] with the namespace and a `NoSchedule` taint so that no real
//! workload lands on them, and use addresses in 127.1.0.0/16, which route nowhere but
//! loopback. The fleet's state lives in its process: a fleet restarted in the same
//! namespace is a new cluster behind old objects (start it in a fresh namespace).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::world::NodePhase;
use crate::{Naming, Realism, SimCluster, SimConfig};
use async_trait::async_trait;
use futures::StreamExt;
use ichor_adapters::kubernetes::crd::{Role, TalosCluster, TalosClusterSpec, TalosMachine, TalosMachineSpec};
use ichor_adapters::talos::server;
use ichor_executor::talos_api::{EtcdAlarm, EtcdMember, EtcdStatus, ImageInfo, SnapshotStream, TalosApi, TalosError};
use ichor_executor::writes::{Seal, TalosWrite, TalosWritten};
use ichor_testkit::apid::{Served, serve};
use ichor_testkit::pki::{Ca, KeyKind, Validity, talosconfig};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::versions::TalosVersion;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Pod, Secret, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use serde_json::json;

/// The cluster's name.
pub const CLUSTER: &str = "demo";
/// The version the fleet's machines run at the start.
pub const FROM: &str = "v1.14.2";
/// The cluster's `talosVersion`: the release set's, the only target.
pub const TARGET: &str = "v1.14.3";
/// The cluster's Kubernetes version.
pub const KUBERNETES: &str = "1.34.1";
/// The label on the fleet's Nodes, with its namespace.
pub const FLEET_LABEL: &str = ichor_testkit::kube::FLEET_LABEL;
/// The taint on the fleet's Nodes.
pub const TAINT: &str = "ichor.dev/simulated";
/// The label kwok manages Nodes by (`kwok --manage-nodes-with-label-selector`).
pub const KWOK_LABEL: &str = "ichor.dev/kwok";
/// The annotation that tells kwok whether a machine's kubelet runs: `running` or `stopped`.
pub const KUBELET_ANNOTATION: &str = "ichor.dev/kubelet";
/// The most machines a fleet has: its addresses are in 127.1.0.0/16, and a fleet this
/// size is already more than one process publishes at a kubelet's pace.
pub const MAX_MACHINES: usize = 10_000;
/// How long a kwok-backed fleet waits for kwok to make its first Node Ready.
const KWOK_TIMEOUT: Duration = Duration::from_secs(60);
/// How many of the fleet's writes are in flight at once while it creates its objects.
const CREATE_CONCURRENCY: usize = 16;
/// The field manager of the fleet's writes.
const FIELD_MANAGER: &str = "ichor-fleet";
/// How often the fleet moves the simulation on and publishes what changed.
const TICK: Duration = Duration::from_millis(100);
/// How often a running node's kubelet renews its Lease (the kubelet's default).
const HEARTBEAT: Duration = Duration::from_secs(10);

/// A fleet's shape and pace.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The namespace of its objects.
    pub namespace: String,
    /// Control planes.
    pub control_planes: usize,
    /// Workers.
    pub workers: usize,
    /// Virtual seconds per wall-clock second.
    pub time_scale: f64,
    /// The simulation's seed (drawn durations).
    pub seed: u64,
    /// kwok is the kubelet of the fleet's Nodes (see the module's doc), not the fleet.
    pub kwok: bool,
    /// Whether it creates a TalosMachine per machine. Without them (`--no-machines`) it
    /// publishes the Nodes and the Talos API only, as a cluster whose machines the
    /// operator has not been told about.
    pub machines: bool,
    /// The admin kubeconfig its control planes' Talos API gives (`talosctl kubeconfig`),
    /// as a real cluster's gives its own: the identity a Kubernetes upgrade's bootstrap
    /// manifests are applied under. Without it, a stand-in no API server accepts (the
    /// manifests step then pauses, naming the refusal).
    pub admin_kubeconfig: Option<String>,
    /// The Talos version its machines run at start ([`FROM`] by default): an older one
    /// makes a fleet two minor lines behind the cluster's [`TARGET`].
    pub from: String,
}

/// `3+5`: control planes and workers.
///
/// # Errors
/// What is wrong with the text.
pub fn parse_shape(text: &str) -> Result<(usize, usize), String> {
    let (cp, workers) =
        text.split_once('+').ok_or_else(|| format!("expected CONTROL_PLANES+WORKERS such as 3+5, got {text:?}"))?;
    let number = |what: &str, s: &str| {
        s.trim().parse::<usize>().map_err(|_| format!("{what} in {text:?} is not a whole number: {s:?}"))
    };
    let (cp, workers) = (number("the control-plane count", cp)?, number("the worker count", workers)?);
    if cp == 0 {
        return Err(format!("a cluster needs a control plane: {text:?}"));
    }
    if cp + workers > MAX_MACHINES {
        return Err(format!("at most {MAX_MACHINES} machines in a simulated fleet: {text:?}"));
    }
    Ok((cp, workers))
}

/// The fleet's failure to start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// An object could not be written.
    #[error("writing {what}: {source}")]
    Write {
        /// Which.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// No kwok made the fleet's Nodes Ready.
    #[error(
        "no kwok manages this API server's Nodes labelled {KWOK_LABEL}=true: Node {node} is not Ready {}s after it was created (start kwok with --manage-nodes-with-label-selector={KWOK_LABEL}=true --config scripts/kube-server/kwok-stages.yaml, as scripts/kube-test-server.sh start does, or run the fleet without --kwok)",
        KWOK_TIMEOUT.as_secs()
    )]
    NoKwok {
        /// The Node that stayed not Ready.
        node: String,
    },
}

/// Counts the Upgrade calls the fleet receives, by node address, whatever their answer.
#[derive(Debug)]
pub struct Counting {
    sim: Arc<SimCluster>,
    upgrades: Mutex<BTreeMap<String, u64>>,
    calls: AtomicU64,
}

#[async_trait]
impl TalosApi for Counting {
    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.nodename(node).await
    }
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.machine_stage(node).await
    }
    async fn write(&self, node: &str, write: TalosWrite<'_>, _seal: Seal) -> Result<TalosWritten, TalosError> {
        self.counted(node, write).await
    }
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.etcd_members(node).await
    }
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.etcd_status(node).await
    }
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.etcd_alarms(node).await
    }
    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.etcd_snapshot(node).await
    }
    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.image_list(node).await
    }
    async fn install_running(&self, node: &str) -> Result<Option<bool>, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.install_running(node).await
    }
    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.boot_id(node).await
    }
    async fn machine_config(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.machine_config(node).await
    }
    async fn bootstrap_manifests(&self, node: &str) -> Result<Vec<serde_json::Value>, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.bootstrap_manifests(node).await
    }
    async fn admin_kubeconfig(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sim.admin_kubeconfig(node).await
    }
}

/// The fleet's apid stand-in serves the writes of its peer (the operator) through here.
#[async_trait]
impl server::Served for Counting {
    async fn serve(&self, node: &str, write: TalosWrite<'_>) -> Result<TalosWritten, TalosError> {
        self.counted(node, write).await
    }
}

impl Counting {
    /// A write, counted as a call; an Upgrade also by node, and logged, as an
    /// ApplyConfiguration is.
    async fn counted(&self, node: &str, write: TalosWrite<'_>) -> Result<TalosWritten, TalosError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        match write {
            TalosWrite::Upgrade(request) => {
                *self.upgrades.lock().unwrap_or_else(PoisonError::into_inner).entry(node.to_owned()).or_default() += 1;
                let result = self.sim.serve(node, write).await;
                tracing::info!(node, image = %request.image, acknowledged = result.is_ok(), "fleet: Upgrade call");
                result
            }
            TalosWrite::ApplyConfiguration(request) => {
                let result = self.sim.serve(node, write).await;
                tracing::info!(node, dry_run = request.dry_run, applied = result.is_ok(), "fleet: ApplyConfiguration");
                result
            }
            TalosWrite::Install { .. }
            | TalosWrite::Reboot
            | TalosWrite::EtcdLeaveCluster
            | TalosWrite::EtcdRemoveMember { .. }
            | TalosWrite::Reset(_)
            | TalosWrite::ImagePull(_) => self.sim.serve(node, write).await,
        }
    }
}

/// A running fleet: the simulation, its Talos API and what it received.
pub struct Fleet {
    config: FleetConfig,
    sim: Arc<SimCluster>,
    talos: Arc<Counting>,
    served: Served,
    ca: Ca,
    started: Instant,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("config", &self.config).field("apid", &self.served.addr).finish_non_exhaustive()
    }
}

/// What a node looks like to Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    ready: bool,
    boot_id: String,
    os_image: String,
    /// Its kubelet's version (`1.35.0`).
    kubelet_version: String,
    /// On a control plane, its static pods: the component, its version, Ready, crash-looping.
    static_pods: Vec<(&'static str, String, bool, bool)>,
}

impl Fleet {
    /// A fleet as configured, its Talos API served on a loopback port.
    ///
    /// # Panics
    /// When the fleet's versions do not parse (`from` is checked by the example's parser)
    /// or no loopback port is free.
    #[must_use]
    pub fn new(config: FleetConfig) -> Self {
        let version = |v: &str| TalosVersion::parse(v).expect("the fleet's versions parse");
        let sim_config = SimConfig::new(config.control_planes, config.workers, version(&config.from), version(TARGET))
            .with_seed(config.seed)
            // Driven in scaled wall-clock time by the fleet itself, behind a real apid and a
            // real API server: the latencies are real ones, none is simulated.
            .with_realism(Realism::oracle())
            .with_storage(false)
            .with_kubernetes(KUBERNETES)
            .with_naming(Naming {
                prefix: format!("{CLUSTER}-"),
                suffix: format!(".{}", config.namespace),
                address_base: std::net::Ipv4Addr::new(127, 1, 0, 0),
            });
        let sim = Arc::new(SimCluster::new(sim_config));
        if let Some(kubeconfig) = &config.admin_kubeconfig {
            sim.with_world(|w| w.admin_kubeconfig.clone_from(kubeconfig));
        }
        let talos = Arc::new(Counting { sim: Arc::clone(&sim), upgrades: Mutex::default(), calls: AtomicU64::new(0) });
        let ca = Ca::new(KeyKind::Ed25519);
        let cert = ca.server(&["127.0.0.1", "localhost"]);
        let served = serve(&cert.cert_pem, &cert.key_pem, &ca.cert_pem, server::services(Arc::clone(&talos)));
        Self { config, sim, talos, served, ca, started: Instant::now() }
    }

    /// The Talos API's endpoint, `127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        self.served.endpoint()
    }

    /// The simulation.
    #[must_use]
    pub fn sim(&self) -> &Arc<SimCluster> {
        &self.sim
    }

    /// The metrics of the fleet: Upgrade calls by node, nodes by version, the invariants'
    /// worst values.
    #[must_use]
    pub fn collector(&self) -> FleetMetrics {
        FleetMetrics { sim: Arc::clone(&self.sim), talos: Arc::clone(&self.talos) }
    }

    /// The machine name of a node of the fleet (`demo-cp-1` for `demo-cp-1.<namespace>`).
    fn machine_name<'a>(&self, node: &'a str) -> &'a str {
        node.strip_suffix(&format!(".{}", self.config.namespace)).unwrap_or(node)
    }

    /// Creates the fleet's objects (those that exist are left as they are, but for the
    /// Secret, which names this process's Talos API), then keeps the Nodes and the pods on
    /// them as kubelets would (or tells kwok what to show, with [`FleetConfig::kwok`])
    /// until `shutdown`; then deletes its Nodes.
    ///
    /// # Errors
    /// A [`FleetError`] when the objects cannot be created, or when kwok was asked for and
    /// does not make the Nodes Ready.
    pub async fn run(
        self,
        client: Client,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), FleetError> {
        let virtual_start = self.sim.now();
        let mut published: HashMap<String, Published> = HashMap::new();
        let initial = self.views(virtual_start);
        self.create_objects(&client, &initial).await?;
        let names: Vec<String> = initial.iter().map(|(name, _, _)| name.clone()).collect();
        if self.config.kwok {
            // Created running, with their nodeInfo: kwok makes them Ready.
            published.extend(initial.into_iter().map(|(name, _, view)| (name, view)));
            await_kwok(&client, &names).await?;
        }
        tracing::info!(
            namespace = %self.config.namespace,
            cluster = CLUSTER,
            machines = self.config.control_planes + self.config.workers,
            from = %self.config.from,
            target = TARGET,
            time_scale = self.config.time_scale,
            kubelet = if self.config.kwok { "kwok" } else { "the fleet" },
            apid = %self.endpoint(),
            "simulated fleet up"
        );
        let kubelet = (!self.config.kwok).then(|| tokio::spawn(kubelet(client.clone(), names.clone())));
        let mut mirrored: HashMap<String, Vec<(&'static str, String, bool, bool)>> = HashMap::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut beat: Option<Instant> = None;
        let mut proxy_beat: Option<Instant> = None;
        loop {
            let elapsed = self.started.elapsed().as_secs_f64() * self.config.time_scale;
            let views = self.views(virtual_start.saturating_add(Duration::from_secs_f64(elapsed)));
            let changed: Vec<(String, Option<Published>, Published)> = views
                .iter()
                .filter(|(name, _, view)| published.get(name) != Some(view))
                .map(|(name, _, view)| (name.clone(), published.get(name).cloned(), view.clone()))
                .collect();
            let kwok = self.config.kwok;
            let results: Vec<(String, Published, Result<(), kube::Error>)> = futures::stream::iter(changed)
                .map(|(name, before, view)| {
                    let client = client.clone();
                    async move {
                        let result = if kwok {
                            publish_to_kwok(&client, &name, before.as_ref(), &view).await
                        } else {
                            publish_status(&client, &name, &view).await
                        };
                        (name, view, result)
                    }
                })
                .buffer_unordered(CREATE_CONCURRENCY)
                .collect()
                .await;
            for (name, view, result) in results {
                match result {
                    Ok(()) => {
                        tracing::info!(node = %name, ready = view.ready, os_image = %view.os_image, boot_id = %view.boot_id, "fleet: Node status");
                        published.insert(name, view);
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        // Deleted (a removal): a powered-off machine does not register again.
                        published.insert(name, view);
                    }
                    Err(e) => tracing::warn!(node = %name, error = %e, "fleet: Node status not written"),
                }
            }
            // The control planes' static pods, as their kubelets' mirror pods show them.
            for (name, _, view) in &views {
                if view.static_pods.is_empty() || mirrored.get(name) == Some(&view.static_pods) {
                    continue;
                }
                let before = mirrored.get(name).map(Vec::as_slice).unwrap_or_default();
                match publish_static_pods(&client, name, &self.config.namespace, before, &view.static_pods).await {
                    Ok(()) => {
                        mirrored.insert(name.clone(), view.static_pods.clone());
                    }
                    Err(e) => tracing::warn!(node = %name, error = %e, "fleet: mirror pods not written"),
                }
            }
            // The API server has no DaemonSet controller here: kube-proxy's DaemonSet (applied
            // by a Kubernetes upgrade's bootstrap manifests) rolls out on the fleet's nodes.
            if proxy_beat.is_none_or(|b: Instant| b.elapsed() >= PROXY_ROLLOUT) {
                proxy_beat = Some(Instant::now());
                let up = views.iter().filter(|(_, up, _)| *up).count();
                if let Err(e) = roll_out_kube_proxy(&client, up).await {
                    tracing::debug!(error = %e, "fleet: kube-proxy's rollout not written");
                }
            }
            if !self.config.kwok && beat.is_none_or(|b| b.elapsed() >= HEARTBEAT) {
                beat = Some(Instant::now());
                for (name, up, _) in &views {
                    if *up && let Err(e) = heartbeat(&client, name).await {
                        tracing::debug!(node = %name, error = %e, "fleet: node Lease not renewed");
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                () = &mut shutdown => break,
            }
        }
        if let Some(kubelet) = kubelet {
            kubelet.abort();
        }
        let mirrors: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
        let mine = ListParams::default().labels(&format!("{FLEET_LABEL}={}", self.config.namespace));
        if let Err(e) = mirrors.delete_collection(&DeleteParams::default(), &mine).await {
            tracing::warn!(error = %e, "fleet: mirror pods not deleted");
        }
        let nodes: Api<Node> = Api::all(client.clone());
        futures::stream::iter(names)
            .for_each_concurrent(CREATE_CONCURRENCY, |name| {
                let nodes = nodes.clone();
                async move {
                    nodes.delete(&name, &DeleteParams::default()).await.ok();
                }
            })
            .await;
        tracing::info!(namespace = %self.config.namespace, "simulated fleet stopped; its Nodes deleted");
        Ok(())
    }

    /// Each node as Kubernetes should see it at `now` (the simulation moved on to it):
    /// its name, whether the machine is up, and its Node's view.
    fn views(&self, now: ichor_upgrade_core::Timestamp) -> Vec<(String, bool, Published)> {
        self.sim.with_world(|w| {
            if now > w.now {
                w.advance_to(now);
            }
            w.nodes
                .iter()
                .map(|n| {
                    let up = matches!(
                        n.phase,
                        NodePhase::Running | NodePhase::Installing { .. } | NodePhase::Booting { .. }
                    );
                    let static_pods = n
                        .kube
                        .pods
                        .iter()
                        .map(|(c, p)| (c.as_str(), p.version.to_string(), p.ready && up, p.crash_looping))
                        .collect();
                    let view = Published {
                        ready: n.ready && up,
                        boot_id: n.boot_id.clone(),
                        os_image: n.version.os_image(),
                        kubelet_version: n.kube.kubelet.to_string(),
                        static_pods,
                    };
                    (n.name.clone(), up, view)
                })
                .collect()
        })
    }

    async fn create_objects(&self, client: &Client, views: &[(String, bool, Published)]) -> Result<(), FleetError> {
        let ns = &self.config.namespace;
        let write = |what: String| move |source| FleetError::Write { what, source };
        let admin = self.ca.admin(Validity::Current);
        let text =
            talosconfig(CLUSTER, &[self.endpoint()], &[], &self.ca.cert_pem, &admin.cert_pem, &admin.talos_key_pem);
        let secret_name = format!("{CLUSTER}-talosconfig");
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": secret_name, "namespace": ns },
            "type": "Opaque",
            "stringData": { "talosconfig": text },
        });
        Api::<Secret>::namespaced(client.clone(), ns)
            .patch(&secret_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&secret))
            .await
            .map_err(write(format!("Secret {ns}/{secret_name}")))?;

        let cluster = TalosCluster::new(
            CLUSTER,
            TalosClusterSpec {
                talos_version: TARGET.to_owned(),
                kubernetes_version: KUBERNETES.to_owned(),
                platform: "metal".to_owned(),
                schematic: None,
                talosconfig_secret: secret_name,
                // Its own Nodes, not those of other fleets or clusters on the API server.
                node_selector: Some([(FLEET_LABEL.to_owned(), ns.clone())].into()),
                discovery: None,
                upgrades: None,
                releases: None,
                notifications: None,
                maintenance: None,
                gates: None,
            },
        );
        create_if_absent(&Api::namespaced(client.clone(), ns), &cluster)
            .await
            .map_err(write(format!("TalosCluster {ns}/{CLUSTER}")))?;

        let nodes = self.sim.with_world(|w| w.nodes.clone());
        let views: HashMap<String, Published> =
            views.iter().map(|(name, _, view)| (name.clone(), view.clone())).collect();
        let machines: Vec<(crate::world::SimNode, Option<Published>)> =
            nodes.into_iter().map(|n| (views.get(&n.name).cloned(), n)).map(|(v, n)| (n, v)).collect();
        let results: Vec<Result<(), FleetError>> = futures::stream::iter(machines)
            .map(|(n, view)| async move { self.create_machine(client, &n, view.as_ref()).await })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// A machine's TalosMachine and Node, the Node's addresses (and, for kwok, its
    /// `nodeInfo` and running kubelet).
    async fn create_machine(
        &self,
        client: &Client,
        n: &crate::world::SimNode,
        view: Option<&Published>,
    ) -> Result<(), FleetError> {
        let ns = &self.config.namespace;
        let write = |what: String| move |source| FleetError::Write { what, source };
        let machines: Api<TalosMachine> = Api::namespaced(client.clone(), ns);
        let machine = self.machine_name(&n.name).to_owned();
        let object = TalosMachine::new(
            &machine,
            TalosMachineSpec {
                cluster: CLUSTER.to_owned(),
                role: match n.role {
                    MachineRole::ControlPlane => Role::Controlplane,
                    MachineRole::Worker => Role::Worker,
                },
                address: n.address.clone(),
                hostname: Some(n.name.clone()),
            },
        );
        if self.config.machines {
            create_if_absent(&machines, &object).await.map_err(write(format!("TalosMachine {ns}/{machine}")))?;
        }

        let mut labels: BTreeMap<String, String> = n.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        labels.insert("kubernetes.io/hostname".to_owned(), n.name.clone());
        labels.insert("kubernetes.io/os".to_owned(), "linux".to_owned());
        labels.insert(FLEET_LABEL.to_owned(), ns.clone());
        if n.role == MachineRole::ControlPlane {
            labels.insert("node-role.kubernetes.io/control-plane".to_owned(), String::new());
        }
        let mut annotations: BTreeMap<String, String> =
            n.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        if self.config.kwok {
            labels.insert(KWOK_LABEL.to_owned(), "true".to_owned());
            let running = view.is_some_and(|v| v.ready);
            annotations.insert(KUBELET_ANNOTATION.to_owned(), kubelet_state(running).to_owned());
        }
        let node = Node {
            metadata: ObjectMeta {
                name: Some(n.name.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: TAINT.to_owned(),
                    value: Some("true".to_owned()),
                    effect: "NoSchedule".to_owned(),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            }),
            status: None,
        };
        create_if_absent(&Api::all(client.clone()), &node).await.map_err(write(format!("Node {}", n.name)))?;
        let mut status = json!({ "status": { "addresses": [
            { "type": "InternalIP", "address": n.address },
            { "type": "Hostname", "address": n.name },
        ] } });
        if let (true, Some(view)) = (self.config.kwok, view) {
            status["status"]["nodeInfo"] = json!(node_info(view));
        }
        Api::<Node>::all(client.clone())
            .patch_status(&n.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(write(format!("Node {} addresses", n.name)))?;
        Ok(())
    }
}

/// Waits until kwok has made the fleet's first and last Nodes Ready.
async fn await_kwok(client: &Client, names: &[String]) -> Result<(), FleetError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + KWOK_TIMEOUT;
    for name in [names.first(), names.last()].into_iter().flatten() {
        loop {
            let ready = nodes.get_opt(name).await.ok().flatten().is_some_and(|node| {
                node.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            if ready {
                break;
            }
            if Instant::now() >= deadline {
                return Err(FleetError::NoKwok { node: name.clone() });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

fn kubelet_state(running: bool) -> &'static str {
    if running { "running" } else { "stopped" }
}

async fn create_if_absent<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .create(&PostParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PostParams::default() }, object)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

fn now_time() -> Time {
    Time(jiff::Timestamp::now())
}

/// How long a rollout of kube-proxy's DaemonSet takes on the fleet (and how often it is
/// looked at).
const PROXY_ROLLOUT: Duration = Duration::from_secs(1);

/// `kube-system/kube-proxy`'s rollout, as the DaemonSet controller would write it once its
/// pods run the latest spec on the fleet's `nodes` up: observed, every pod updated and
/// available. Nothing when there is no such DaemonSet or it is already rolled out.
async fn roll_out_kube_proxy(client: &Client, nodes: usize) -> Result<(), kube::Error> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let Some(ds) = api.get_opt("kube-proxy").await? else { return Ok(()) };
    let generation = ds.metadata.generation.unwrap_or(0);
    if ds.status.as_ref().and_then(|s| s.observed_generation).is_some_and(|g| g >= generation) {
        return Ok(());
    }
    let n = i32::try_from(nodes).unwrap_or(i32::MAX);
    let status = serde_json::json!({"status": {
        "observedGeneration": generation, "desiredNumberScheduled": n, "currentNumberScheduled": n,
        "numberMisscheduled": 0, "numberReady": n, "updatedNumberScheduled": n, "numberAvailable": n,
    }});
    api.patch_status("kube-proxy", &PatchParams::default(), &Patch::Merge(&status)).await?;
    tracing::info!(nodes, generation, "fleet: kube-proxy rolled out");
    Ok(())
}

async fn publish_status(client: &Client, name: &str, view: &Published) -> Result<(), kube::Error> {
    let ready = NodeCondition {
        type_: "Ready".to_owned(),
        status: if view.ready { "True" } else { "False" }.to_owned(),
        reason: Some(if view.ready { "KubeletReady" } else { "KubeletNotReady" }.to_owned()),
        message: Some(
            if view.ready { "kubelet is posting ready status" } else { "the machine is rebooting" }.to_owned(),
        ),
        last_heartbeat_time: Some(now_time()),
        last_transition_time: Some(now_time()),
    };
    let info = node_info(view);
    let status = NodeStatus { conditions: Some(vec![ready]), node_info: Some(info), ..NodeStatus::default() };
    let patch = json!({ "status": status });
    Api::<Node>::all(client.clone()).patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
}

/// A control plane's static pods as its kubelet's mirror pods in `kube-system` (labelled as
/// Talos renders them, the fleet's label besides): each made, or made again when its
/// version changed (a kubelet replaces the mirror pod of a changed static pod: its
/// `kubernetes.io/config.mirror` hash cannot change), then its status (Running; Ready, or a
/// container waiting in `CrashLoopBackOff`).
async fn publish_static_pods(
    client: &Client,
    node: &str,
    namespace: &str,
    before: &[(&'static str, String, bool, bool)],
    pods: &[(&'static str, String, bool, bool)],
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    for (component, version, ready, crash_looping) in pods {
        let name = format!("{component}-{node}");
        let was = before.iter().find(|(c, ..)| c == component);
        if was.is_some_and(|(_, v, ..)| v != version) {
            let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
            match api.delete(&name, &now).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "kube-system",
                "labels": {
                    "k8s-app": component,
                    "component": component,
                    "tier": "control-plane",
                    "app.kubernetes.io/name": component,
                    "app.kubernetes.io/version": version,
                    "app.kubernetes.io/component": "control-plane",
                    "app.kubernetes.io/managed-by": "Talos",
                    FLEET_LABEL: namespace,
                },
                "annotations": { "kubernetes.io/config.mirror": format!("{component}-{version}") },
            },
            "spec": {
                "nodeName": node,
                "priorityClassName": "system-cluster-critical",
                "tolerations": [{ "operator": "Exists" }],
                "containers": [{ "name": component, "image": format!("registry.k8s.io/{component}:v{version}") }],
            },
        });
        api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&pod)).await?;
        let now = now_time();
        let ready_text = if *ready { "True" } else { "False" };
        let state = if *crash_looping {
            json!({ "waiting": { "reason": "CrashLoopBackOff", "message": "back-off restarting failed container" } })
        } else {
            json!({ "running": { "startedAt": now } })
        };
        let status = json!({ "status": {
            "phase": "Running",
            "startTime": now,
            "conditions": [
                { "type": "Ready", "status": ready_text, "lastTransitionTime": now },
                { "type": "ContainersReady", "status": ready_text, "lastTransitionTime": now },
                { "type": "PodScheduled", "status": "True", "lastTransitionTime": now },
            ],
            "containerStatuses": [{
                "name": component,
                "image": format!("registry.k8s.io/{component}:v{version}"),
                "imageID": "",
                "ready": *ready,
                "restartCount": u32::from(*crash_looping) * 5,
                "started": *ready,
                "state": state,
            }],
        } });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    }
    Ok(())
}

/// What the machine's kubelet reports of it.
fn node_info(view: &Published) -> NodeSystemInfo {
    NodeSystemInfo {
        os_image: view.os_image.clone(),
        boot_id: view.boot_id.clone(),
        machine_id: String::new(),
        system_uuid: String::new(),
        kernel_version: "6.12.0-talos".to_owned(),
        container_runtime_version: "containerd://2.1.0".to_owned(),
        kubelet_version: format!("v{}", view.kubelet_version),
        kube_proxy_version: String::new(),
        operating_system: "linux".to_owned(),
        architecture: "amd64".to_owned(),
        ..NodeSystemInfo::default()
    }
}

/// Tells kwok what a node shows, in the order a machine does: its kubelet stops, then the
/// machine comes back with a new boot (and maybe version), then its kubelet runs.
async fn publish_to_kwok(
    client: &Client,
    name: &str,
    before: Option<&Published>,
    view: &Published,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let kubelet =
        |running: bool| json!({ "metadata": { "annotations": { KUBELET_ANNOTATION: kubelet_state(running) } } });
    let was_ready = before.is_some_and(|b| b.ready);
    if !view.ready && (was_ready || before.is_none()) {
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(&kubelet(false))).await?;
    }
    if before.is_none_or(|b| {
        b.boot_id != view.boot_id || b.os_image != view.os_image || b.kubelet_version != view.kubelet_version
    }) {
        let status = json!({ "status": { "nodeInfo": node_info(view) } });
        nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    }
    if view.ready && !was_ready {
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(&kubelet(true))).await?;
    }
    Ok(())
}

/// Renews the node's Lease in `kube-node-lease`, as its kubelet does.
async fn heartbeat(client: &Client, name: &str) -> Result<(), kube::Error> {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("kube-node-lease".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    let mut value = serde_json::to_value(&lease).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".to_owned(), "coordination.k8s.io/v1".into());
        map.insert("kind".to_owned(), "Lease".into());
    }
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&value))
        .await
        .map(drop)
}

/// The kubelet of the pods bound to the fleet's nodes: a pod runs and is Ready at once; a
/// pod being deleted (an eviction) is gone at once.
async fn kubelet(client: Client, nodes: Vec<String>) {
    let pods: Api<Pod> = Api::all(client);
    let stream = watcher(pods.clone(), watcher::Config::default())
        .backoff(ichor_adapters::kubernetes::watch_backoff())
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let Ok(pod) = event else { continue };
        let on_fleet = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| nodes.contains(n));
        let (Some(namespace), name) = (pod.namespace(), pod.name_any()) else { continue };
        if !on_fleet {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(pods.clone().into_client(), &namespace);
        if pod.metadata.deletion_timestamp.is_some() {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: pod.uid(), resource_version: None }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => tracing::info!(pod = %format!("{namespace}/{name}"), "fleet: pod terminated"),
                Err(e) => tracing::debug!(pod = %name, error = %e, "fleet: pod not deleted"),
            }
            continue;
        }
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if !running {
            let now = now_time();
            let condition = |type_: &str| json!({ "type": type_, "status": "True", "lastTransitionTime": now });
            let patch = json!({ "status": {
                "phase": "Running",
                "startTime": now,
                "conditions": [condition("Initialized"), condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
            } });
            if let Err(e) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                tracing::debug!(pod = %name, error = %e, "fleet: pod status not written");
            }
        }
    }
}

/// The fleet's metrics (`ichor_fleet_*`).
#[derive(Debug)]
pub struct FleetMetrics {
    sim: Arc<SimCluster>,
    talos: Arc<Counting>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabel {
    node: String,
    role: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

impl Collector for FleetMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let upgrades = self.talos.upgrades.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let (names, versions, counters, applies, repeated) = self.sim.with_world(|w| {
            let names: HashMap<String, String> = w.nodes.iter().map(|n| (n.address.clone(), n.name.clone())).collect();
            let mut versions: BTreeMap<String, i64> = BTreeMap::new();
            for n in w.nodes.iter().filter(|n| !matches!(n.phase, NodePhase::PoweredOff)) {
                *versions.entry(n.version.to_string()).or_default() += 1;
            }
            let applies: u64 = w.nodes.iter().map(|n| n.kube.applies.len() as u64).sum();
            let repeated: u64 = w
                .nodes
                .iter()
                .map(|n| {
                    n.kube.applies.iter().enumerate().filter(|(k, c)| n.kube.applies[..*k].contains(c)).count() as u64
                })
                .sum();
            (names, versions, w.counters.clone(), applies, repeated)
        });
        {
            let mut family = encoder.encode_descriptor(
                "fleet_upgrade_calls",
                "Upgrade calls the simulated fleet received, by node, whatever their answer",
                None,
                MetricType::Counter,
            )?;
            for (address, count) in &upgrades {
                let node = names.get(address).cloned().unwrap_or_else(|| address.clone());
                ConstCounter::new(*count).encode(family.encode_family(&NodeLabel { node })?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "fleet_nodes",
                "Running simulated nodes by Talos version",
                None,
                MetricType::Gauge,
            )?;
            for (version, count) in versions {
                ConstGauge::new(count).encode(family.encode_family(&VersionLabel { version })?)?;
            }
        }
        let gauges = [
            ("fleet_max_control_planes_down", "Most control planes down at once", counters.max_control_planes_down),
            ("fleet_max_workers_down", "Most workers down at once because of upgrades", counters.max_workers_down),
            (
                "fleet_min_etcd_voters",
                "Fewest voting etcd members at once",
                counters.min_etcd_voters.unwrap_or_default(),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let applied = ConstCounter::new(applies);
        applied.encode(encoder.encode_descriptor(
            "fleet_config_applies",
            "Machine configurations the simulated fleet applied, each changing one Kubernetes component",
            None,
            applied.metric_type(),
        )?)?;
        let twice = ConstGauge::new(i64::try_from(repeated).unwrap_or(i64::MAX));
        twice.encode(encoder.encode_descriptor(
            "fleet_repeated_applies",
            "Changes a simulated node took a second time (must stay 0)",
            None,
            twice.metric_type(),
        )?)?;
        // Each machine's turn in fleet seconds, for a makespan against the ideal scheduler
        // on the same turns (`ichor_sim::peers::makespan_against_ideal`).
        let turns = self.sim.with_world(|w| crate::peers::turns(&w.trace));
        let label = |turn: &crate::peers::Turn| TurnLabel { node: turn.node.clone(), role: turn.role.to_owned() };
        {
            let mut family = encoder.encode_descriptor(
                "fleet_turn_started_seconds",
                "When each machine's turn began (its install, Upgrade call or evacuation), in fleet seconds",
                None,
                MetricType::Gauge,
            )?;
            for turn in &turns {
                ConstGauge::new(turn.started_s).encode(family.encode_family(&label(turn))?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "fleet_turn_ended_seconds",
                "When each machine turned Ready after its turn, in fleet seconds",
                None,
                MetricType::Gauge,
            )?;
            for turn in &turns {
                let Some(ended) = turn.ended_s else { continue };
                ConstGauge::new(ended).encode(family.encode_family(&label(turn))?)?;
            }
        }
        let calls = ConstCounter::new(self.talos.calls.load(Ordering::Relaxed));
        calls.encode(encoder.encode_descriptor(
            "fleet_talos_calls",
            "Talos API calls the simulated fleet received",
            None,
            calls.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_or_say_what_is_wrong() {
        assert_eq!(parse_shape("3+5"), Ok((3, 5)));
        assert_eq!(parse_shape("1+0"), Ok((1, 0)));
        assert!(parse_shape("3").unwrap_err().contains("CONTROL_PLANES+WORKERS"));
        assert!(parse_shape("3+x").unwrap_err().contains("worker count"));
        assert!(parse_shape("0+5").unwrap_err().contains("control plane"));
        assert_eq!(parse_shape("3+1000"), Ok((3, 1000)));
        assert!(parse_shape("3+9998").unwrap_err().contains("at most 10000 machines"));
    }
}
