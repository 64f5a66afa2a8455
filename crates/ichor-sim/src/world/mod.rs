//! The simulated world's state and how it changes with virtual time.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;
use ichor_executor::kube_api::{
    ClusterInfo, Event, KubeError, LeaseInfo, MachineInfo, Metadata, NodeInfo, OperationInfo,
};
use ichor_storage::{LabelSelector, StorageObject};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::Conditions;
use ichor_upgrade_core::evacuation::EvacuationRecord;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::machine::lifecycle::CORDONED_ANNOTATION;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};

use super::config::{Fault, SimConfig, secs};
use super::kubernetes::SimKube;
use super::rng::Rng;
use super::trace::{TraceEvent, TraceKind};

mod alerting;
mod kubernetes_upgrade;
mod volumes;
pub use alerting::{SimAlert, SimAlerting};
pub use volumes::{REPLICAS, SimVolume, SimVolumes, VOLUME_NAMESPACE};

/// The label that puts a node under the workers' `TalosStorage`.
pub const STORAGE_LABEL: &str = "storage.ichor.dev/replicas";

/// Where a node is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePhase {
    /// Up and serving.
    Running,
    /// Acknowledged an Upgrade (its image pulled): draining and installing until `until`,
    /// then rebooting.
    Installing {
        /// When it reboots.
        until: Timestamp,
        /// The version it will boot.
        into: TalosVersion,
    },
    /// Rebooting: gone until `until`.
    Rebooting {
        /// When it has booted.
        until: Timestamp,
        /// The version it boots.
        into: TalosVersion,
    },
    /// Booted; the Node is Ready at `ready_at`.
    Booting {
        /// When the Node turns Ready.
        ready_at: Timestamp,
    },
    /// Resetting (wiping itself) until `until`, then powered off.
    Resetting {
        /// When it powers off.
        until: Timestamp,
    },
    /// Reset and powered off: gone for good.
    PoweredOff,
}

/// A pod on a simulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Owned by a DaemonSet (the drain skips it).
    pub daemonset: bool,
    /// A mirror (static) pod (the drain skips it).
    pub mirror: bool,
    /// Covered by the PodDisruptionBudget that the pdb-blocked fault blocks.
    pub budgeted: bool,
    /// Evicted: gone at this time.
    pub terminating_until: Option<Timestamp>,
}

/// A control plane's etcd member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdMember {
    /// A voting member.
    Voter,
    /// Rejoined as a learner; promoted at `until`.
    Learner {
        /// When it is promoted.
        until: Timestamp,
    },
    /// Not in the member list (its node is down).
    Missing,
}

/// A change of what the Node object shows, due at a time: the API server learns of a
/// node's state late (the kubelet reports after boot, the node lifecycle controller marks a
/// silent node NotReady after its grace period), and the controller's cache later still.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewChange {
    /// The Node turns NotReady (if the node is still down).
    NotReady,
    /// The kubelet reports after boot: the new boot ID and osImage, not Ready yet.
    Booted,
    /// The Node turns Ready (if the node still is).
    Ready,
}

/// What the Node object shows, as the controller's cache has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Its Ready condition.
    pub ready: bool,
    /// `status.nodeInfo.bootID`.
    pub boot_id: String,
    /// The version in `status.nodeInfo.osImage`.
    pub version: TalosVersion,
    /// Changes on their way, in time order.
    pub pending: Vec<(Timestamp, ViewChange)>,
}

/// The durations one node draws for its upgrade, fixed at the start so that runs with and
/// without faults of the controller are comparable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drawn {
    /// Talos's drain, seconds.
    pub drain: u64,
    /// Install, seconds.
    pub install: u64,
    /// Reboot, seconds.
    pub reboot: u64,
    /// Boot to Ready, seconds.
    pub ready: u64,
    /// Each replica's move, seconds.
    pub replica_moves: Vec<u64>,
    /// Its image pull alone, at its node's full speed (not drawn: the registry's
    /// bandwidth decides; this is the least it can take).
    pub pull: Duration,
}

/// How fast a replica moves, bytes a second: what a replica's size is, from its drawn
/// move (100 MiB/s, a rebuild over a 1 Gbit/s network with room to spare). The simulated
/// storage has sizes this way, with no draw of its own (so seeds replay as before).
pub const REPLICA_BYTES_PER_SECOND: u64 = 100 * 1024 * 1024;

impl Drawn {
    /// The bytes of the replicas still on the node, when `left` of its replicas are: the
    /// last `left` of [`Self::replica_moves`] (they move in order), each its move's
    /// seconds at [`REPLICA_BYTES_PER_SECOND`].
    #[must_use]
    pub fn bytes_left(&self, left: u32) -> u64 {
        let moved = self.replica_moves.len().saturating_sub(left as usize);
        self.replica_moves[moved..].iter().map(|s| s.saturating_mul(REPLICA_BYTES_PER_SECOND)).sum()
    }

    /// The node's own time: its evacuation, an uncontended image pull, its drain and
    /// install, its reboot until Ready.
    #[must_use]
    pub fn machine_time(&self) -> Duration {
        secs(self.replica_moves.iter().sum::<u64>() + self.drain + self.install + self.reboot + self.ready) + self.pull
    }
}

/// A storage evacuation under way on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evacuation {
    /// When the next replica has moved; `None` when stuck.
    pub next_move_at: Option<Timestamp>,
}

/// One simulated machine and its Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimNode {
    /// Node and machine name: `cp-1`, `worker-1`.
    pub name: String,
    /// Its role.
    pub role: MachineRole,
    /// The Talos API address.
    pub address: String,
    /// The Talos version it runs.
    pub version: TalosVersion,
    /// The kernel's boot ID.
    pub boot_id: String,
    /// Whether the Node is Ready.
    pub ready: bool,
    /// Its phase.
    pub phase: NodePhase,
    /// NotReady for a reason of its own until then.
    pub not_ready_until: Option<Timestamp>,
    /// Goes NotReady for a reason of its own at `.0`, for `.1` (the
    /// control-plane-not-ready fault).
    pub not_ready_at: Option<(Timestamp, Duration)>,
    /// The installer image in its containerd store, if pulled.
    pub pulled: Option<String>,
    /// Its next Upgrade call breaks off before reaching it (the call-lost fault).
    pub loses_next_call: bool,
    /// Falls back to its old version after its next upgrade reboot.
    pub falls_back: bool,
    /// Its etcd member, on a control plane.
    pub etcd: Option<EtcdMember>,
    /// Rejoins etcd as a learner for this long after its reboot.
    pub etcd_lag: Option<Duration>,
    /// Node labels.
    pub labels: Metadata,
    /// Node annotations.
    pub annotations: Metadata,
    /// Storage replicas on it.
    pub replicas: u32,
    /// Whether storage may schedule replicas on it.
    pub scheduling: bool,
    /// The engine's evacuation's record (its scheduling from before, its time), kept
    /// across repeated requests until the evacuation's end puts the scheduling back
    /// (Longhorn's backend keeps it in an annotation of its Node).
    pub storage_record: Option<EvacuationRecord>,
    /// An evacuation under way.
    pub evacuation: Option<Evacuation>,
    /// Its replicas never move.
    pub stuck: bool,
    /// Its drawn durations.
    pub drawn: Drawn,
    /// Whether its Node object was deleted.
    pub removed: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Its pods.
    pub pods: Vec<SimPod>,
    /// Pods the engine's drain evicted, which come back once the engine lifts its cordon
    /// (their Deployments' replacements, scheduled here again).
    pub evicted: Vec<SimPod>,
    /// The version a lifecycle install wrote into the other boot slot, booted at the next
    /// reboot (unless the slot falls back).
    pub installed: Option<TalosVersion>,
    /// A lifecycle install is under way (one at a time per node, as Talos allows).
    pub installing: bool,
    /// The install under way, which ends by itself whether or not a stream follows it.
    pub install_run: Option<InstallRun>,
    /// The last install's exit code, with the boot it ran on (what its stream reports).
    pub install_exit: Option<(String, i32)>,
    /// Whether its Node carries the engine's cordon annotation (kept beside the
    /// annotations: every measure of who is down asks it of every node).
    engine_cordon: bool,
    /// What its Node object shows (late, as a real one does).
    pub view: NodeView,
    /// Its Kubernetes: configuration images, kubelet, static pods.
    pub kube: SimKube,
}

impl SimNode {
    /// Whether its Talos API answers.
    #[must_use]
    pub fn reachable(&self) -> bool {
        !matches!(self.phase, NodePhase::Rebooting { .. } | NodePhase::PoweredOff)
    }

    /// Whether it is down because of an upgrade (draining, rebooting, booting).
    #[must_use]
    pub fn upgrading(&self) -> bool {
        matches!(self.phase, NodePhase::Installing { .. } | NodePhase::Rebooting { .. } | NodePhase::Booting { .. })
    }

    /// Whether it carries the engine's cordon (the lifecycle executor's drain, a removal).
    #[must_use]
    pub fn cordoned_by_engine(&self) -> bool {
        self.engine_cordon
    }

    /// Cordons it as the engine does (`spec.unschedulable` and the annotation), or lifts
    /// that cordon.
    /// `annotation`: the annotation's value ([`cordon_annotation`](ichor_upgrade_core::machine::lifecycle::cordon_annotation));
    /// `None` lifts the cordon.
    pub(crate) fn set_engine_cordon(&mut self, annotation: Option<&str>) {
        self.unschedulable = annotation.is_some();
        self.engine_cordon = annotation.is_some();
        match annotation {
            Some(value) => {
                self.annotations.insert(CORDONED_ANNOTATION.to_owned(), value.to_owned());
            }
            None => {
                self.annotations.remove(CORDONED_ANNOTATION);
            }
        }
    }
}

/// An operation object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimOperation {
    /// What the APIs return for it.
    pub info: OperationInfo,
    /// Whether its finalizer was removed after deletion.
    pub finalized: bool,
    /// Its resourceVersion: every write and edit changes it.
    pub version: u64,
    /// The version the controller last read or wrote: its status write is applied under
    /// it, as `KubeCluster`'s is (a write by anyone else since makes it a conflict).
    pub seen: u64,
}

/// A lifecycle install or reboot call the node carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleRecord {
    /// The node.
    pub node: String,
    /// Its boot ID at the call.
    pub boot_id: String,
    /// When the call took effect.
    pub at: Timestamp,
    /// When the call was sent (what the engine knew then is what it decided on).
    pub sent_at: Timestamp,
    /// How many times the controller had been restarted by then.
    pub restarts: u64,
}

/// A lifecycle install running on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallRun {
    /// When it ends.
    pub until: Timestamp,
    /// The boot it runs on: a reboot ends it unfinished.
    pub boot_id: String,
    /// What it writes into the other slot (`None`: an image that is no installer of this
    /// platform, which exits 2).
    pub version: Option<TalosVersion>,
    /// When its call was sent.
    pub sent_at: Timestamp,
    /// How many times the controller had been restarted when it began.
    pub restarts: u64,
}

/// An acknowledged Upgrade call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeRecord {
    /// The node.
    pub node: String,
    /// Its boot ID when the call was acknowledged.
    pub boot_id: String,
    /// When it was acknowledged.
    pub at: Timestamp,
    /// When the call was sent: what the engine knew then is what it decided on. A legacy
    /// call pulls the installer before it answers, so this can be long before `at`.
    pub sent_at: Timestamp,
}

/// The controller-crash fault's state: calls are numbered; the call numbered `crash_at`
/// kills the controller, before or after its effect; every call after it fails until the
/// runner restarts the controller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrashState {
    /// Calls made so far.
    pub calls: u64,
    /// The call that kills the controller.
    pub crash_at: Option<u64>,
    /// Whether it dies before the call takes effect.
    pub before_effect: bool,
    /// Whether the controller is dead.
    pub dead: bool,
    /// Kill the controller at the next Upgrade call: before its effect (`true`, the call
    /// never reaches the node) or after it (`false`, the acknowledgement is lost).
    pub on_next_upgrade: Option<bool>,
    /// Kill the controller at the next ApplyConfiguration that is no dry run: before its
    /// effect (`true`, the configuration is not stored) or after it (`false`, the
    /// acknowledgement is lost).
    pub on_next_apply: Option<bool>,
    /// Kill the controller at the next storage evacuation request, once its write took
    /// effect (the answer is lost): the backend's record is then all that says so.
    pub on_next_evacuation: bool,
    /// At most this many kills in a run (`None`: no bound). A lifecycle install lasts as
    /// long as its stream, and Talos stops the installer when its controller dies: a
    /// controller killed every few seconds for ever never installs anything (and pauses at
    /// the verify bound, saying so). A bound on the kills keeps the restart property about
    /// where the kills strike, not about a crash loop.
    pub max_kills: Option<u64>,
}

/// Counters over a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Writes to the Kubernetes API.
    pub kube_writes: u64,
    /// Admin kubeconfigs handed out (`MachineService.Kubeconfig`).
    pub admin_kubeconfigs: u64,
    /// Writes refused because the object changed since the read that authorised them.
    pub conflicts: u64,
    /// Calls to the Talos API.
    pub talos_calls: u64,
    /// Of which, by the `TalosApi` method called.
    pub talos_calls_by_method: std::collections::BTreeMap<&'static str, u64>,
    /// Acknowledged Upgrade calls.
    pub upgrade_calls: u64,
    /// Kubernetes calls refused because they landed on a kube-apiserver restarting (a
    /// Kubernetes upgrade's control plane).
    pub api_server_restart_refusals: u64,
    /// Lifecycle installs carried out to their end.
    pub install_calls: u64,
    /// Reboot calls carried out.
    pub reboot_calls: u64,
    /// Pods evicted (the lifecycle executor's drain, a removal's).
    pub evictions: u64,
    /// etcd snapshot streams the `snapshot-fails` fault broke: what tells a snapshot
    /// failure the fault caused from one of the environment (a snapshot store that cannot
    /// be written).
    pub snapshot_streams_broken: u64,

    /// Most control planes down at once.
    pub max_control_planes_down: usize,
    /// Most workers down at once because of upgrades.
    pub max_workers_down: usize,
    /// Fewest voting etcd members at once, if any control plane exists.
    pub min_etcd_voters: Option<usize>,
    /// Controller restarts.
    pub restarts: u64,
    /// Reads of the Kubernetes API (from the watch cache or not).
    pub kube_reads: u64,
    /// Events recorded (not counted in `kube_writes`).
    pub events: u64,
    /// Writes of the cluster's Lease (not counted in `kube_writes`).
    pub lease_writes: u64,
    /// Writes of the operation's status.
    pub status_writes: u64,
    /// Writes of machines' conditions.
    pub condition_writes: u64,
    /// Writes to the storage backend.
    pub storage_writes: u64,
    /// Writes of Nodes (the engine's cordon and uncordon).
    pub node_writes: u64,
    /// The largest operation status written, in bytes of JSON.
    pub status_bytes_max: usize,
    /// Reconcile passes.
    pub passes: u64,
    /// Machine-milliseconds spent held back by the preflight gate (each machine the gate
    /// blocked, for as long as it did).
    pub preflight_wait_ms: u64,
}

impl Counters {
    /// Counts one call to the Talos API, of this `TalosApi` method.
    pub fn talos_call(&mut self, method: &'static str) {
        self.talos_calls += 1;
        *self.talos_calls_by_method.entry(method).or_default() += 1;
    }
}

/// How an API call may proceed.
pub(crate) enum Gate {
    /// Refuse it: no effect.
    Refuse,
    /// Carry it out; if `killed`, fail it afterwards (the controller died after its effect).
    Go { killed: bool },
}

/// The whole simulated world.
#[derive(Debug)]
pub struct World {
    /// The configuration.
    pub config: SimConfig,
    /// Virtual now.
    pub now: Timestamp,
    /// When the run started.
    pub start: Timestamp,
    pub(crate) rng: Rng,
    /// Where the controller-crash fault strikes: a stream of its own, so that a run with
    /// crashes draws the same world as the same seed without them.
    pub(crate) crash_rng: Rng,
    /// The nodes.
    pub nodes: Vec<SimNode>,
    /// Each machine's conditions. Read them here; they change only through the APIs (the
    /// controller's reads are served from shared copies refreshed by those writes).
    pub conditions: BTreeMap<String, Conditions>,
    /// Each machine's annotations.
    pub machine_annotations: BTreeMap<String, Metadata>,
    /// Each machine's labels.
    pub machine_labels: BTreeMap<String, Metadata>,
    /// The cluster.
    pub cluster: ClusterInfo,
    /// Operations by name.
    pub operations: BTreeMap<String, SimOperation>,
    /// The cluster's Lease.
    pub lease: Option<LeaseInfo>,
    pub(crate) lease_version: u64,
    /// The storage objects.
    pub storage_objects: Vec<StorageObject>,
    /// Events recorded.
    pub events: Vec<Event>,
    /// The trace.
    pub trace: Vec<TraceEvent>,
    /// Counters.
    pub counters: Counters,
    /// Acknowledged Upgrade calls.
    pub upgrades: Vec<UpgradeRecord>,
    /// Lifecycle installs carried out to their end.
    pub installs: Vec<LifecycleRecord>,
    /// Reboot calls carried out.
    pub reboots: Vec<LifecycleRecord>,
    /// The crash fault's state.
    pub crash: CrashState,
    /// A test's placement of a stop between two calls of one step: at the `n`th call of
    /// kind `call` on `machine` (counting from 1), the stop is made at once (a hold lifted
    /// minutes later, a recorded failure that pauses, or a deletion), before the call that
    /// would follow (the apply after its dry run, the drain after its cordon).
    pub stop_at_call: Option<(StopCall, String, usize, StopKind)>,
    /// When the stop placed by `stop_at_call` was made.
    pub stop_made_at: Option<Timestamp>,
    /// The admin kubeconfig a control plane answers (`MachineService.Kubeconfig`): the
    /// simulated cluster's own, or a real API server's for the fleet in front of one.
    pub admin_kubeconfig: String,
    /// The Talos roles of the talosconfig the engine is given (`os:admin` by default; a
    /// test sets `os:operator`, which the Talos API refuses the admin kubeconfig).
    pub talosconfig_roles: Vec<String>,
    /// When the APIs refuse calls: from, until.
    pub outage: Option<(Timestamp, Timestamp)>,
    /// The outage's start is in the trace.
    outage_traced: bool,
    /// Evictions are blocked until then (a PodDisruptionBudget).
    pub pdb_blocked_until: Option<Timestamp>,
    /// The `payments/ledger` PodDisruptionBudget allows no disruption until then (the
    /// pdb-zero fault).
    pub pdb_zero_until: Option<Timestamp>,
    /// `reports/exporter` has one replica until then (the single-replica fault).
    pub single_replica_until: Option<Timestamp>,
    /// The hold-, pause- and delete-during-install faults: what stops which machine's start
    /// and when, once drawn; then when a hold is lifted.
    pub stop_during_install: StopDuringInstall,
    /// The objects of Talos's bootstrap manifests the cluster holds.
    pub bootstrap: super::kubernetes::SimBootstrap,
    /// The storage-degraded fault's volumes.
    pub volumes: SimVolumes,
    /// The monitoring stack alert gates read and silence.
    pub alerting: SimAlerting,
    /// A Node a person cordons (`kubectl cordon`) in the instant before the engine's next
    /// cordon of it arrives, after the engine read it: the race the cordon's precondition
    /// is for (issue 29 item 8). Taken when it fires.
    pub cordon_race: Option<String>,
    /// The next this many writes of a machine's conditions fail as if the API server were
    /// unreachable (tests set it to fail one write at a chosen moment).
    pub failing_condition_writes: u32,
    /// Draws of latencies and delays: a stream of its own, so that the world's physics
    /// draw the same under every model of time.
    pub(crate) latency_rng: Rng,
    /// Virtual time on Tokio's paused clock: the instant and the world time last matched.
    pub(crate) clock: Option<(tokio::time::Instant, Timestamp)>,
    /// When watch events reach the controller.
    /// With the node whose storage the event is about, if it is about storage.
    pub(crate) deliveries: BinaryHeap<Reverse<(Timestamp, Option<usize>)>>,
    by_name: HashMap<String, usize, FixedState>,
    by_address: HashMap<String, usize, FixedState>,
    /// Node indices in name order: the order the API server lists machines in.
    pub(crate) name_order: Vec<usize>,
    /// Each pod's node, by namespace and name.
    pod_nodes: HashMap<(String, String), usize, FixedState>,
    /// When each node next changes by itself, indexed.
    timers: Timers,
    /// What [`World::measure`] counts, node by node.
    census: Census,
    /// The image pulls under way.
    pulls: Pulls,
    /// What the controller's reads return, shared as a reflector's store shares its
    /// objects: by node index, rebuilt only when the object changed.
    read_cache: ReadCache,
    /// Each Node as last shown, kept through [`World::touched`] (which drops the shared
    /// copies): its resourceVersion changes only when what it shows does.
    node_shown: Vec<Option<Arc<NodeInfo>>>,
    /// The last Node resourceVersion given.
    node_versions: u64,
}

/// What a stop-during-install fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// A person holds the machine, and lifts the hold later.
    Hold,
    /// The machine's failure is recorded: the operation pauses.
    Pause,
    /// A person pauses the operation (`ichor.dev/pause`), and lifts the pause later.
    PauseRequest,
    /// A person deletes the operation.
    Delete,
}

/// The simulated cluster's admin kubeconfig, in the shape Talos generates one, its
/// credentials stand-ins (a real tool refuses them: a test that hands the kubeconfig to
/// one sets [`World::admin_kubeconfig`] to a real one).
pub const SIM_ADMIN_KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster:
    server: https://127.0.0.1:1
    certificate-authority-data: c2ltLWNh
users:
- name: admin@sim
  user:
    client-certificate-data: c2ltLWNlcnQ=
    client-key-data: c2ltLWtleQ==
contexts:
- name: admin@sim
  context:
    cluster: sim
    namespace: default
    user: admin@sim
current-context: admin@sim
";

/// A call after which a test places a stop (see [`World::stop_at_call`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCall {
    /// A dry run of an ApplyConfiguration (a Kubernetes component's apply follows).
    DryRun,
    /// The engine's cordon of a Node (the lifecycle drain follows).
    Cordon,
}

/// Where the stop-during-install faults stand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StopDuringInstall {
    /// Not drawn yet (or no such fault is on).
    #[default]
    Idle,
    /// `.0` is done to machine `.1` at `.2`.
    Armed(StopKind, String, Timestamp),
    /// Machine `.0` is held; the hold is lifted at `.1`.
    Held(String, Timestamp),
    /// Every operation is paused by a person since `.0`; the pause is lifted at `.1`.
    PauseRequested(Timestamp, Timestamp),
    /// Done (and a hold lifted).
    Done,
}

impl StopDuringInstall {
    fn due(&self) -> Option<Timestamp> {
        match self {
            Self::Armed(_, _, t) | Self::Held(_, t) | Self::PauseRequested(_, t) => Some(*t),
            Self::Idle | Self::Done => None,
        }
    }
}

/// Talos's server-side drain bound (`DrainTimeout`, 5 min): past it the upgrade goes on,
/// evictions left failing are only logged (`v1alpha1_sequencer_tasks.go`, facts sheet §4.1).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
/// How often Talos's drain retries an eviction a PodDisruptionBudget refused (HTTP 429).
pub const DRAIN_RETRY: Duration = Duration::from_secs(5);

/// What Talos's drain waits on at the start of an upgrade.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DrainWait {
    /// How long.
    pub(crate) wait: Duration,
    /// Why, as a trace reason and message, when it waits.
    pub(crate) blocked_by: Option<(String, String)>,
}

/// When each node next changes by itself, indexed so that a change to one node re-reads
/// that node only: the simulator makes no pass over every node per call.
#[derive(Debug, Default)]
struct Timers {
    /// By node index.
    at: Vec<Option<Timestamp>>,
    /// `(when, node)`, earliest first.
    queue: BTreeSet<(Timestamp, usize)>,
    /// Nodes changed since their time was last read.
    dirty: Vec<usize>,
    /// Any node may have changed (a direct change through [`super::SimCluster::with_world`]).
    all: bool,
}

/// What [`World::measure`] counts, kept per node and summed: only the nodes changed since
/// the last measure are looked at again (a measure after every change would otherwise scan
/// every node, every time).
#[derive(Debug, Default)]
struct Census {
    /// Each node's share, by node index.
    of: Vec<Share>,
    /// The sums of the shares.
    sum: Share,
    /// Nodes changed since the last measure.
    dirty: Vec<usize>,
    /// Any node may have changed: count them all again.
    all: bool,
}

/// What one node adds to the census (or, summed, the census itself).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Share {
    control_planes_down: usize,
    workers_down: usize,
    voters: usize,
    members: usize,
    /// Workers not removed.
    workers: usize,
    /// Ready `invoice-api` pods (the budget's healthy pods).
    invoice_api_ready: usize,
    /// Pods of the pdb-zero and single-replica faults' workloads.
    fault_pods: usize,
}

impl Share {
    fn of(n: &SimNode) -> Self {
        if n.removed {
            return Self::default();
        }
        // Down because of the operation: upgrading, or (a control plane) NotReady other
        // than for a reason of its own; a node the world takes down by itself is not the
        // engine's.
        let down = n.upgrading()
            || n.cordoned_by_engine()
            || (n.role == MachineRole::ControlPlane && !n.ready && n.not_ready_until.is_none());
        let billing = |(namespace, app): (&'static str, &'static str)| {
            n.pods.iter().filter(move |p| p.namespace == namespace && p.name.starts_with(app))
        };
        Self {
            control_planes_down: usize::from(down && n.role == MachineRole::ControlPlane),
            workers_down: usize::from(down && n.role == MachineRole::Worker),
            voters: usize::from(n.etcd == Some(EtcdMember::Voter)),
            members: usize::from(n.etcd.is_some()),
            workers: usize::from(n.role == MachineRole::Worker),
            invoice_api_ready: if n.ready {
                billing(("billing", "invoice-api-")).filter(|p| p.terminating_until.is_none()).count()
            } else {
                0
            },
            fault_pods: billing(LEDGER).count() + billing(EXPORTER).count(),
        }
    }

    fn add(self, other: Self) -> Self {
        Self {
            control_planes_down: self.control_planes_down + other.control_planes_down,
            workers_down: self.workers_down + other.workers_down,
            voters: self.voters + other.voters,
            members: self.members + other.members,
            workers: self.workers + other.workers,
            invoice_api_ready: self.invoice_api_ready + other.invoice_api_ready,
            fault_pods: self.fault_pods + other.fault_pods,
        }
    }

    fn sub(self, other: Self) -> Self {
        Self {
            control_planes_down: self.control_planes_down - other.control_planes_down,
            workers_down: self.workers_down - other.workers_down,
            voters: self.voters - other.voters,
            members: self.members - other.members,
            workers: self.workers - other.workers,
            invoice_api_ready: self.invoice_api_ready - other.invoice_api_ready,
            fault_pods: self.fault_pods - other.fault_pods,
        }
    }
}

/// The installer image pulls under way: each has its bytes left, and all share the
/// registry's bandwidth equally (processor sharing), each capped at its node's share.
#[derive(Debug)]
struct Pulls {
    /// `(node, bytes left, image)`.
    active: Vec<(usize, f64, String)>,
    /// When the bytes left were last brought up to date.
    at: Timestamp,
}

/// Shared copies of the objects the controller reads, by node index.
#[derive(Debug, Default)]
struct ReadCache {
    /// `TalosMachine`s, dropped by every write of the machine's conditions.
    machines: Vec<Option<Arc<MachineInfo>>>,
    /// Nodes, dropped when what the Node shows changes (readiness, version, boot ID: the
    /// view's changes; labels, annotations and the cordon: a write or a hand edit, which
    /// drops every copy); whether an upgrade makes it unschedulable is checked at each read.
    nodes: Vec<Option<Arc<NodeInfo>>>,
}

/// The cluster's name in the simulation.
pub const CLUSTER: &str = "sim";

/// The namespace and Deployment of the pods the pdb-zero fault's budget covers.
const LEDGER: (&str, &str) = ("payments", "ledger");
/// The namespace and Deployment the single-replica fault runs with one replica.
const EXPORTER: (&str, &str) = ("reports", "exporter");

impl World {
    /// A fresh world from its configuration.
    #[must_use]
    pub fn new(config: SimConfig) -> Self {
        let mut rng = Rng::new(config.seed);
        let start = Timestamp::from_unix_secs(1_767_225_600); // 2026-01-01T00:00:00Z
        let mut nodes = Vec::new();
        let naming = &config.naming;
        // What the cluster runs; a version that does not parse (a test of planning's
        // refusal) leaves every component on 0.0.0.
        let kubernetes = KubernetesVersion::parse(&config.kubernetes)
            .unwrap_or_else(|_| KubernetesVersion::parse("0.0.0").expect("a version"));
        let roles = (1..=config.control_planes)
            .map(|i| (format!("{}cp-{i}{}", naming.prefix, naming.suffix), MachineRole::ControlPlane))
            .chain(
                (1..=config.workers)
                    .map(|i| (format!("{}worker-{i}{}", naming.prefix, naming.suffix), MachineRole::Worker)),
            );
        for (index, (name, role)) in roles.enumerate() {
            let d = &config.durations;
            let storage = role == MachineRole::Worker && config.storage_on_workers;
            let replicas = if storage { config.replicas_per_node } else { 0 };
            let slow = config.has(Fault::SlowReboot) && rng.chance(0.15);
            let reboot = rng.in_range(d.reboot.clone()) * if slow { rng.in_range(3..=8) } else { 1 };
            let drawn = Drawn {
                install: rng.in_range(d.install.clone()),
                reboot,
                ready: rng.in_range(d.ready.clone()),
                replica_moves: (0..replicas).map(|_| rng.in_range(d.replica_move.clone())).collect(),
                drain: rng.in_range(d.drain.clone()),
                pull: config.registry.uncontended(),
            };
            let mut labels = Metadata::new();
            if storage {
                labels.insert(STORAGE_LABEL.to_owned(), "true".to_owned());
            }
            let mut annotations = Metadata::new();
            annotations.insert(
                "extensions.talos.dev/schematic".to_owned(),
                "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".to_owned(),
            );
            let pod = |namespace: &str, name: String, daemonset, mirror, budgeted| SimPod {
                namespace: namespace.to_owned(),
                name,
                daemonset,
                mirror,
                budgeted,
                terminating_until: None,
            };
            let mut pods = vec![pod("kube-system", format!("cilium-{index}"), true, false, false)];
            match role {
                MachineRole::ControlPlane => {
                    pods.push(pod("kube-system", format!("kube-apiserver-{name}"), false, true, false));
                    // CoreDNS tolerates the control planes' taint: a drain evicts it.
                    pods.push(pod("kube-system", format!("coredns-{index}"), false, false, false));
                }
                MachineRole::Worker => {
                    pods.push(pod("billing", format!("invoice-api-{index}"), false, false, true));
                    pods.push(pod("billing", format!("invoice-worker-{index}"), false, false, false));
                }
            }
            nodes.push(SimNode {
                name,
                role,
                address: naming.address(index),
                version: config.from.clone(),
                boot_id: rng.boot_id(),
                ready: true,
                phase: NodePhase::Running,
                not_ready_until: None,
                not_ready_at: None,
                pulled: None,
                loses_next_call: false,
                falls_back: false,
                etcd: (role == MachineRole::ControlPlane).then_some(EtcdMember::Voter),
                etcd_lag: None,
                labels,
                annotations,
                replicas,
                scheduling: true,
                storage_record: None,
                evacuation: None,
                stuck: false,
                drawn,
                removed: false,
                unschedulable: false,
                view: NodeView {
                    ready: true,
                    boot_id: String::new(),
                    version: config.from.clone(),
                    pending: Vec::new(),
                },
                pods,
                evicted: Vec::new(),
                installed: None,
                installing: false,
                install_run: None,
                install_exit: None,
                engine_cordon: false,
                kube: SimKube::new(role, &kubernetes),
            });
        }
        for n in &mut nodes {
            n.view.boot_id = n.boot_id.clone();
        }
        let config_seed = config.seed;
        let mut world = Self {
            cluster: ClusterInfo {
                name: CLUSTER.to_owned(),
                release_talos_version: config.to.to_string(),
                releases: ichor_upgrade_core::releases::KnownReleases::built_in().clone(),
                kubernetes_version: config.kubernetes.clone(),
                schematic: None,
                platform: config.platform.clone(),
                // Filled in as the simulated API server is read.
                nodes: Vec::new(),
                maintenance: config.maintenance.clone(),
                gates: config.gates.clone(),
            },
            conditions: nodes.iter().map(|n| (n.name.clone(), Conditions::new())).collect(),
            machine_annotations: nodes.iter().map(|n| (n.name.clone(), Metadata::new())).collect(),
            machine_labels: nodes.iter().map(|n| (n.name.clone(), Metadata::new())).collect(),
            storage_objects: if config.storage_on_workers {
                vec![StorageObject {
                    name: "replicated".to_owned(),
                    node_selector: LabelSelector {
                        match_labels: [(STORAGE_LABEL.to_owned(), "true".to_owned())].into(),
                        ..LabelSelector::default()
                    },
                    evacuation_timeout: None,
                }]
            } else {
                Vec::new()
            },
            crash_rng: Rng::new(config.seed ^ 0x00c0_ffee_dead_beef),
            config,
            now: start,
            start,
            rng,
            nodes,
            operations: BTreeMap::new(),
            lease: None,
            lease_version: 0,
            events: Vec::new(),
            trace: Vec::new(),
            counters: Counters::default(),
            upgrades: Vec::new(),
            installs: Vec::new(),
            reboots: Vec::new(),
            crash: CrashState::default(),
            stop_at_call: None,
            stop_made_at: None,
            admin_kubeconfig: SIM_ADMIN_KUBECONFIG.to_owned(),
            talosconfig_roles: vec!["os:admin".to_owned()],
            outage: None,
            outage_traced: false,
            pdb_blocked_until: None,
            pdb_zero_until: None,
            single_replica_until: None,
            stop_during_install: StopDuringInstall::Idle,
            bootstrap: super::kubernetes::SimBootstrap::default(),
            volumes: SimVolumes::default(),
            alerting: SimAlerting::default(),
            cordon_race: None,
            failing_condition_writes: 0,
            latency_rng: Rng::new(config_seed ^ 0x5eed_1a7e_0000_0001),
            clock: None,
            deliveries: BinaryHeap::new(),
            by_name: HashMap::default(),
            by_address: HashMap::default(),
            pod_nodes: HashMap::default(),
            name_order: Vec::new(),
            timers: Timers { all: true, ..Timers::default() },
            census: Census { all: true, ..Census::default() },
            pulls: Pulls { active: Vec::new(), at: start },
            read_cache: ReadCache::default(),
            node_shown: Vec::new(),
            node_versions: 0,
        };
        world.by_name = world.nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
        world.by_address = world.nodes.iter().enumerate().map(|(i, n)| (n.address.clone(), i)).collect();
        world.name_order = (0..world.nodes.len()).collect();
        world.name_order.sort_by(|a, b| world.nodes[*a].name.cmp(&world.nodes[*b].name));
        // Faults may place pods of their own.
        world.place_faults();
        world.place_kubernetes_faults();
        world.place_volumes();
        world.pod_nodes = world
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.pods.iter().map(move |p| ((p.namespace.clone(), p.name.clone()), i)))
            .collect();
        for i in 0..world.nodes.len() {
            world.record(i, TraceKind::Listed);
        }
        world.measure();
        world
    }

    /// Puts each configured fault of the world on a node or a time window.
    fn place_faults(&mut self) {
        let workers: Vec<usize> = self.indices(MachineRole::Worker);
        let cps: Vec<usize> = self.indices(MachineRole::ControlPlane);
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        if self.config.has(Fault::AbFallback)
            && let Some(i) = self.pick(&all)
        {
            self.nodes[i].falls_back = true;
        }
        let storage_nodes: Vec<usize> = all.iter().copied().filter(|&i| self.nodes[i].replicas > 0).collect();
        if self.config.has(Fault::EvacuationStuck)
            && let Some(i) = self.pick(&storage_nodes)
        {
            self.nodes[i].stuck = true;
        }
        if self.config.has(Fault::EtcdLag)
            && let Some(i) = self.pick(&cps)
        {
            self.nodes[i].etcd_lag = Some(secs(self.rng.in_range(60..=240)));
        }
        if self.config.has(Fault::NotReady)
            && let Some(i) = self.pick(&workers)
        {
            let until = self.now.saturating_add(secs(self.rng.in_range(300..=900)));
            self.nodes[i].ready = false;
            self.nodes[i].view.ready = false;
            self.nodes[i].not_ready_until = Some(until);
        }
        // A control plane's lost call is the dangerous one (its re-call needs the gate
        // again): half the time the fault picks one.
        if self.config.has(Fault::CallLost) {
            let among = if self.rng.chance(0.5) && !cps.is_empty() { cps.clone() } else { all.clone() };
            if let Some(i) = self.pick(&among) {
                self.nodes[i].loses_next_call = true;
            }
        }
        if self.config.has(Fault::ControlPlaneNotReady)
            && let Some(i) = self.pick(&cps)
        {
            let at = self.now.saturating_add(secs(self.rng.in_range(60..=1800)));
            self.nodes[i].not_ready_at = Some((at, secs(self.rng.in_range(120..=900))));
        }
        if self.config.has(Fault::ApiOutage) {
            let from = self.now.saturating_add(secs(self.rng.in_range(60..=600)));
            self.outage = Some((from, from.saturating_add(secs(self.rng.in_range(60..=180)))));
        }
        if self.config.has(Fault::PdbBlocked) {
            self.pdb_blocked_until = Some(self.now.saturating_add(secs(self.rng.in_range(120..=600))));
        }
        let workload_pod = |namespace: &str, name: String| SimPod {
            namespace: namespace.to_owned(),
            name,
            daemonset: false,
            mirror: false,
            budgeted: false,
            terminating_until: None,
        };
        if self.config.has(Fault::PdbZero) {
            let mut left = workers.clone();
            for k in 0..(workers.len() / 4).max(2).min(workers.len()) {
                let Some(i) = self.pick(&left) else { break };
                left.retain(|&j| j != i);
                self.nodes[i].pods.push(workload_pod(LEDGER.0, format!("{}-{k}", LEDGER.1)));
            }
            self.pdb_zero_until = Some(self.now.saturating_add(secs(self.rng.in_range(600..=1800))));
        }
        if self.config.has(Fault::SingleReplica)
            && let Some(i) = self.pick(&workers)
        {
            self.nodes[i].pods.push(workload_pod(EXPORTER.0, format!("{}-0", EXPORTER.1)));
            self.single_replica_until = Some(self.now.saturating_add(secs(self.rng.in_range(600..=1800))));
        }
    }

    /// Whether the pdb-zero fault's budget allows no disruption now.
    fn ledger_at_zero(&self) -> bool {
        self.pdb_zero_until.is_some_and(|t| self.now < t)
    }

    /// When the pod `pod`'s eviction is refused until, if it is now.
    pub(crate) fn eviction_blocked_until(&self, pod: &SimPod) -> Option<Timestamp> {
        if pod.budgeted {
            return self.pdb_blocked_until.filter(|t| *t > self.now);
        }
        if pod.namespace == LEDGER.0 && pod.name.starts_with(LEDGER.1) {
            return self.pdb_zero_until.filter(|t| *t > self.now);
        }
        None
    }

    pub(crate) fn indices(&self, role: MachineRole) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].role == role).collect()
    }

    pub(crate) fn pick(&mut self, from: &[usize]) -> Option<usize> {
        if from.is_empty() {
            return None;
        }
        let k = self.rng.in_range(0..=(from.len() as u64 - 1));
        Some(from[usize::try_from(k).unwrap_or(0)])
    }

    /// The node of this name.
    #[must_use]
    pub fn node(&self, name: &str) -> Option<&SimNode> {
        self.node_index(name).map(|i| &self.nodes[i])
    }

    pub(crate) fn node_index_by_address(&self, address: &str) -> Option<usize> {
        self.by_address.get(address).copied()
    }

    /// The storage system's node of this name: it outlives the Kubernetes Node object.
    /// The node a pod runs on, and its index there.
    pub(crate) fn pod(&self, namespace: &str, name: &str) -> Option<(usize, usize)> {
        let i = *self.pod_nodes.get(&(namespace.to_owned(), name.to_owned()))?;
        let k = self.nodes[i].pods.iter().position(|p| p.namespace == namespace && p.name == name)?;
        Some((i, k))
    }

    pub(crate) fn storage_node(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    pub(crate) fn node_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied().filter(|&i| !self.nodes[i].removed)
    }

    /// The pods on Node `node`, as a read of them gives them.
    pub(crate) fn pods_on(&self, node: &str) -> Result<Vec<ichor_executor::kube_api::PodInfo>, KubeError> {
        let i = self.node_index(node).ok_or_else(|| KubeError::NotFound(format!("Node {node}")))?;
        Ok(self.nodes[i]
            .pods
            .iter()
            .map(|p| ichor_executor::kube_api::PodInfo {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                owner_kinds: vec![if p.daemonset { "DaemonSet" } else { "ReplicaSet" }.to_owned()],
                mirror: p.mirror,
                terminating: p.terminating_until.is_some(),
                uid: None,
            })
            .collect())
    }

    /// Machine `i`'s `TalosMachine` as the controller reads it, shared.
    pub(crate) fn machine_info(&mut self, i: usize) -> Arc<MachineInfo> {
        if self.read_cache.machines.len() != self.nodes.len() {
            self.read_cache.machines = vec![None; self.nodes.len()];
        }
        if let Some(cached) = &self.read_cache.machines[i] {
            return Arc::clone(cached);
        }
        let n = &self.nodes[i];
        let info = Arc::new(MachineInfo {
            name: n.name.clone(),
            role: n.role,
            hostname: self.config.hostnames.then(|| n.name.clone()),
            address: n.address.clone(),
            labels: self.machine_labels.get(&n.name).cloned().unwrap_or_default(),
            annotations: self.machine_annotations.get(&n.name).cloned().unwrap_or_default(),
            conditions: self.conditions.get(&n.name).cloned().unwrap_or_default(),
            resource_version: Some(self.machine_version(i)),
        });
        self.read_cache.machines[i] = Some(Arc::clone(&info));
        info
    }

    /// Machine `i`'s resourceVersion: it changes with anything a write or a person changes
    /// on its `TalosMachine` (labels, annotations, conditions), as the API server's does.
    #[must_use]
    pub fn machine_version(&self, i: usize) -> String {
        use std::hash::{Hash, Hasher};
        let name = &self.nodes[i].name;
        let mut hasher = std::hash::DefaultHasher::new();
        format!("{:?}", self.machine_labels.get(name)).hash(&mut hasher);
        format!("{:?}", self.machine_annotations.get(name)).hash(&mut hasher);
        format!("{:?}", self.conditions.get(name)).hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }

    /// The stop-during-install faults, at the first installer pull on a machine the
    /// operation records as started: draws what is done (among the faults on) and when,
    /// within a minute.
    pub(crate) fn arm_stop_during_install(&mut self, machine: &str) {
        self.arm_stop(machine, 1);
    }

    /// The stop-during-install faults in a Kubernetes upgrade: at a read of the
    /// configuration of a machine the operation records as started, one read in
    /// `one_in` drawn (so the stop lands in either stage, before, between or after a
    /// machine's changes), then within a minute.
    pub(crate) fn arm_stop_during_change(&mut self, machine: &str, one_in: u64) {
        self.arm_stop(machine, one_in);
    }

    fn arm_stop(&mut self, machine: &str, one_in: u64) {
        if self.stop_during_install != StopDuringInstall::Idle {
            return;
        }
        let kinds: Vec<StopKind> = [
            (Fault::HoldDuringInstall, StopKind::Hold),
            (Fault::PauseDuringInstall, StopKind::Pause),
            (Fault::PauseRequestedDuringInstall, StopKind::PauseRequest),
            (Fault::DeleteDuringInstall, StopKind::Delete),
        ]
        .into_iter()
        .filter(|(f, _)| self.config.has(*f))
        .map(|(_, k)| k)
        .collect();
        if kinds.is_empty() {
            return;
        }
        let started = self.operations.values().any(|op| {
            op.info
                .status
                .machines
                .get(machine)
                .is_some_and(|r| r.state == ichor_upgrade_core::status::RecordState::InProgress)
        });
        if started && (one_in <= 1 || self.rng.in_range(1..=one_in) == 1) {
            let kind = kinds[self.rng.in_range(0..=(kinds.len() as u64 - 1)) as usize];
            let after = Duration::from_millis(self.rng.in_range(0..=60_000));
            self.stop_during_install =
                StopDuringInstall::Armed(kind, machine.to_owned(), self.now.saturating_add(after));
        }
    }

    /// Carries out the fault's stop when due (a person's edit, or a pass's record of a
    /// failure, which the watch reports), and lifts a hold when due.
    fn apply_stop_during_install(&mut self, now: Timestamp) {
        match self.stop_during_install.clone() {
            StopDuringInstall::Armed(kind, machine, at) if at <= now => {
                self.stop_during_install = match kind {
                    StopKind::Hold => {
                        let lift = Duration::from_secs(self.rng.in_range(120..=600));
                        self.set_hold(&machine, true);
                        StopDuringInstall::Held(machine, now.saturating_add(lift))
                    }
                    StopKind::Pause => {
                        self.record_failure(&machine);
                        StopDuringInstall::Done
                    }
                    StopKind::PauseRequest => {
                        let lift = Duration::from_secs(self.rng.in_range(120..=600));
                        self.set_pause_requested(true);
                        StopDuringInstall::PauseRequested(now, now.saturating_add(lift))
                    }
                    StopKind::Delete => {
                        for op in self.operations.values_mut() {
                            op.info.deleting = true;
                            op.version += 1;
                        }
                        StopDuringInstall::Done
                    }
                };
                self.watch_event();
            }
            StopDuringInstall::Held(machine, at) if at <= now => {
                self.set_hold(&machine, false);
                self.stop_during_install = StopDuringInstall::Done;
                self.watch_event();
            }
            StopDuringInstall::PauseRequested(_, at) if at <= now => {
                self.set_pause_requested(false);
                self.stop_during_install = StopDuringInstall::Done;
                self.watch_event();
            }
            _ => {}
        }
    }

    /// A call of kind `call` on node `i` was made: makes the stop a test placed there
    /// (`stop_at_call`), if this is its call.
    pub(crate) fn call_made(&mut self, call: StopCall, i: usize) {
        let name = self.nodes[i].name.clone();
        let kind = match &mut self.stop_at_call {
            Some((at, machine, n, kind)) if *at == call && *machine == name => {
                *n = n.saturating_sub(1);
                if *n > 0 {
                    return;
                }
                *kind
            }
            Some(_) | None => return,
        };
        self.stop_at_call = None;
        self.stop_made_at = Some(self.now);
        self.stop_during_install = StopDuringInstall::Armed(kind, name, self.now);
        self.apply_stop_during_install(self.now);
    }

    /// Holds machine `machine` (or lifts its hold), as a person's annotation does.
    fn set_hold(&mut self, machine: &str, on: bool) {
        let annotations = self.machine_annotations.entry(machine.to_owned()).or_default();
        if on {
            annotations
                .insert(ichor_upgrade_core::operation::HOLD_ANNOTATION.to_owned(), "stop-during-install".to_owned());
        } else {
            annotations.remove(ichor_upgrade_core::operation::HOLD_ANNOTATION);
        }
        if let Some(i) = self.node_index(machine)
            && let Some(cached) = self.read_cache.machines.get_mut(i)
        {
            *cached = None;
        }
    }

    /// Pauses every operation as a person does (`ichor.dev/pause`), or lifts that pause.
    fn set_pause_requested(&mut self, on: bool) {
        use ichor_upgrade_core::operation::PAUSE_ANNOTATION;
        for op in self.operations.values_mut() {
            if on {
                op.info.annotations.insert(PAUSE_ANNOTATION.to_owned(), "pause-requested-during-install".to_owned());
            } else {
                op.info.annotations.remove(PAUSE_ANNOTATION);
            }
            op.version += 1;
        }
    }

    /// Pauses every operation that has `machine` started, recording its failure as a pass
    /// of the controller records one (a test's placed pause), and wakes the controller.
    pub fn pause_with_failure(&mut self, machine: &str) {
        self.record_failure(machine);
        self.watch_event();
    }

    /// Records machine `machine`'s failure in every operation's status that has it
    /// started, pausing it, as a pass of the controller records one.
    fn record_failure(&mut self, machine: &str) {
        use ichor_upgrade_core::status::{FailedMachine, PauseReason, Phase};
        use ichor_upgrade_core::status::{MachineRecord, RecordState};
        let reason = "a failure recorded by the pause-during-install fault".to_owned();
        let mut recorded = false;
        // A pass records a failure only for a machine whose change it has not seen
        // through: one whose conditions record it converged on the operation's target
        // (its status record may lag a pass behind: a Kubernetes upgrade's manifests pass
        // records no machine) is never failed after the fact.
        let conditions = self.conditions.get(machine);
        let converged = |spec: &ichor_upgrade_core::operation::OperationSpec| {
            let Some(conditions) = conditions else { return false };
            match spec.validate_kubernetes() {
                Ok(k) => {
                    ichor_upgrade_core::machine::kubernetes::kubernetes_record(conditions, &k.target)
                        == ichor_upgrade_core::machine::kubernetes::KubernetesRecord::Converged
                }
                Err(_) => TalosVersion::parse(&spec.target_version)
                    .is_ok_and(|t| ichor_upgrade_core::machine::talos::converged_on(conditions) == Some(t)),
            }
        };
        for op in self.operations.values_mut() {
            let status = &mut op.info.status;
            if !status.machines.get(machine).is_some_and(|r| r.state == RecordState::InProgress)
                || converged(&op.info.spec)
            {
                continue;
            }
            let record = MachineRecord {
                state: RecordState::Failed,
                reason: "FaultInjected".to_owned(),
                message: reason.clone(),
                recheck_at: None,
            };
            status.machines.insert(machine.to_owned(), record);
            let failed = status
                .machines
                .iter()
                .filter(|(_, r)| r.state == RecordState::Failed)
                .map(|(name, r)| FailedMachine { name: name.clone(), reason: r.message.clone() })
                .collect();
            status.phase = Phase::Paused(PauseReason::MachineFailed { machines: failed });
            op.version += 1;
            recorded = true;
        }
        // In the trace as any failure the status records: the machine is reported failed
        // (what its node does next, a fallback included, is no longer the engine's to see).
        if recorded && let Some(i) = self.nodes.iter().position(|n| n.name == machine) {
            self.record_why(i, TraceKind::Failed, Some(("FaultInjected".to_owned(), reason)));
        }
    }

    /// Sets machine `i`'s conditions (a write through the API).
    pub(crate) fn set_conditions(&mut self, i: usize, conditions: Conditions) {
        let name = self.nodes[i].name.clone();
        self.conditions.insert(name, conditions);
        if let Some(cached) = self.read_cache.machines.get_mut(i) {
            *cached = None;
        }
    }

    /// Node `i` as its object shows it (late, as the kubelet and the node lifecycle
    /// controller report it), shared while it is unchanged.
    pub(crate) fn node_info(&mut self, i: usize) -> Arc<NodeInfo> {
        if self.read_cache.nodes.len() != self.nodes.len() {
            self.read_cache.nodes = vec![None; self.nodes.len()];
        }
        let n = &self.nodes[i];
        let unschedulable = n.unschedulable || n.upgrading();
        // A change of what the Node shows drops its copy (`apply_view`, `node_edited`, a
        // hand edit); what is derived from the node's phase is checked here.
        if let Some(cached) = &self.read_cache.nodes[i]
            && cached.unschedulable == unschedulable
        {
            return Arc::clone(cached);
        }
        let mut info = NodeInfo {
            name: n.name.clone(),
            ready: n.view.ready,
            unschedulable,
            os_image: n.view.version.os_image(),
            boot_id: n.view.boot_id.clone(),
            labels: n.labels.clone(),
            annotations: n.annotations.clone(),
            resource_version: String::new(),
        };
        // A real API server's resourceVersion changes with every write of the object, and
        // only then: the same version while it shows the same.
        if self.node_shown.len() != self.nodes.len() {
            self.node_shown.resize(self.nodes.len(), None);
        }
        match &self.node_shown[i] {
            Some(last) if NodeInfo { resource_version: String::new(), ..NodeInfo::clone(last) } == info => {
                info.resource_version.clone_from(&last.resource_version);
            }
            _ => {
                self.node_versions += 1;
                info.resource_version = self.node_versions.to_string();
            }
        }
        let info = Arc::new(info);
        self.node_shown[i] = Some(Arc::clone(&info));
        self.read_cache.nodes[i] = Some(Arc::clone(&info));
        info
    }

    /// How long Talos's drain of node `i`, at the start of its upgrade, waits on a
    /// PodDisruptionBudget: none unless a pod under the budget the pdb-blocked fault blocks
    /// runs there; else until the budget allows the eviction (retried every
    /// [`DRAIN_RETRY`]), at most [`DRAIN_TIMEOUT`].
    pub(crate) fn drain_wait(&self, i: usize) -> DrainWait {
        let blocked = self.nodes[i]
            .pods
            .iter()
            .filter(|p| p.terminating_until.is_none())
            .find_map(|p| self.eviction_blocked_until(p).map(|until| (until, p)));
        let Some((until, pod)) = blocked else { return DrainWait::default() };
        let retry = DRAIN_RETRY.as_millis().max(1);
        let waited = until.saturating_since(self.now).as_millis().div_ceil(retry) * retry;
        let wait = Duration::from_millis(u64::try_from(waited).unwrap_or(u64::MAX)).min(DRAIN_TIMEOUT);
        let message = format!(
            "a PodDisruptionBudget allows no eviction of {}/{}: Talos's drain retries every {} s, for {} s",
            pod.namespace,
            pod.name,
            DRAIN_RETRY.as_secs(),
            wait.as_secs()
        );
        DrainWait { wait, blocked_by: Some(("DrainBlocked".to_owned(), message)) }
    }

    /// Brings every pull's bytes left up to now, at the rate they shared since; a pull
    /// with nothing left is done, its image in its node's store.
    fn settle_pulls(&mut self) {
        let elapsed = self.now.saturating_since(self.pulls.at).as_secs_f64();
        self.pulls.at = self.now;
        if elapsed > 0.0 && !self.pulls.active.is_empty() {
            let rate = self.config.registry.rate(self.pulls.active.len());
            for (_, left, _) in &mut self.pulls.active {
                *left = (*left - rate * elapsed).max(0.0);
            }
        }
        while let Some(k) = self.pulls.active.iter().position(|(_, left, _)| *left < 1.0) {
            let (i, _, image) = self.pulls.active.remove(k);
            self.nodes[i].pulled = Some(image);
            self.record(i, TraceKind::ImagePulled);
        }
    }

    /// Whether node `i` must pull `image` before its Upgrade call can answer: it is up and
    /// running, the image is not in its store yet, and calls take time.
    pub(crate) fn needs_pull(&self, i: usize, image: &str) -> bool {
        let node = &self.nodes[i];
        self.config.realism.takes_time()
            && node.reachable()
            && node.phase == NodePhase::Running
            && node.pulled.as_deref() != Some(image)
    }

    /// Starts node `i`'s pull of the installer image (a pull already under way on it
    /// goes on: containerd shares one fetch).
    pub(crate) fn start_pull(&mut self, i: usize, image: &str) {
        self.settle_pulls();
        if self.pulls.active.iter().all(|(n, _, _)| *n != i) {
            self.pulls.active.push((i, self.config.registry.image_bytes as f64, image.to_owned()));
            self.record(i, TraceKind::ImagePullStart);
        }
    }

    /// How long node `i`'s pull needs at the rate it now gets, or `None` once it is done
    /// (then the image is in its store).
    pub(crate) fn pull_left(&mut self, i: usize) -> Option<Duration> {
        self.settle_pulls();
        let left = self.pulls.active.iter().find(|(n, _, _)| *n == i)?.1;
        let rate = self.config.registry.rate(self.pulls.active.len());
        // Whole milliseconds, rounded up: the pull is done when the time is up.
        Some(Duration::from_millis((left / rate * 1000.0).ceil() as u64).max(Duration::from_millis(1)))
    }

    /// How many pulls are under way.
    #[must_use]
    pub fn pulls_under_way(&self) -> usize {
        self.pulls.active.len()
    }

    /// What the preflight gate reads of the simulated workloads. Each worker runs a pod of
    /// two Deployments of the `billing` namespace, one replica per worker: `invoice-api`,
    /// which the PodDisruptionBudget `billing/invoice-api` covers (at zero while the
    /// pdb-blocked fault holds it, else allowing one disruption), and `invoice-worker`;
    /// every node runs a DaemonSet pod (`kube-system/cilium`) and each control plane its
    /// API server as a mirror pod. A pod is Ready when its node is and it is not being
    /// evicted. A cluster of one worker runs no such service (one replica could not stay
    /// up while its node drains, and the gate would rightly hold it for ever): its billing
    /// pods are bare pods, which a drain leaves.
    #[must_use]
    ///
    /// Of the nodes not asked about it reports, for each Deployment, one Ready pod if it
    /// has one (all the gate needs to see that not every Ready pod runs on a node asked
    /// about): a cluster of 5,000 workers would otherwise build 20,000 pods per question.
    pub fn preflight_facts(&mut self, asked: &[&str]) -> ichor_upgrade_core::preflight::ClusterFacts {
        use ichor_upgrade_core::labels::LabelSelector;
        use ichor_upgrade_core::preflight::{
            BudgetFacts, ClusterFacts, Owner, PodFacts, ReplicaSetFacts, WorkloadFacts, WorkloadKind,
        };
        const DEPLOYMENTS: [&str; 2] = ["invoice-api", "invoice-worker"];
        let census = self.census();
        let workers = i32::try_from(self.config.workers).unwrap_or(i32::MAX);
        let replicated = workers >= 2;
        // A pod's app label; it is part of a Deployment the preflight is told of only when
        // the cluster has two workers or more (one replica per worker: on one worker the
        // single-replica rule would hold it for ever). The budget over `invoice-api` is
        // always told of: it is the one that refuses evictions under `pdb-blocked`.
        let app = |pod: &SimPod| {
            DEPLOYMENTS.into_iter().find(|d| pod.name.strip_prefix(d).is_some_and(|rest| rest.starts_with('-')))
        };
        let healthy = i32::try_from(census.invoice_api_ready).unwrap_or(i32::MAX);
        let pod_facts = |node: &SimNode, pod: &SimPod| {
            let ready = node.ready && pod.terminating_until.is_none();
            let label = app(pod);
            let app = label.filter(|_| replicated);
            let owner = match (pod.daemonset, pod.mirror, app) {
                (true, _, _) => Some(Owner { kind: "DaemonSet".into(), name: "cilium".into() }),
                (_, true, _) => Some(Owner { kind: "Node".into(), name: node.name.clone() }),
                (_, _, Some(d)) => Some(Owner { kind: "ReplicaSet".into(), name: format!("{d}-7d9f") }),
                _ => None,
            };
            PodFacts {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                node: Some(node.name.clone()),
                ready,
                labels: [("app".to_owned(), label.unwrap_or(pod.name.as_str()).to_owned())].into(),
                owner,
                mirror: pod.mirror,
            }
        };
        // The nodes asked about, in node order: every pod. One lookup each.
        let mut here: Vec<usize> = asked.iter().filter_map(|name| self.node_index(name)).collect();
        here.sort_unstable();
        here.dedup();
        let mut pods = Vec::new();
        for &i in &here {
            let node = &self.nodes[i];
            if !node.removed {
                pods.extend(node.pods.iter().map(|pod| pod_facts(node, pod)));
            }
        }
        // Elsewhere, one Ready pod of each Deployment: the first nodes in order have them.
        if replicated {
            let mut shown_elsewhere = [false; 2];
            for (i, node) in self.nodes.iter().enumerate() {
                if shown_elsewhere.iter().all(|s| *s) {
                    break;
                }
                if node.removed || !node.ready || here.binary_search(&i).is_ok() {
                    continue;
                }
                for pod in node.pods.iter().filter(|p| p.terminating_until.is_none()) {
                    let Some(k) = app(pod).and_then(|d| DEPLOYMENTS.iter().position(|x| *x == d)) else { continue };
                    if !shown_elsewhere[k] {
                        shown_elsewhere[k] = true;
                        pods.push(pod_facts(node, pod));
                    }
                }
            }
        }
        let blocked = self.pdb_blocked_until.is_some_and(|t| self.now < t);
        let desired = if blocked { healthy } else { healthy - 1 };
        let mut facts = ClusterFacts {
            nodes: Vec::new(),
            pods,
            budgets: [BudgetFacts {
                namespace: "billing".into(),
                name: "invoice-api".into(),
                selector: Some(LabelSelector {
                    match_labels: [("app".to_owned(), "invoice-api".to_owned())].into(),
                    ..LabelSelector::default()
                }),
                disruptions_allowed: (healthy - desired).max(0),
                current_healthy: healthy,
                desired_healthy: desired,
            }]
            .into(),
            workloads: DEPLOYMENTS
                .iter()
                .filter(|_| replicated)
                .map(|d| WorkloadFacts {
                    kind: WorkloadKind::Deployment,
                    namespace: "billing".into(),
                    name: (*d).into(),
                    replicas: workers,
                })
                .collect(),
            replica_sets: DEPLOYMENTS
                .iter()
                .filter(|_| replicated)
                .map(|d| ReplicaSetFacts {
                    namespace: "billing".into(),
                    name: format!("{d}-7d9f"),
                    replicas: workers,
                    deployment: Some((*d).into()),
                })
                .collect(),
        };
        if census.fault_pods > 0 {
            self.fault_workloads(asked, &mut facts);
        }
        facts
    }

    /// The workloads the pdb-zero and single-replica faults add: their pods on the nodes
    /// asked about, and one Ready pod elsewhere each, as the preflight reads them.
    fn fault_workloads(&self, asked: &[&str], facts: &mut ichor_upgrade_core::preflight::ClusterFacts) {
        use ichor_upgrade_core::labels::LabelSelector;
        use ichor_upgrade_core::preflight::{
            BudgetFacts, Owner, PodFacts, ReplicaSetFacts, WorkloadFacts, WorkloadKind,
        };
        for (namespace, app) in [LEDGER, EXPORTER] {
            let placed: Vec<(usize, &SimPod)> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| !n.removed)
                .flat_map(|(i, n)| n.pods.iter().map(move |p| (i, p)))
                .filter(|(_, p)| p.namespace == namespace && p.name.starts_with(app))
                .collect();
            // Once its fault is over the workload blocks nothing: the budget allows a
            // disruption again, the Deployment was scaled up (on a one-worker cluster, where
            // no second replica could run elsewhere, it is left out altogether).
            let over =
                if (namespace, app) == LEDGER { !self.ledger_at_zero() } else { self.single_replica_until.is_none() };
            let lone_worker = self.nodes.iter().filter(|n| n.role == MachineRole::Worker && !n.removed).count() < 2;
            if placed.is_empty() || (over && lone_worker) {
                continue;
            }
            let scaled = (namespace, app) == EXPORTER && over;
            let replicas = i32::try_from(placed.len()).unwrap_or(i32::MAX) + i32::from(scaled);
            let mut healthy = 0_i32;
            let mut shown_elsewhere = false;
            let pod = |name: String, node: String, ready: bool| PodFacts {
                namespace: namespace.into(),
                name,
                node: Some(node),
                ready,
                labels: [("app".to_owned(), app.to_owned())].into(),
                owner: Some(Owner { kind: "ReplicaSet".into(), name: format!("{app}-5c4b") }),
                mirror: false,
            };
            for (i, p) in &placed {
                let node = &self.nodes[*i];
                let ready = node.ready && p.terminating_until.is_none();
                healthy += i32::from(ready);
                let here = asked.contains(&node.name.as_str());
                if here || (ready && !shown_elsewhere) {
                    shown_elsewhere |= !here;
                    facts.pods.push(pod(p.name.clone(), node.name.clone(), ready));
                }
            }
            if scaled {
                let (i, _) = placed[0];
                let other = self
                    .nodes
                    .iter()
                    .find(|n| n.role == MachineRole::Worker && !n.removed && n.name != self.nodes[i].name && n.ready);
                if let Some(other) = other {
                    facts.pods.push(pod(format!("{app}-1"), other.name.clone(), true));
                }
            }
            facts.workloads.push(WorkloadFacts {
                kind: WorkloadKind::Deployment,
                namespace: namespace.into(),
                name: app.into(),
                replicas,
            });
            facts.replica_sets.push(ReplicaSetFacts {
                namespace: namespace.into(),
                name: format!("{app}-5c4b"),
                replicas,
                deployment: Some(app.into()),
            });
            if (namespace, app) == LEDGER {
                let zero = self.ledger_at_zero();
                facts.budgets.push(BudgetFacts {
                    namespace: namespace.into(),
                    name: app.into(),
                    selector: Some(LabelSelector {
                        match_labels: [("app".to_owned(), app.to_owned())].into(),
                        ..LabelSelector::default()
                    }),
                    disruptions_allowed: if zero { 0 } else { 1 },
                    current_healthy: healthy,
                    desired_healthy: if zero { healthy } else { healthy - 1 },
                });
            }
        }
    }

    /// A watch event about a change made now, reaching the controller after a drawn delay.
    pub(crate) fn watch_event(&mut self) {
        self.watch_event_about(None);
    }

    /// A watch event about node `storage`'s storage (a replica gone), which tells the
    /// controller to look again at the machine evacuating there.
    fn watch_event_about(&mut self, storage: Option<usize>) {
        let delay = self.latency_rng.in_range(self.config.realism.watch_delay_ms.clone());
        let at = self.now.saturating_add(Duration::from_millis(delay));
        self.deliveries.push(Reverse((at, storage)));
    }

    /// When the next watch event reaches the controller, if one is on its way.
    #[must_use]
    pub fn next_delivery(&self) -> Option<Timestamp> {
        self.deliveries.peek().map(|Reverse((t, _))| *t)
    }

    /// Takes every watch event delivered by now (the controller's queue folds them into
    /// one pass); the names of the nodes whose storage they were about.
    pub fn take_deliveries(&mut self) -> Vec<String> {
        let mut storage = Vec::new();
        while let Some(Reverse((t, node))) = self.deliveries.peek().copied() {
            if t > self.now {
                break;
            }
            self.deliveries.pop();
            if let Some(i) = node {
                storage.push(self.nodes[i].name.clone());
            }
        }
        storage
    }

    /// A drawn API latency.
    pub(crate) fn api_latency(&mut self) -> Duration {
        Duration::from_millis(self.latency_rng.in_range(self.config.realism.api_latency_ms.clone()))
    }

    /// Starts virtual time on Tokio's clock (which must be paused, see
    /// [`super::runtime`]): from now on every call brings the world to the clock's time.
    pub fn start_clock(&mut self) {
        if self.clock.is_none() && self.config.realism.takes_time() {
            self.clock = Some((tokio::time::Instant::now(), self.now));
        }
    }

    /// Brings the world to the clock's time, if virtual time runs.
    pub fn sync_clock(&mut self) {
        let Some((instant, at)) = self.clock else { return };
        let t = at.saturating_add(instant.elapsed());
        self.advance_to(t.max(self.now));
        self.clock = Some((tokio::time::Instant::now(), self.now));
    }

    /// Schedules a change of what the Node shows, `after` from now, plus the watch's delay
    /// (the controller's cache shows it when the event arrives), and the event itself.
    fn view_change(&mut self, i: usize, after: Duration, change: ViewChange) {
        let delay = Duration::from_millis(self.latency_rng.in_range(self.config.realism.watch_delay_ms.clone()));
        let at = self.now.saturating_add(after).saturating_add(delay);
        let pending = &mut self.nodes[i].view.pending;
        let k = pending.partition_point(|(t, _)| *t <= at);
        pending.insert(k, (at, change));
        self.changed(i);
    }

    /// Applies the Node's due view changes.
    fn apply_view(&mut self, i: usize, now: Timestamp) {
        while let Some((at, change)) = self.nodes[i].view.pending.first().cloned().filter(|(at, _)| *at <= now) {
            self.nodes[i].view.pending.remove(0);
            let node = &mut self.nodes[i];
            let changed = match change {
                ViewChange::NotReady if !node.ready && node.view.ready => {
                    node.view.ready = false;
                    true
                }
                ViewChange::Booted => {
                    // The kubelet's first report: NotReady until the node is (if it already
                    // is, the report says so).
                    node.view.boot_id = node.boot_id.clone();
                    node.view.version = node.version.clone();
                    node.view.ready = node.ready;
                    true
                }
                ViewChange::Ready if node.ready && !node.view.ready => {
                    node.view.ready = true;
                    node.view.boot_id = node.boot_id.clone();
                    node.view.version = node.version.clone();
                    true
                }
                ViewChange::NotReady | ViewChange::Ready => false,
            };
            if changed {
                if let Some(cached) = self.read_cache.nodes.get_mut(i) {
                    *cached = None;
                }
                self.deliveries.push(Reverse((at, None)));
                if !self.nodes[i].view.ready && matches!(change, ViewChange::NotReady) {
                    self.record(i, TraceKind::ShownNotReady);
                }
            }
        }
    }

    /// The node's kubelet stopped (or its Node went silent) now.
    pub(crate) fn kubelet_lost_now(&mut self, i: usize) {
        let grace = self.config.realism.node_monitor_grace;
        self.view_change(i, grace, ViewChange::NotReady);
    }

    /// Node `i` went down for its reboot now: its kubelet stopped, its etcd member left the
    /// list.
    pub(crate) fn node_went_down(&mut self, i: usize) {
        self.kubelet_lost_now(i);
        if self.nodes[i].etcd.is_some() {
            self.nodes[i].etcd = Some(EtcdMember::Missing);
            self.record(i, TraceKind::EtcdMemberMissing);
        }
        self.changed(i);
    }

    /// The node turned Ready now.
    pub(crate) fn kubelet_ready_now(&mut self, i: usize) {
        self.view_change(i, Duration::ZERO, ViewChange::Ready);
        self.volumes_node_back(i);
    }

    /// Records a trace event about node `i`.
    pub(crate) fn record(&mut self, i: usize, kind: TraceKind) {
        self.record_why(i, kind, None);
    }

    /// Records a trace event about node `i`, with its reason and message.
    pub(crate) fn record_why(&mut self, i: usize, kind: TraceKind, why: Option<(String, String)>) {
        let node = &self.nodes[i];
        let (reason, message) = why.map_or((None, None), |(r, m)| (Some(r), Some(m)));
        self.trace.push(TraceEvent {
            t: self.now.saturating_since(self.start).as_secs_f64(),
            node: node.name.clone(),
            role: node.role.as_str(),
            event: kind,
            version: Some(node.version.to_string()),
            boot_id: Some(node.boot_id.clone()),
            reason,
            message,
            component: None,
            bytes: None,
        });
    }

    /// Records a trace event about a Kubernetes component of node `i`.
    pub(crate) fn record_component(&mut self, i: usize, kind: TraceKind, component: Component, message: String) {
        let node = &self.nodes[i];
        self.trace.push(TraceEvent {
            t: self.now.saturating_since(self.start).as_secs_f64(),
            node: node.name.clone(),
            role: node.role.as_str(),
            event: kind,
            version: Some(node.version.to_string()),
            boot_id: None,
            reason: None,
            message: Some(message),
            component: Some(component.as_str()),
            bytes: None,
        });
    }

    /// Records a trace event about the cluster as a whole (its API servers).
    fn record_cluster(&mut self, kind: TraceKind) {
        self.trace.push(TraceEvent {
            t: self.now.saturating_since(self.start).as_secs_f64(),
            node: "cluster".to_owned(),
            role: "cluster",
            event: kind,
            version: None,
            boot_id: None,
            reason: None,
            message: None,
            component: None,
            bytes: None,
        });
    }

    /// Records a trace event about the operation itself, with its reason and message.
    pub(crate) fn record_operation(&mut self, kind: TraceKind, reason: &str, message: String) {
        self.trace.push(TraceEvent {
            t: self.now.saturating_since(self.start).as_secs_f64(),
            node: "operation".to_owned(),
            role: "operation",
            event: kind,
            version: None,
            boot_id: None,
            reason: Some(reason.to_owned()),
            message: Some(message),
            component: None,
            bytes: None,
        });
    }

    /// Any node or machine may have changed: every node's next change is read again, and
    /// the shared copies of what the controller reads are made again.
    pub(crate) fn touched(&mut self) {
        self.timers.all = true;
        self.census.all = true;
        self.read_cache = ReadCache::default();
    }

    /// The index of the Node `read` names, if it still shows what it showed at that read
    /// (its resourceVersion unchanged), as an API server applies a write made under a
    /// resourceVersion: else [`KubeError::Conflict`] (or `NotFound`).
    pub(crate) fn node_written_under(&mut self, read: &NodeInfo) -> Result<usize, KubeError> {
        let node = &read.name;
        let i = self.node_index(node).ok_or_else(|| KubeError::NotFound(format!("Node {node}")))?;
        let now = self.node_info(i);
        if now.resource_version != read.resource_version {
            return Err(KubeError::Conflict(format!(
                "Node {node}: written under resourceVersion {}, it is now at {}",
                read.resource_version, now.resource_version
            )));
        }
        Ok(i)
    }

    /// Node `i`'s object was written (its labels, annotations or cordon): its shared copy is
    /// made again, and its next change read again.
    pub(crate) fn node_edited(&mut self, i: usize) {
        if let Some(cached) = self.read_cache.nodes.get_mut(i) {
            *cached = None;
        }
        self.changed(i);
    }

    /// Node `i` changed (its next change is read again).
    pub(crate) fn changed(&mut self, i: usize) {
        self.timers.dirty.push(i);
        self.census.dirty.push(i);
    }

    /// The earliest time something changes by itself, if anything will.
    #[must_use]
    pub fn next_event_at(&mut self) -> Option<Timestamp> {
        self.refresh_timers();
        let mut next = self.timers.queue.first().map(|(t, _)| *t);
        if let Some((from, until)) = self.outage {
            next = Timestamp::min_opt(next, Some(if self.now < from { from } else { until }).filter(|t| *t > self.now));
        }
        next = Timestamp::min_opt(next, self.pdb_blocked_until.filter(|t| *t > self.now));
        next = Timestamp::min_opt(next, self.pdb_zero_until.filter(|t| *t > self.now));
        next = Timestamp::min_opt(next, self.single_replica_until.filter(|t| *t > self.now));
        next = Timestamp::min_opt(next, self.stop_during_install.due().map(|t| t.max(self.now)));
        debug_assert_eq!(next, self.scan_next_event(), "a node changed without being marked");
        next
    }

    /// Reads again the next change of every node marked changed.
    fn refresh_timers(&mut self) {
        let timers = &mut self.timers;
        if timers.all {
            timers.all = false;
            timers.dirty.clear();
            timers.at = self.nodes.iter().map(node_next_change).collect();
            timers.queue = timers.at.iter().enumerate().filter_map(|(i, t)| t.map(|t| (t, i))).collect();
            return;
        }
        for i in timers.dirty.drain(..) {
            let next = node_next_change(&self.nodes[i]);
            if timers.at[i] != next {
                if let Some(t) = timers.at[i] {
                    timers.queue.remove(&(t, i));
                }
                if let Some(t) = next {
                    timers.queue.insert((t, i));
                }
                timers.at[i] = next;
            }
        }
    }

    /// The next change found by looking at every node: what the index must agree with.
    fn scan_next_event(&self) -> Option<Timestamp> {
        let mut next = self.nodes.iter().map(node_next_change).fold(None, Timestamp::min_opt);
        if let Some((from, until)) = self.outage {
            next = Timestamp::min_opt(next, Some(if self.now < from { from } else { until }).filter(|t| *t > self.now));
        }
        next = Timestamp::min_opt(next, self.pdb_zero_until.filter(|t| *t > self.now));
        next = Timestamp::min_opt(next, self.single_replica_until.filter(|t| *t > self.now));
        next = Timestamp::min_opt(next, self.stop_during_install.due().map(|t| t.max(self.now)));
        Timestamp::min_opt(next, self.pdb_blocked_until.filter(|t| *t > self.now))
    }

    /// Moves virtual time forward to `t`, applying every change due on the way, in order.
    pub fn advance_to(&mut self, t: Timestamp) {
        while let Some(next) = self.next_event_at().filter(|next| *next <= t) {
            self.now = self.now.max(next);
            self.apply_due();
        }
        // Nothing is due before `t`: only the clock moves (the world's state is a function
        // of its changes, all applied).
        self.now = self.now.max(t);
    }

    fn apply_due(&mut self) {
        self.refresh_timers();
        let now = self.now;
        // The nodes with a change due, in node order (the order of the draws they make).
        let mut due: Vec<usize> = self.timers.queue.range(..=(now, usize::MAX)).map(|(_, i)| *i).collect();
        due.sort_unstable();
        for i in due {
            if !self.nodes[i].removed {
                self.apply_node(i, now);
            }
            self.changed(i);
        }
        self.apply_stop_during_install(now);
        if let Some((from, until)) = self.outage {
            if now >= from && !self.outage_traced {
                self.outage_traced = true;
                self.record_cluster(TraceKind::ApiOutage);
            }
            if now >= until {
                self.outage = None;
                self.record_cluster(TraceKind::ApiBack);
            }
        }
        if self.pdb_blocked_until.is_some_and(|t| now >= t) {
            self.pdb_blocked_until = None;
        }
        if self.pdb_zero_until.is_some_and(|t| now >= t) {
            self.pdb_zero_until = None;
        }
        if self.single_replica_until.is_some_and(|t| now >= t) {
            self.single_replica_until = None;
        }
        self.measure();
    }

    fn apply_node(&mut self, i: usize, now: Timestamp) {
        if let Some((at, lasting)) = self.nodes[i].not_ready_at.filter(|(at, _)| now >= *at) {
            // A hiccup of a healthy node not yet upgraded (another control plane's call must
            // then wait for it). One already upgraded is spared: on top of its own reboot and
            // verification it would only test the verify bound, not the engine's gate.
            if self.nodes[i].version != self.config.from {
                self.nodes[i].not_ready_at = None;
                return self.apply_node_rest(i, now);
            }
            if self.nodes[i].phase != NodePhase::Running || !self.nodes[i].ready {
                self.nodes[i].not_ready_at = Some((now.saturating_add(secs(60)), lasting));
                return self.apply_node_rest(i, now);
            }
            self.nodes[i].not_ready_at = None;
            let until = at.saturating_add(lasting);
            self.nodes[i].not_ready_until = Some(self.nodes[i].not_ready_until.map_or(until, |t| t.max(until)));
            if self.nodes[i].ready {
                self.nodes[i].ready = false;
                self.record(i, TraceKind::NotReady);
                self.kubelet_lost_now(i);
            }
        }
        self.apply_node_rest(i, now);
    }

    fn apply_node_rest(&mut self, i: usize, now: Timestamp) {
        self.apply_kubernetes(i, now);
        if self.nodes[i].install_run.as_ref().is_some_and(|r| now >= r.until || r.boot_id != self.nodes[i].boot_id) {
            self.finish_install(i);
        }
        if self.nodes[i].not_ready_until.is_some_and(|t| now >= t) {
            self.nodes[i].not_ready_until = None;
            if matches!(self.nodes[i].phase, NodePhase::Running) {
                self.nodes[i].ready = true;
                self.record(i, TraceKind::Ready);
                self.kubelet_ready_now(i);
            }
        }
        match self.nodes[i].phase.clone() {
            NodePhase::Installing { until, into } if now >= until => {
                let reboot = secs(self.nodes[i].drawn.reboot);
                self.nodes[i].phase = NodePhase::Rebooting { until: until.saturating_add(reboot), into };
                self.nodes[i].ready = false;
                self.record(i, TraceKind::RebootStart);
                self.record(i, TraceKind::NotReady);
                self.node_went_down(i);
                self.apply_node(i, now);
            }
            NodePhase::Rebooting { until, into } if now >= until => {
                let ready = secs(self.nodes[i].drawn.ready);
                self.nodes[i].version = into;
                self.nodes[i].boot_id = self.rng.boot_id();
                self.nodes[i].phase = NodePhase::Booting { ready_at: until.saturating_add(ready) };
                self.record(i, TraceKind::RebootEnd);
                let report = self.config.realism.kubelet_report.min(ready);
                self.view_change(i, report, ViewChange::Booted);
                self.apply_node(i, now);
            }
            NodePhase::Booting { ready_at } if now >= ready_at => {
                self.nodes[i].phase = NodePhase::Running;
                if self.nodes[i].not_ready_until.is_none() {
                    self.nodes[i].ready = true;
                    self.record(i, TraceKind::Ready);
                    self.kubelet_ready_now(i);
                }
                if self.nodes[i].etcd.is_some() {
                    match self.nodes[i].etcd_lag.take() {
                        Some(lag) => {
                            self.nodes[i].etcd = Some(EtcdMember::Learner { until: ready_at.saturating_add(lag) })
                        }
                        None => {
                            self.nodes[i].etcd = Some(EtcdMember::Voter);
                            self.record(i, TraceKind::EtcdMemberBack);
                        }
                    }
                }
            }
            NodePhase::Resetting { until } if now >= until => {
                self.nodes[i].phase = NodePhase::PoweredOff;
                self.nodes[i].ready = false;
                self.nodes[i].etcd = None;
                self.record(i, TraceKind::NotReady);
                self.kubelet_lost_now(i);
            }
            NodePhase::Running
            | NodePhase::Installing { .. }
            | NodePhase::Rebooting { .. }
            | NodePhase::Booting { .. }
            | NodePhase::Resetting { .. }
            | NodePhase::PoweredOff => {}
        }
        let node = &mut self.nodes[i];
        if node.unschedulable {
            // The engine's drain of a cordoned node: the replacements of the pods it evicts
            // come back here once the cordon is lifted (by the engine; a test that lifts a
            // person's cordon brings them back itself).
            for pod in node.pods.iter().filter(|p| p.terminating_until.is_some_and(|t| now >= t)) {
                node.evicted.push(SimPod { terminating_until: None, ..pod.clone() });
            }
        }
        node.pods.retain(|p| p.terminating_until.is_none_or(|t| now < t));
        if let Some(EtcdMember::Learner { until }) = self.nodes[i].etcd
            && now >= until
        {
            self.nodes[i].etcd = Some(EtcdMember::Voter);
            self.record(i, TraceKind::EtcdMemberBack);
        }
        self.move_replicas(i, now);
        self.apply_view(i, now);
    }

    fn move_replicas(&mut self, i: usize, now: Timestamp) {
        loop {
            let Some(at) = self.nodes[i].evacuation.as_ref().and_then(|e| e.next_move_at) else { return };
            if now < at || self.nodes[i].replicas == 0 {
                return;
            }
            self.nodes[i].replicas -= 1;
            let left = self.nodes[i].replicas;
            // A Longhorn replica object deleted: the controller watches them, and is woken
            // when the node's last one is gone (its watch counts them in its store; before,
            // nothing it decides changes).
            if left == 0 {
                self.watch_event_about(Some(i));
            }
            let next = if left == 0 {
                self.record(i, TraceKind::Evacuated);
                None
            } else {
                let k = self.nodes[i].drawn.replica_moves.len().saturating_sub(left as usize);
                let step = self.nodes[i].drawn.replica_moves.get(k).copied().unwrap_or(10);
                Some(at.saturating_add(secs(step)))
            };
            if let Some(e) = self.nodes[i].evacuation.as_mut() {
                e.next_move_at = next;
            }
        }
    }

    /// Updates the maxima of nodes down and the minimum of etcd voters, looking again only
    /// at the nodes changed since the last time (every change marks its node).
    pub(crate) fn measure(&mut self) {
        let sum = self.census();
        let c = &mut self.counters;
        c.max_control_planes_down = c.max_control_planes_down.max(sum.control_planes_down);
        c.max_workers_down = c.max_workers_down.max(sum.workers_down);
        if sum.members > 0 {
            c.min_etcd_voters = Some(c.min_etcd_voters.map_or(sum.voters, |m| m.min(sum.voters)));
        }
        if !self.volumes.volumes.is_empty() {
            self.measure_volumes();
        }
    }

    /// The census brought up to date: the nodes changed since the last time counted again.
    fn census(&mut self) -> Share {
        let census = &mut self.census;
        if census.all || census.of.len() != self.nodes.len() {
            census.all = false;
            census.dirty.clear();
            census.of = self.nodes.iter().map(Share::of).collect();
            census.sum = census.of.iter().fold(Share::default(), |a, b| a.add(*b));
        }
        for i in census.dirty.drain(..) {
            let share = Share::of(&self.nodes[i]);
            census.sum = census.sum.sub(census.of[i]).add(share);
            census.of[i] = share;
        }
        debug_assert_eq!(
            census.of,
            self.nodes.iter().map(Share::of).collect::<Vec<_>>(),
            "a node changed without being marked"
        );
        census.sum
    }

    /// Whether the APIs refuse calls now.
    #[must_use]
    pub fn in_outage(&self) -> bool {
        self.outage.is_some_and(|(from, until)| self.now >= from && self.now < until)
    }

    /// Counts a call and says whether it may take effect (see [`CrashState`]).
    pub(crate) fn enter(&mut self) -> Gate {
        let crash = &mut self.crash;
        if crash.dead {
            return Gate::Refuse;
        }
        crash.calls += 1;
        if crash.crash_at == Some(crash.calls) {
            crash.crash_at = None;
            crash.dead = true;
            if crash.before_effect {
                return Gate::Refuse;
            }
            return Gate::Go { killed: true };
        }
        if self.in_outage() {
            return Gate::Refuse;
        }
        Gate::Go { killed: false }
    }

    /// Arms a crash `after` calls from now, before or after that call's effect.
    pub fn arm_crash(&mut self, after: u64, before_effect: bool) {
        self.crash.crash_at = Some(self.crash.calls + after.max(1));
        self.crash.before_effect = before_effect;
    }

    /// Begins a lifecycle install on node `i` (its call sent at `sent_at`): it ends by
    /// itself after the node's drawn install time (at once under the oracle, which counts
    /// that time in the reboot).
    pub(crate) fn start_install(&mut self, i: usize, version: Option<TalosVersion>, sent_at: Timestamp) {
        let takes = if self.config.realism.takes_time() { secs(self.nodes[i].drawn.install) } else { Duration::ZERO };
        let run = InstallRun {
            until: self.now.saturating_add(takes),
            boot_id: self.nodes[i].boot_id.clone(),
            version,
            sent_at,
            restarts: self.counters.restarts,
        };
        self.nodes[i].installing = true;
        self.nodes[i].install_run = Some(run);
        self.record(i, TraceKind::InstallStart);
        if takes.is_zero() {
            self.finish_install(i);
        } else {
            self.changed(i);
        }
    }

    /// Ends node `i`'s install: the other slot holds its version (exit 0), unless the node
    /// rebooted first (then it never finished) or the image was no installer (exit 2).
    fn finish_install(&mut self, i: usize) {
        let Some(run) = self.nodes[i].install_run.take() else { return };
        self.nodes[i].installing = false;
        if self.nodes[i].boot_id != run.boot_id {
            return;
        }
        let Some(version) = run.version else {
            self.nodes[i].install_exit = Some((run.boot_id, 2));
            return;
        };
        self.nodes[i].installed = Some(version);
        self.nodes[i].install_exit = Some((run.boot_id.clone(), 0));
        let record = LifecycleRecord {
            node: self.nodes[i].name.clone(),
            boot_id: run.boot_id,
            at: self.now,
            sent_at: run.sent_at,
            restarts: run.restarts,
        };
        self.installs.push(record);
        self.counters.install_calls += 1;
        self.record(i, TraceKind::Installed);
    }

    /// If the controller died, restarts it and says so. A crash armed for a later call
    /// stays armed.
    pub fn take_restart(&mut self) -> bool {
        if !self.crash.dead {
            return false;
        }
        self.crash.dead = false;
        self.counters.restarts += 1;
        true
    }
}

/// When node `n` next changes by itself, if it will.
fn node_next_change(n: &SimNode) -> Option<Timestamp> {
    if n.removed {
        return None;
    }
    let mut next = match &n.phase {
        NodePhase::Running | NodePhase::PoweredOff => None,
        NodePhase::Installing { until, .. } | NodePhase::Rebooting { until, .. } | NodePhase::Resetting { until } => {
            Some(*until)
        }
        NodePhase::Booting { ready_at } => Some(*ready_at),
    };
    let mut consider = |t: Option<Timestamp>| next = Timestamp::min_opt(next, t);
    for pod in &n.pods {
        consider(pod.terminating_until);
    }
    consider(n.not_ready_until);
    consider(n.not_ready_at.map(|(at, _)| at));
    if let Some(EtcdMember::Learner { until }) = n.etcd {
        consider(Some(until));
    }
    consider(n.evacuation.as_ref().and_then(|e| e.next_move_at));
    consider(n.view.pending.first().map(|(t, _)| *t));
    consider(n.install_run.as_ref().map(|r| r.until));
    consider(n.kube.next_change());
    next
}
