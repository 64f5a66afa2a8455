//! The operator's trace: the records of [`ichor_timeline::trace`] (the simulator's), written
//! from what the engine does and sees on a real cluster, so that one tool draws a rollout
//! run by either.
//!
//! A [`Recorder`] is told of every call the engine makes through decorators over its three
//! seams, [`TracedTalos`], [`TracedKube`] and [`TracedStorage`]: each forwards every call
//! unchanged (the same results, the same errors) and, on a success that is a change, records
//! it. Nothing is recorded from a failed call. `t` is the wall-clock seconds since the
//! recorder was made; the records are in time order.
//!
//! | record | when |
//! | --- | --- |
//! | `upgrade-call` | `MachineService.Upgrade` acknowledged |
//! | `image-pull-start`, `image-pulled` | an `ImageService.Pull` of an image not yet pulled there begins; it answers |
//! | `install-start`, `installed` | `LifecycleService.Upgrade` begins; it ends with exit code 0 |
//! | `reboot-call` | `MachineService.Reboot` answered |
//! | `etcd-snapshot` | `EtcdSnapshot` began streaming |
//! | `cordon`, `uncordon` | the engine's cordon written, lifted |
//! | `drain` | the first pod evicted from a node since its cordon |
//! | `shown-not-ready`, `reboot-end`, `ready` | a Node the engine reads turned NotReady; shows a new boot ID (with the version it shows); turned Ready (or shows a new boot ID and is Ready) |
//! | `evacuation-start`, `evacuated`, `evacuation-end` | storage evacuation asked; no replica left on the node; scheduling put back |
//! | `converged` | a machine's `TalosUpgrade` condition written as converged |
//! | `failed` | a machine newly failed in the operation's status, with its reason and message |
//! | `paused`, `resumed` | the operation's phase turned paused, left it (on the failed machine's row, else the operation's) |
//! | `waiting`, `refused` | the operation waits, or is refused, for a reason new since its last status |
//! | `removed` | a Node deleted (a removal) |
//! | `controller-restart` | this replica's controller began to lead (row `controller`) |
//!
//! Talos calls name a machine by its Talos address: the recorder maps addresses to nodes and
//! roles from the machines the engine reads (`KubeApi::machines`), and the node name from
//! the machine's hostname or, without one, Talos's answer to `nodename`. Calls about a
//! machine it has not seen yet, and Nodes that are no machine's, are not recorded.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Instant;

use async_trait::async_trait;
use ichor_executor::StorageApi;
use ichor_executor::kube_api::{
    ClusterInfo, ClusterKubernetesInfo, Event, Eviction, KubeApi, KubeError, LeaseInfo, LeaseWrite, MachineInfo,
    NodeInfo, NodeKubernetesInfo, OperationInfo, PodInfo,
};
use ichor_executor::machine_config::MachineConfig;
use ichor_executor::talos_api::{
    ApplyConfigRequest, EtcdAlarm, EtcdMember, EtcdStatus, ImageInfo, SnapshotStream, TalosApi, TalosError,
};
use ichor_executor::writes::{
    ConditionWrite, KubeWrite, KubeWritten, Seal, StorageWrite, StorageWritten, TalosWrite, TalosWritten,
};
use ichor_storage::{ConditionWriteError, EvacuationRequest, StorageError, StorageObject, StorageReads};
pub use ichor_timeline::trace::{TraceEvent, TraceKind};
use ichor_upgrade_core::changes::ChangeKind;
use ichor_upgrade_core::conditions::{Condition, ConditionStatus, Conditions};
use ichor_upgrade_core::evacuation::EvacuationRecord;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::preflight::ClusterFacts;
use ichor_upgrade_core::status::OperationStatus;
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, reason as upgrade_reason};

/// Where trace records go. Called with the recorder's lock held: it must not block (hand the
/// record to another thread, as [`TraceFile`] does).
pub trait TraceSink: Send + Sync + fmt::Debug {
    /// Takes one record.
    fn record(&self, event: TraceEvent);
}

/// A trace file: JSON lines, appended by a thread of its own, flushed whenever it has
/// written every record handed to it so far. A pass never waits for the disk: when the
/// writer is [`TRACE_BACKLOG`] records behind (a stalled disk), further records are
/// dropped and counted ([`TraceFile::dropped`]) instead.
#[derive(Debug)]
pub struct TraceFile {
    path: PathBuf,
    records: mpsc::SyncSender<TraceEvent>,
    dropped: AtomicU64,
}

/// How many records a [`TraceFile`] holds for its writer before it drops new ones.
pub const TRACE_BACKLOG: usize = 65_536;

impl TraceFile {
    /// Creates (or truncates) the file at `path` and starts its writer.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::create(path)?;
        let (tx, rx) = mpsc::sync_channel::<TraceEvent>(TRACE_BACKLOG);
        let shown = path.display().to_string();
        std::thread::Builder::new().name("ichor-trace".to_owned()).spawn(move || write_records(file, &rx, &shown))?;
        Ok(Self { path: path.to_owned(), records: tx, dropped: AtomicU64::new(0) })
    }

    /// How many records were dropped because the writer was too far behind.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl TraceSink for TraceFile {
    fn record(&self, event: TraceEvent) {
        match self.records.try_send(event) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    let path = self.path.display().to_string();
                    tracing::warn!(path, "the trace's writer is {TRACE_BACKLOG} records behind; dropping records");
                }
            }
            // The writer ends only when the file is dropped.
            Err(mpsc::TrySendError::Disconnected(_)) => {}
        }
    }
}

/// Writes records from `rx` to `file` until every sender is gone; a write error is logged
/// once, and the records after it are dropped.
fn write_records(file: std::fs::File, rx: &mpsc::Receiver<TraceEvent>, path: &str) {
    let mut out = std::io::BufWriter::new(file);
    let mut failed = false;
    while let Ok(first) = rx.recv() {
        let mut result = write_line(&mut out, &first);
        while let Ok(next) = rx.try_recv() {
            result = result.and_then(|()| write_line(&mut out, &next));
        }
        result = result.and_then(|()| out.flush());
        if let Err(e) = result
            && !failed
        {
            failed = true;
            tracing::warn!(path, error = %e, "writing the trace failed; its further records are dropped");
        }
    }
    out.flush().ok();
}

fn write_line(out: &mut impl Write, event: &TraceEvent) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, event)?;
    out.write_all(b"\n")
}

/// Records kept in memory, for tests and for embedders that draw them themselves.
#[derive(Debug, Default)]
pub struct TraceBuffer(Mutex<Vec<TraceEvent>>);

impl TraceBuffer {
    /// The records so far, in order.
    #[must_use]
    pub fn events(&self) -> Vec<TraceEvent> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl TraceSink for TraceBuffer {
    fn record(&self, event: TraceEvent) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(event);
    }
}

/// Turns what the engine does and sees into trace records (see the module's table).
///
/// It remembers machines by name: the machines of one recorder must have unique names (one
/// namespace's). [`Recorder::scope`] gives another, for another namespace, on the same sink
/// and clock.
#[derive(Debug)]
pub struct Recorder {
    shared: Arc<Shared>,
    state: Mutex<State>,
}

/// What the recorders of one trace share.
#[derive(Debug)]
struct Shared {
    sink: Arc<dyn TraceSink>,
    start: Instant,
    /// Held while a record is stamped and handed over: the records are in time order.
    order: Mutex<()>,
    /// This replica has led before: leading again is a restart of the controller's work.
    led: std::sync::atomic::AtomicBool,
}

/// What the recorder remembers to tell a change from a repeat.
#[derive(Debug, Default)]
struct State {
    /// By machine name.
    machines: HashMap<String, Machine>,
    /// Machine names by Talos address.
    by_address: HashMap<String, String>,
    /// Node names Talos gave, by address.
    nodenames: HashMap<String, String>,
    /// The role of each machine's node, by node name.
    node_roles: HashMap<String, &'static str>,
    /// What each machine's Node last showed, by node name.
    nodes: HashMap<String, NodeSeen>,
    /// The node of each pod the engine listed, by (namespace, name).
    pods: HashMap<(String, String), String>,
    /// Nodes with a drain recorded since their last cordon.
    drained: HashSet<String>,
    /// Storage evacuations, by node name.
    evacuations: HashMap<String, Evacuation>,
    /// The (address, image) pairs pulled.
    pulled: HashSet<(String, String)>,
    /// The last status of each operation, as read or written.
    statuses: HashMap<String, OperationStatus>,
    /// The last `TalosUpgrade` condition of each machine, as read or written.
    upgrades: HashMap<String, Option<Condition>>,
}

#[derive(Debug)]
struct Machine {
    role: MachineRole,
    address: String,
    hostname: Option<String>,
}

#[derive(Debug)]
struct NodeSeen {
    ready: bool,
    boot_id: String,
    version: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evacuation {
    Open { evacuated: bool },
    Closed,
}

/// Who a record is about.
struct Subject {
    node: String,
    role: &'static str,
}

impl Recorder {
    /// A recorder into `sink`, its time starting now.
    #[must_use]
    pub fn new(sink: Arc<dyn TraceSink>) -> Self {
        let shared = Shared { sink, start: Instant::now(), order: Mutex::new(()), led: false.into() };
        Self { shared: Arc::new(shared), state: Mutex::new(State::default()) }
    }

    /// A recorder into the same sink on the same clock, remembering nothing yet: for the
    /// machines of another namespace.
    #[must_use]
    pub fn scope(&self) -> Self {
        Self { shared: Arc::clone(&self.shared), state: Mutex::new(State::default()) }
    }

    /// Records that this replica's controller began to lead again after its leadership
    /// lapsed (a `controller-restart`: it acts again from what the cluster shows, as a
    /// restarted controller does); the first time it leads is the trace's start, not
    /// recorded.
    pub fn controller_started(&self, identity: &str) {
        if !self.shared.led.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let state = self.lock();
        let subject = Subject { node: "controller".to_owned(), role: "controller" };
        let why =
            Some(("LeadingAgain".to_owned(), format!("{identity} leads again and acts from what the cluster shows")));
        self.emit(&state, &subject, TraceKind::ControllerRestart, why);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands one record to the sink, stamped now (under the shared order lock: records
    /// are in time order).
    fn emit(&self, state: &State, subject: &Subject, event: TraceKind, why: Option<(String, String)>) {
        self.emit_about(state, subject, event, why, None);
    }

    fn emit_about(
        &self,
        state: &State,
        subject: &Subject,
        event: TraceKind,
        why: Option<(String, String)>,
        component: Option<&'static str>,
    ) {
        let seen = state.nodes.get(&subject.node);
        let (reason, message) = why.map_or((None, None), |(r, m)| (Some(r), Some(m)));
        let _order = self.shared.order.lock().unwrap_or_else(PoisonError::into_inner);
        self.shared.sink.record(TraceEvent {
            t: self.shared.start.elapsed().as_secs_f64(),
            node: subject.node.clone(),
            role: subject.role,
            event,
            version: seen.and_then(|s| s.version.clone()),
            boot_id: seen.map(|s| s.boot_id.clone()).filter(|b| !b.is_empty()),
            reason,
            message,
            component,
            bytes: None,
        });
    }

    // ----- what the Talos API did

    /// A Kubernetes upgrade's apply of `component`'s image, about to be sent to `address`.
    fn config_apply(&self, address: &str, component: &'static str) {
        let state = self.lock();
        if let Some(subject) = state.by_talos_address(address) {
            self.emit_about(&state, &subject, TraceKind::ConfigApply, None, Some(component));
        }
    }

    fn talos_call(&self, address: &str, event: TraceKind) {
        let state = self.lock();
        if let Some(subject) = state.by_talos_address(address) {
            self.emit(&state, &subject, event, None);
        }
    }

    fn nodename(&self, address: &str, name: &str) {
        let mut state = self.lock();
        if state.nodenames.get(address).is_some_and(|n| n == name) {
            return;
        }
        state.nodenames.insert(address.to_owned(), name.to_owned());
        if let Some(subject) = state.by_talos_address(address) {
            state.node_roles.insert(subject.node, subject.role);
        }
    }

    /// Whether a pull of `image` onto `address` begins a pull not recorded yet (and records
    /// its start).
    fn pull_started(&self, address: &str, image: &str) -> bool {
        let state = self.lock();
        if state.pulled.contains(&(address.to_owned(), image.to_owned())) {
            return false;
        }
        if let Some(subject) = state.by_talos_address(address) {
            self.emit(&state, &subject, TraceKind::ImagePullStart, None);
        }
        true
    }

    fn pulled(&self, address: &str, image: &str) {
        let mut state = self.lock();
        if state.pulled.insert((address.to_owned(), image.to_owned()))
            && let Some(subject) = state.by_talos_address(address)
        {
            self.emit(&state, &subject, TraceKind::ImagePulled, None);
        }
    }

    // ----- what the Kubernetes API showed and took

    fn machines(&self, machines: &[Arc<MachineInfo>]) {
        let mut state = self.lock();
        for machine in machines {
            state.learn(machine);
        }
    }

    fn machine(&self, machine: &MachineInfo) {
        self.lock().learn(machine);
    }

    fn node_seen(&self, node: &NodeInfo) {
        let mut state = self.lock();
        let Some(role) = state.role_of_node(&node.name) else { return };
        let version = talos_version(&node.os_image);
        let Some(before) = state.nodes.get_mut(&node.name) else {
            let seen =
                NodeSeen { ready: node.ready, boot_id: node.boot_id.clone(), version: version.map(str::to_owned) };
            state.nodes.insert(node.name.clone(), seen);
            // The machine as first seen: in the trace even if nothing happens to it.
            self.emit(&state, &Subject { node: node.name.clone(), role }, TraceKind::Listed, None);
            return;
        };
        let (was_ready, rebooted) = (before.ready, !node.boot_id.is_empty() && node.boot_id != before.boot_id);
        if was_ready == node.ready && !rebooted && before.version.as_deref() == version {
            return;
        }
        let rebooted = rebooted && !before.boot_id.is_empty();
        *before = NodeSeen { ready: node.ready, boot_id: node.boot_id.clone(), version: version.map(str::to_owned) };
        let subject = Subject { node: node.name.clone(), role };
        if was_ready && !node.ready {
            self.emit(&state, &subject, TraceKind::ShownNotReady, None);
        }
        if rebooted {
            self.emit(&state, &subject, TraceKind::RebootEnd, None);
        }
        if node.ready && (!was_ready || rebooted) {
            self.emit(&state, &subject, TraceKind::Ready, None);
        }
    }

    fn node_event(&self, node: &str, event: TraceKind) {
        let mut state = self.lock();
        if matches!(event, TraceKind::Cordon | TraceKind::Uncordon) {
            state.drained.remove(node);
        }
        if let Some(role) = state.role_of_node(node) {
            self.emit(&state, &Subject { node: node.to_owned(), role }, event, None);
        }
    }

    fn pods(&self, node: &str, pods: &[PodInfo]) {
        let mut state = self.lock();
        for pod in pods {
            state.pods.insert((pod.namespace.clone(), pod.name.clone()), node.to_owned());
        }
    }

    fn evicted(&self, namespace: &str, name: &str) {
        let mut state = self.lock();
        let Some(node) = state.pods.remove(&(namespace.to_owned(), name.to_owned())) else { return };
        if !state.drained.insert(node.clone()) {
            return;
        }
        if let Some(role) = state.role_of_node(&node) {
            self.emit(&state, &Subject { node, role }, TraceKind::Drain, None);
        }
    }

    fn conditions_seen(&self, machine: &str, conditions: &Conditions, written: bool) {
        let mut state = self.lock();
        let after = conditions.get(TALOS_UPGRADE).cloned();
        if !written {
            // A read: only a first look, since the store may lag the engine's own writes.
            state.upgrades.entry(machine.to_owned()).or_insert(after);
            return;
        }
        let before = state.upgrades.insert(machine.to_owned(), after.clone()).flatten();
        let converged =
            after.as_ref().is_some_and(|c| c.status == ConditionStatus::False && c.reason == upgrade_reason::CONVERGED);
        if converged
            && before != after
            && let Some(subject) = state.by_machine(machine)
        {
            self.emit(&state, &subject, TraceKind::Converged, None);
        }
    }

    fn status_read(&self, operation: &OperationInfo) {
        self.lock().statuses.entry(operation.name.clone()).or_insert_with(|| operation.status.clone());
    }

    fn status_written(&self, operation: &str, after: &OperationStatus) {
        let mut state = self.lock();
        let before = state.statuses.insert(operation.to_owned(), after.clone()).unwrap_or_default();
        let operation = || Subject { node: "operation".to_owned(), role: "operation" };
        for change in ichor_upgrade_core::changes::status_changes(&before, after) {
            let subject = match &change.machine {
                Some(name) => match state.by_machine(name) {
                    Some(subject) => subject,
                    // A failure is a machine's: one this recorder does not know is not traced.
                    None if change.event == ChangeKind::Failed => continue,
                    None => operation(),
                },
                None => operation(),
            };
            self.emit(&state, &subject, trace_kind(change.event), Some((change.reason, change.message)));
        }
    }

    // ----- what the storage backend took

    fn evacuation_requested(&self, node: &str) {
        let mut state = self.lock();
        let open = matches!(state.evacuations.get(node), Some(Evacuation::Open { .. }));
        if open {
            return;
        }
        state.evacuations.insert(node.to_owned(), Evacuation::Open { evacuated: false });
        if let Some(role) = state.role_of_node(node) {
            self.emit(&state, &Subject { node: node.to_owned(), role }, TraceKind::EvacuationStart, None);
        }
    }

    fn replicas_left(&self, node: &str, replicas: u32) {
        let mut state = self.lock();
        if replicas > 0 {
            return;
        }
        let Some(evacuation @ Evacuation::Open { evacuated: false }) = state.evacuations.get_mut(node) else { return };
        *evacuation = Evacuation::Open { evacuated: true };
        if let Some(role) = state.role_of_node(node) {
            self.emit(&state, &Subject { node: node.to_owned(), role }, TraceKind::Evacuated, None);
        }
    }

    /// Scheduling put back: the end of the node's evacuation, unless it is known to have
    /// ended already (one this recorder did not see begin ends too: it may have begun
    /// before this replica led).
    fn evacuation_ended(&self, node: &str) {
        let mut state = self.lock();
        if state.evacuations.get(node) == Some(&Evacuation::Closed) {
            return;
        }
        state.evacuations.insert(node.to_owned(), Evacuation::Closed);
        if let Some(role) = state.role_of_node(node) {
            self.emit(&state, &Subject { node: node.to_owned(), role }, TraceKind::EvacuationEnd, None);
        }
    }
}

impl State {
    fn learn(&mut self, machine: &MachineInfo) {
        if let Some(known) = self.machines.get(&machine.name)
            && known.role == machine.role
            && known.address == machine.address
            && known.hostname == machine.hostname
        {
            return;
        }
        let known =
            Machine { role: machine.role, address: machine.address.clone(), hostname: machine.hostname.clone() };
        if let Some(old) = self.machines.insert(machine.name.clone(), known)
            && old.address != machine.address
        {
            self.by_address.remove(&old.address);
        }
        self.by_address.insert(machine.address.clone(), machine.name.clone());
        if let Some(subject) = self.by_machine(&machine.name) {
            self.node_roles.insert(subject.node, subject.role);
        }
        self.upgrades.entry(machine.name.clone()).or_insert_with(|| machine.conditions.get(TALOS_UPGRADE).cloned());
    }

    /// The node name of machine `name`: its hostname, else what Talos named it, else its
    /// own name.
    fn node_of(&self, name: &str, machine: &Machine) -> String {
        machine
            .hostname
            .clone()
            .or_else(|| self.nodenames.get(&machine.address).cloned())
            .unwrap_or_else(|| name.to_owned())
    }

    fn by_machine(&self, name: &str) -> Option<Subject> {
        let machine = self.machines.get(name)?;
        Some(Subject { node: self.node_of(name, machine), role: machine.role.as_str() })
    }

    fn by_talos_address(&self, address: &str) -> Option<Subject> {
        self.by_machine(self.by_address.get(address)?)
    }

    fn role_of_node(&self, node: &str) -> Option<&'static str> {
        self.node_roles.get(node).copied()
    }
}

/// The Talos version in a Node's `osImage` (`Talos (v1.14.4)`).
fn talos_version(os_image: &str) -> Option<&str> {
    let inner = os_image.strip_prefix("Talos (")?.strip_suffix(')')?;
    inner.starts_with('v').then_some(inner)
}

/// A Talos API that records what the engine did through it into a [`Recorder`] (none:
/// records nothing) and otherwise forwards every call.
#[derive(Clone, Copy)]
pub struct TracedTalos<'a> {
    /// The Talos API called.
    pub inner: &'a dyn TalosApi,
    /// Where its records go.
    pub recorder: Option<&'a Recorder>,
}

impl fmt::Debug for TracedTalos<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracedTalos").field("recorder", &self.recorder).finish_non_exhaustive()
    }
}

/// What a Talos write's success records, decided before it is sent.
enum OnSuccess<'w> {
    /// Nothing.
    Nothing,
    /// The call, of this kind.
    Call(TraceKind),
    /// The image pulled.
    Pulled(&'w str),
    /// The install, if it exited 0.
    Installed,
}

impl TracedTalos<'_> {
    /// `write` on `node`, sent by `send` (the inner API's `write`, with the seal it was
    /// given), recorded: what it records before it is sent, and on its success what
    /// [`Self::before`] said. With no recorder, `send` alone.
    async fn traced<F>(
        &self,
        node: &str,
        write: TalosWrite<'_>,
        send: impl FnOnce() -> F + Send,
    ) -> Result<TalosWritten, TalosError>
    where
        F: Future<Output = Result<TalosWritten, TalosError>> + Send,
    {
        let Some(r) = self.recorder else { return send().await };
        let on_success = self.before(r, node, &write).await;
        let written = send().await?;
        match on_success {
            OnSuccess::Nothing => {}
            OnSuccess::Call(kind) => r.talos_call(node, kind),
            OnSuccess::Pulled(image) => r.pulled(node, image),
            OnSuccess::Installed => {
                if matches!(&written, TalosWritten::Install(outcome) if outcome.exit_code == 0) {
                    r.talos_call(node, TraceKind::Installed);
                }
            }
        }
        Ok(written)
    }

    /// Records what `write` on `node` records before it is sent, and says what its success
    /// records: the one place that tells what each Talos write is in the trace.
    async fn before<'w>(&self, r: &Recorder, node: &str, write: &TalosWrite<'w>) -> OnSuccess<'w> {
        match *write {
            TalosWrite::Upgrade(_) => OnSuccess::Call(TraceKind::UpgradeCall),
            TalosWrite::ApplyConfiguration(request) => {
                if !request.dry_run {
                    self.config_applies(r, node, request).await;
                }
                OnSuccess::Nothing
            }
            TalosWrite::Install { .. } => {
                r.talos_call(node, TraceKind::InstallStart);
                OnSuccess::Installed
            }
            TalosWrite::Reboot => OnSuccess::Call(TraceKind::RebootCall),
            TalosWrite::EtcdLeaveCluster | TalosWrite::EtcdRemoveMember { .. } => OnSuccess::Nothing,
            TalosWrite::Reset(_) => OnSuccess::Call(TraceKind::ResetCall),
            TalosWrite::ImagePull(request) => {
                r.pull_started(node, &request.image);
                OnSuccess::Pulled(&request.image)
            }
        }
    }

    /// Before an apply: which component's image it changes, from the node's configuration
    /// now (read again, only when a trace is kept).
    async fn config_applies(&self, r: &Recorder, node: &str, request: &ApplyConfigRequest) {
        let before = self.inner.machine_config(node).await.ok().and_then(|b| MachineConfig::parse(&b).ok());
        if let (Some(before), Ok(after)) = (before, MachineConfig::parse(&request.data)) {
            for component in Component::ALL {
                if after.image(component).is_some_and(|image| before.image(component).as_ref() != Some(&image)) {
                    r.config_apply(node, component.as_str());
                }
            }
        }
    }
}

#[async_trait]
impl TalosApi for TracedTalos<'_> {
    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        let name = self.inner.nodename(node).await?;
        if let Some(r) = self.recorder {
            r.nodename(node, &name);
        }
        Ok(name)
    }
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        self.inner.machine_stage(node).await
    }
    async fn write(&self, node: &str, write: TalosWrite<'_>, seal: Seal) -> Result<TalosWritten, TalosError> {
        self.traced(node, write, || self.inner.write(node, write, seal)).await
    }
    async fn machine_config(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.inner.machine_config(node).await
    }
    async fn bootstrap_manifests(&self, node: &str) -> Result<Vec<serde_json::Value>, TalosError> {
        self.inner.bootstrap_manifests(node).await
    }
    fn client_roles(&self) -> Option<Vec<String>> {
        self.inner.client_roles()
    }
    async fn admin_kubeconfig(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.inner.admin_kubeconfig(node).await
    }
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        self.inner.etcd_members(node).await
    }
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        self.inner.etcd_status(node).await
    }
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        self.inner.etcd_alarms(node).await
    }
    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        let stream = self.inner.etcd_snapshot(node).await?;
        if let Some(r) = self.recorder {
            r.talos_call(node, TraceKind::EtcdSnapshot);
        }
        Ok(stream)
    }
    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        self.inner.image_list(node).await
    }
    async fn install_running(&self, node: &str) -> Result<Option<bool>, TalosError> {
        self.inner.install_running(node).await
    }
    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        self.inner.boot_id(node).await
    }
}

/// A Kubernetes API that records what the engine saw and wrote through it into a
/// [`Recorder`] (none: records nothing) and otherwise forwards every call.
#[derive(Clone, Copy)]
pub struct TracedKube<'a> {
    /// The Kubernetes API called.
    pub inner: &'a dyn KubeApi,
    /// Where its records go.
    pub recorder: Option<&'a Recorder>,
}

impl fmt::Debug for TracedKube<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracedKube").field("recorder", &self.recorder).finish_non_exhaustive()
    }
}

impl TracedKube<'_> {
    /// `write`, sent by `send` (the inner API's `write`, with the seal it was given), and
    /// on its success recorded: the one place that tells what each Kubernetes write is in
    /// the trace.
    async fn traced<F>(&self, write: KubeWrite<'_>, send: impl FnOnce() -> F + Send) -> Result<KubeWritten, KubeError>
    where
        F: Future<Output = Result<KubeWritten, KubeError>> + Send,
    {
        let written = send().await?;
        let Some(r) = self.recorder else { return Ok(written) };
        match write {
            KubeWrite::Cordon { node, .. } => r.node_event(&node.name, TraceKind::Cordon),
            KubeWrite::Uncordon { node } => r.node_event(&node.name, TraceKind::Uncordon),
            KubeWrite::Evict { namespace, name, .. } => {
                if written == KubeWritten::Evicted(Eviction::Evicted) {
                    r.evicted(namespace, name);
                }
            }
            KubeWrite::DeleteNode { node } => r.node_event(&node.name, TraceKind::Removed),
        }
        Ok(written)
    }

    /// `write` of a machine's conditions, sent by `send` (the inner API's
    /// `write_conditions`, with the seal it was given), and on its success recorded as
    /// conditions written (a `converged` when it newly says so), held to a resourceVersion
    /// or not.
    async fn traced_conditions<F>(
        &self,
        write: ConditionWrite<'_>,
        send: impl FnOnce() -> F + Send,
    ) -> Result<(), ConditionWriteError>
    where
        F: Future<Output = Result<(), ConditionWriteError>> + Send,
    {
        send().await?;
        if let Some(r) = self.recorder {
            r.conditions_seen(write.machine, write.conditions, true);
        }
        Ok(())
    }
}

#[async_trait]
impl KubeApi for TracedKube<'_> {
    async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError> {
        let node = self.inner.node(name).await?;
        if let (Some(r), Some(node)) = (self.recorder, &node) {
            r.node_seen(node);
        }
        Ok(node)
    }
    async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError> {
        let operation = self.inner.operation(name).await?;
        if let (Some(r), Some(operation)) = (self.recorder, &operation) {
            r.status_read(operation);
        }
        Ok(operation)
    }
    async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError> {
        self.inner.operation_exists(identity).await
    }
    async fn node_kubernetes(&self, node: &str) -> Result<Option<NodeKubernetesInfo>, KubeError> {
        self.inner.node_kubernetes(node).await
    }
    async fn control_plane_pods(&self) -> Result<ichor_executor::kube_api::ControlPlanePods, KubeError> {
        self.inner.control_plane_pods().await
    }
    async fn gate_objects(
        &self,
        objects: &ichor_upgrade_core::gate::GateObjects,
    ) -> Result<Vec<(String, serde_json::Value)>, KubeError> {
        self.inner.gate_objects(objects).await
    }
    async fn alerts(
        &self,
        source: &ichor_upgrade_core::gate::AlertSelector,
    ) -> Result<Vec<ichor_executor::kube_api::Alert>, KubeError> {
        self.inner.alerts(source).await
    }
    async fn silences(&self, alertmanager: &str) -> Result<Vec<ichor_executor::kube_api::Silence>, KubeError> {
        self.inner.silences(alertmanager).await
    }
    async fn put_silence(
        &self,
        alertmanager: &str,
        silence: &ichor_executor::kube_api::Silence,
    ) -> Result<String, KubeError> {
        self.inner.put_silence(alertmanager, silence).await
    }
    async fn cluster_kubernetes(&self) -> Result<ClusterKubernetesInfo, KubeError> {
        self.inner.cluster_kubernetes().await
    }
    async fn manifest_session(
        &self,
        kubeconfig: ichor_executor::kube_api::AdminKubeconfig,
    ) -> Result<Box<dyn ichor_executor::kube_api::ManifestSession + '_>, KubeError> {
        self.inner.manifest_session(kubeconfig).await
    }
    async fn workload_rollout(
        &self,
        workload: &str,
    ) -> Result<ichor_upgrade_core::kubernetes::manifests::WorkloadRollout, KubeError> {
        self.inner.workload_rollout(workload).await
    }
    async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError> {
        self.inner.cluster(name).await
    }
    async fn machines(&self, cluster: &str) -> Result<Vec<Arc<MachineInfo>>, KubeError> {
        let machines = self.inner.machines(cluster).await?;
        if let Some(r) = self.recorder {
            r.machines(&machines);
        }
        Ok(machines)
    }
    async fn nodes(&self, names: &[&str]) -> Result<Vec<Option<Arc<NodeInfo>>>, KubeError> {
        let nodes = self.inner.nodes(names).await?;
        if let Some(r) = self.recorder {
            for node in nodes.iter().flatten() {
                r.node_seen(node);
            }
        }
        Ok(nodes)
    }
    async fn preflight_facts(&self, asked: &[&str]) -> Result<ClusterFacts, KubeError> {
        self.inner.preflight_facts(asked).await
    }
    async fn lease(&self, cluster: &str) -> Result<Option<LeaseInfo>, KubeError> {
        self.inner.lease(cluster).await
    }
    async fn write_lease(&self, cluster: &str, write: &LeaseWrite) -> Result<(), KubeError> {
        self.inner.write_lease(cluster, write).await
    }
    async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError> {
        self.inner.write_operation_status(name, status).await?;
        if let Some(r) = self.recorder {
            r.status_written(name, status);
        }
        Ok(())
    }
    async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError> {
        self.inner.remove_finalizer(name).await
    }
    async fn event(&self, event: &Event) -> Result<(), KubeError> {
        self.inner.event(event).await
    }
    async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError> {
        let machine = self.inner.machine(name).await?;
        if let (Some(r), Some(machine)) = (self.recorder, &machine) {
            r.machine(machine);
        }
        Ok(machine)
    }
    async fn write(&self, write: KubeWrite<'_>, seal: Seal) -> Result<KubeWritten, KubeError> {
        self.traced(write, || self.inner.write(write, seal)).await
    }
    async fn write_conditions(&self, write: ConditionWrite<'_>, seal: Seal) -> Result<(), ConditionWriteError> {
        self.traced_conditions(write, || self.inner.write_conditions(write, seal)).await
    }
    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        let pods = self.inner.pods_on(node).await?;
        if let Some(r) = self.recorder {
            r.pods(node, &pods);
        }
        Ok(pods)
    }
    async fn cached_pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        let pods = self.inner.cached_pods_on(node).await?;
        if let Some(r) = self.recorder {
            r.pods(node, &pods);
        }
        Ok(pods)
    }
}

/// A storage backend that records the evacuations the engine asked for and saw end into a
/// [`Recorder`] (none: records nothing) and otherwise forwards every call.
#[derive(Clone, Copy)]
pub struct TracedStorage<'a> {
    /// The storage backend called.
    pub inner: &'a dyn StorageApi,
    /// Where its records go.
    pub recorder: Option<&'a Recorder>,
}

impl fmt::Debug for TracedStorage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracedStorage").field("recorder", &self.recorder).finish_non_exhaustive()
    }
}

impl TracedStorage<'_> {
    /// `write`, sent by `send` (the inner backend's `write`, with the seal it was given),
    /// and on its success recorded: the one place that tells what each storage write is in
    /// the trace.
    async fn traced<F>(
        &self,
        write: StorageWrite<'_>,
        send: impl FnOnce() -> F + Send,
    ) -> Result<StorageWritten, StorageError>
    where
        F: Future<Output = Result<StorageWritten, StorageError>> + Send,
    {
        let written = send().await?;
        let Some(r) = self.recorder else { return Ok(written) };
        match write {
            StorageWrite::RequestEvacuation { node, .. } => {
                if let StorageWritten::Requested(EvacuationRequest::Requested { .. }) = written {
                    r.evacuation_requested(node);
                }
            }
            StorageWrite::RestoreScheduling { node, .. } => r.evacuation_ended(node),
        }
        Ok(written)
    }
}

#[async_trait]
impl StorageReads for TracedStorage<'_> {
    async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError> {
        self.inner.storage_objects().await
    }
    async fn evacuation_record(&self, node: &str) -> Result<Option<EvacuationRecord>, StorageError> {
        self.inner.evacuation_record(node).await
    }
    async fn replicas_on(&self, node: &str) -> Result<u32, StorageError> {
        let replicas = self.inner.replicas_on(node).await?;
        if let Some(r) = self.recorder {
            r.replicas_left(node, replicas);
        }
        Ok(replicas)
    }
    async fn backing_images_on(&self, node: &str) -> Result<u32, StorageError> {
        self.inner.backing_images_on(node).await
    }
}

#[async_trait]
impl StorageApi for TracedStorage<'_> {
    async fn write(&self, write: StorageWrite<'_>, seal: Seal) -> Result<StorageWritten, StorageError> {
        self.traced(write, || self.inner.write(write, seal)).await
    }
}

/// The record of a change of an operation's status.
fn trace_kind(kind: ChangeKind) -> TraceKind {
    match kind {
        ChangeKind::Failed => TraceKind::Failed,
        ChangeKind::Paused => TraceKind::Paused,
        ChangeKind::Resumed => TraceKind::Resumed,
        ChangeKind::Refused => TraceKind::Refused,
        ChangeKind::Waiting => TraceKind::Waiting,
    }
}

#[cfg(test)]
mod tests {
    use ichor_executor::kube_api::Metadata;
    use ichor_executor::talos_api::{
        InstallOutcome, InstallRequest, PullRequest, ResetRequest, UpgradeAck, UpgradeRequest,
    };
    use ichor_upgrade_core::Timestamp;
    use ichor_upgrade_core::conditions::ConditionUpdate;
    use ichor_upgrade_core::evacuation::Scheduling;
    use ichor_upgrade_core::status::{MachineRecord, RecordState};
    use ichor_upgrade_core::status::{PauseReason, Phase};

    use super::*;

    const ADDRESS: &str = "10.0.0.11";

    /// The Talos API, Kubernetes API and storage of one machine `cp-1` (Node `node-cp-1`),
    /// whose Node is whatever the test sets.
    struct Doubles {
        node: Mutex<NodeInfo>,
        machines: Vec<Arc<MachineInfo>>,
        pods: Vec<PodInfo>,
        replicas: Mutex<u32>,
        refuse_upgrade: bool,
    }

    fn refused<T>() -> Result<T, KubeError> {
        Err(KubeError::Refused("not served by this double".to_owned()))
    }

    fn unreachable<T>() -> Result<T, TalosError> {
        Err(TalosError::answer("Unavailable", "not served by this double"))
    }

    impl Doubles {
        fn new() -> Self {
            let machine = MachineInfo {
                name: "cp-1".to_owned(),
                role: MachineRole::ControlPlane,
                hostname: Some("node-cp-1".to_owned()),
                address: ADDRESS.to_owned(),
                labels: Metadata::new(),
                annotations: Metadata::new(),
                conditions: Conditions::new(),
                resource_version: None,
            };
            let pod = |name: &str| PodInfo {
                namespace: "apps".to_owned(),
                name: name.to_owned(),
                owner_kinds: vec!["ReplicaSet".to_owned()],
                mirror: false,
                terminating: false,
                uid: None,
            };
            Self {
                node: Mutex::new(node(true, "boot-a", "v1.14.2")),
                machines: vec![Arc::new(machine)],
                pods: vec![pod("web-1"), pod("web-2")],
                replicas: Mutex::new(2),
                refuse_upgrade: false,
            }
        }

        fn set_node(&self, ready: bool, boot_id: &str, version: &str) {
            *self.node.lock().unwrap() = node(ready, boot_id, version);
        }

        /// What its Talos API answers `write` (its `write`, which needs a seal).
        fn talos_answer(&self, write: TalosWrite<'_>) -> Result<TalosWritten, TalosError> {
            match write {
                TalosWrite::Upgrade(_) if self.refuse_upgrade => {
                    Err(TalosError::answer("FailedPrecondition", "etcd is unhealthy"))
                }
                TalosWrite::Upgrade(_) => Ok(TalosWritten::Upgrade(UpgradeAck {
                    ack: "Upgrade request received".to_owned(),
                    actor_id: "actor".to_owned(),
                })),
                TalosWrite::ImagePull(request) => Ok(TalosWritten::ImagePull(request.image.clone())),
                // An installer whose image says it is broken exits 1.
                TalosWrite::Install { request, .. } => Ok(TalosWritten::Install(InstallOutcome {
                    exit_code: i32::from(request.image.contains("broken")),
                    output: Vec::new(),
                })),
                TalosWrite::Reboot => Ok(TalosWritten::Reboot("actor".to_owned())),
                TalosWrite::EtcdLeaveCluster | TalosWrite::EtcdRemoveMember { .. } | TalosWrite::Reset(_) => {
                    unreachable()
                }
                other => Err(TalosError::unserved(other.method(), ADDRESS)),
            }
        }

        /// What its Kubernetes API answers `write` (its `write`, which needs a seal).
        fn kube_answer(&self, write: KubeWrite<'_>) -> Result<KubeWritten, KubeError> {
            match write {
                KubeWrite::Cordon { .. } => Ok(KubeWritten::Cordoned),
                KubeWrite::Uncordon { .. } => Ok(KubeWritten::Uncordoned),
                KubeWrite::Evict { .. } => Ok(KubeWritten::Evicted(Eviction::Evicted)),
                KubeWrite::DeleteNode { .. } => refused(),
            }
        }

        /// What its storage answers `write` (its `write`, which needs a seal).
        fn storage_answer(write: StorageWrite<'_>) -> StorageWritten {
            match write {
                StorageWrite::RequestEvacuation { .. } => StorageWritten::Requested(EvacuationRequest::Requested {
                    before: Scheduling { allowed: true, eviction_requested: false },
                }),
                StorageWrite::RestoreScheduling { .. } => StorageWritten::Restored,
            }
        }
    }

    /// `write` on `node` through `talos` as its `write` makes it, sent to `doubles` (a
    /// write needs a seal only the executor makes).
    async fn talos_write(
        talos: &TracedTalos<'_>,
        doubles: &Doubles,
        node: &str,
        write: TalosWrite<'_>,
    ) -> Result<TalosWritten, TalosError> {
        talos.traced(node, write, || std::future::ready(doubles.talos_answer(write))).await
    }

    /// `write` through `kube` as its `write` makes it, sent to `doubles`.
    async fn kube_write(
        kube: &TracedKube<'_>,
        doubles: &Doubles,
        write: KubeWrite<'_>,
    ) -> Result<KubeWritten, KubeError> {
        kube.traced(write, || std::future::ready(doubles.kube_answer(write))).await
    }

    /// The conditions of `machine` written through `kube` as its `write_conditions` makes
    /// it, to the doubles (which take every such write).
    async fn conditions_write(kube: &TracedKube<'_>, machine: &str, conditions: &Conditions) {
        let write = ConditionWrite { machine, conditions, at: None };
        kube.traced_conditions(write, || std::future::ready(Ok(()))).await.unwrap();
    }

    /// `write` through `storage` as its `write` makes it, sent to the doubles.
    async fn storage_write(storage: &TracedStorage<'_>, write: StorageWrite<'_>) -> StorageWritten {
        storage.traced(write, || std::future::ready(Ok(Doubles::storage_answer(write)))).await.unwrap()
    }

    fn node(ready: bool, boot_id: &str, version: &str) -> NodeInfo {
        NodeInfo {
            name: "node-cp-1".to_owned(),
            ready,
            unschedulable: false,
            os_image: format!("Talos ({version})"),
            boot_id: boot_id.to_owned(),
            labels: Metadata::new(),
            annotations: Metadata::new(),
            resource_version: "1".to_owned(),
        }
    }

    #[async_trait]
    impl TalosApi for Doubles {
        async fn nodename(&self, _node: &str) -> Result<String, TalosError> {
            Ok("node-cp-1".to_owned())
        }
        async fn machine_stage(&self, _node: &str) -> Result<MachineStage, TalosError> {
            unreachable()
        }
        async fn write(&self, _node: &str, write: TalosWrite<'_>, _seal: Seal) -> Result<TalosWritten, TalosError> {
            self.talos_answer(write)
        }
        async fn etcd_members(&self, _node: &str) -> Result<Vec<EtcdMember>, TalosError> {
            unreachable()
        }
        async fn etcd_status(&self, _node: &str) -> Result<EtcdStatus, TalosError> {
            unreachable()
        }
        async fn etcd_alarms(&self, _node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
            unreachable()
        }
    }

    #[async_trait]
    impl KubeApi for Doubles {
        async fn node(&self, _name: &str) -> Result<Option<NodeInfo>, KubeError> {
            Ok(Some(self.node.lock().unwrap().clone()))
        }
        async fn operation(&self, _name: &str) -> Result<Option<OperationInfo>, KubeError> {
            refused()
        }
        async fn operation_exists(&self, _identity: &str) -> Result<bool, KubeError> {
            refused()
        }
        async fn cluster(&self, _name: &str) -> Result<ClusterInfo, KubeError> {
            refused()
        }
        async fn machines(&self, _cluster: &str) -> Result<Vec<Arc<MachineInfo>>, KubeError> {
            Ok(self.machines.clone())
        }
        async fn lease(&self, _cluster: &str) -> Result<Option<LeaseInfo>, KubeError> {
            refused()
        }
        async fn write_lease(&self, _cluster: &str, _write: &LeaseWrite) -> Result<(), KubeError> {
            refused()
        }
        async fn write_operation_status(&self, _name: &str, _status: &OperationStatus) -> Result<(), KubeError> {
            Ok(())
        }
        async fn remove_finalizer(&self, _name: &str) -> Result<(), KubeError> {
            refused()
        }
        async fn event(&self, _event: &Event) -> Result<(), KubeError> {
            refused()
        }
        async fn machine(&self, _name: &str) -> Result<Option<MachineInfo>, KubeError> {
            refused()
        }
        async fn write(&self, write: KubeWrite<'_>, _seal: Seal) -> Result<KubeWritten, KubeError> {
            self.kube_answer(write)
        }
        async fn write_conditions(&self, _write: ConditionWrite<'_>, _seal: Seal) -> Result<(), ConditionWriteError> {
            Ok(())
        }
        async fn pods_on(&self, _node: &str) -> Result<Vec<PodInfo>, KubeError> {
            Ok(self.pods.clone())
        }
    }

    #[async_trait]
    impl StorageReads for Doubles {
        async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError> {
            Ok(Vec::new())
        }
        async fn evacuation_record(&self, _node: &str) -> Result<Option<EvacuationRecord>, StorageError> {
            Ok(None)
        }
        async fn replicas_on(&self, _node: &str) -> Result<u32, StorageError> {
            Ok(*self.replicas.lock().unwrap())
        }
        async fn backing_images_on(&self, _node: &str) -> Result<u32, StorageError> {
            Ok(0)
        }
    }

    #[async_trait]
    impl StorageApi for Doubles {
        async fn write(&self, write: StorageWrite<'_>, _seal: Seal) -> Result<StorageWritten, StorageError> {
            Ok(Self::storage_answer(write))
        }
    }

    fn upgrade_request() -> UpgradeRequest {
        UpgradeRequest { image: "installer:v1.14.3".to_owned(), timeout: std::time::Duration::from_secs(60) }
    }

    fn converged() -> Conditions {
        let mut conditions = Conditions::new();
        let update =
            ConditionUpdate::new(TALOS_UPGRADE, ConditionStatus::False, upgrade_reason::CONVERGED, "on v1.14.3");
        conditions.upsert(update, Timestamp::from_unix_secs(1_000));
        conditions
    }

    fn kinds(buffer: &TraceBuffer) -> Vec<&'static str> {
        buffer.events().iter().map(|e| e.event.name()).collect()
    }

    /// A recorder into a buffer.
    fn traced() -> (Arc<TraceBuffer>, Recorder) {
        let buffer = Arc::new(TraceBuffer::default());
        let recorder = Recorder::new(Arc::clone(&buffer) as Arc<dyn TraceSink>);
        (buffer, recorder)
    }

    #[tokio::test]
    async fn a_legacy_upgrade_is_traced_in_order_for_its_node() {
        let doubles = Doubles::new();
        let (buffer, recorder) = traced();
        let talos = TracedTalos { inner: &doubles, recorder: Some(&recorder) };
        let kube = TracedKube { inner: &doubles, recorder: Some(&recorder) };

        // A pass: the machines, their Nodes (a first look records nothing), the call.
        kube.machines("demo").await.unwrap();
        kube.nodes(&["node-cp-1"]).await.unwrap();
        talos_write(&talos, &doubles, ADDRESS, TalosWrite::Upgrade(&upgrade_request())).await.unwrap();
        // Passes while it reboots and comes back; a repeated look records nothing.
        for (ready, boot, version) in [
            (true, "boot-a", "v1.14.2"),
            (false, "boot-a", "v1.14.2"),
            (false, "boot-a", "v1.14.2"),
            (false, "boot-b", "v1.14.3"),
            (true, "boot-b", "v1.14.3"),
            (true, "boot-b", "v1.14.3"),
        ] {
            doubles.set_node(ready, boot, version);
            kube.machines("demo").await.unwrap();
            kube.nodes(&["node-cp-1"]).await.unwrap();
        }
        conditions_write(&kube, "cp-1", &converged()).await;
        // Written again unchanged (a later pass): no second record.
        conditions_write(&kube, "cp-1", &converged()).await;

        assert_eq!(kinds(&buffer), ["listed", "upgrade-call", "shown-not-ready", "reboot-end", "ready", "converged"]);
        let events = buffer.events();
        assert!(events.iter().all(|e| e.node == "node-cp-1" && e.role == "control-plane"), "{events:#?}");
        assert_eq!(events[0].version.as_deref(), Some("v1.14.2"), "listed with the version it ran");
        assert_eq!(events[1].version.as_deref(), Some("v1.14.2"));
        let reboot_end = &events[3];
        assert_eq!(
            (reboot_end.version.as_deref(), reboot_end.boot_id.as_deref()),
            (Some("v1.14.3"), Some("boot-b")),
            "the reboot's end carries the version and boot ID the Node shows"
        );
        assert!(events.windows(2).all(|w| w[0].t <= w[1].t), "in time order: {events:#?}");
    }

    #[tokio::test]
    async fn decorators_pass_results_and_errors_through_and_a_failed_call_records_nothing() {
        let doubles = Doubles { refuse_upgrade: true, ..Doubles::new() };
        let (buffer, recorder) = traced();
        let talos = TracedTalos { inner: &doubles, recorder: Some(&recorder) };
        let kube = TracedKube { inner: &doubles, recorder: Some(&recorder) };
        kube.machines("demo").await.unwrap();
        let request = upgrade_request();
        let direct = doubles.talos_answer(TalosWrite::Upgrade(&request));
        assert_eq!(talos_write(&talos, &doubles, ADDRESS, TalosWrite::Upgrade(&request)).await, direct);
        assert!(direct.is_err());
        assert_eq!(kube.operation("upgrade").await, doubles.operation("upgrade").await);
        assert_eq!(talos.nodename(ADDRESS).await.unwrap(), "node-cp-1");
        assert!(kinds(&buffer).is_empty(), "{:?}", buffer.events());

        // With no recorder, nothing is recorded and everything still answers.
        let plain = TracedTalos { inner: &doubles, recorder: None };
        assert_eq!(plain.nodename(ADDRESS).await.unwrap(), "node-cp-1");
        let pull = PullRequest { image: "installer:v1.14.3".to_owned(), timeout: std::time::Duration::from_secs(60) };
        let pulled = talos_write(&plain, &doubles, ADDRESS, TalosWrite::ImagePull(&pull)).await;
        assert_eq!(pulled, Ok(TalosWritten::ImagePull("installer:v1.14.3".to_owned())));
        assert!(kinds(&buffer).is_empty(), "{:?}", buffer.events());
    }

    #[tokio::test]
    async fn a_lifecycle_drain_and_evacuation_are_each_traced_once() {
        let doubles = Doubles::new();
        let (buffer, recorder) = traced();
        let talos = TracedTalos { inner: &doubles, recorder: Some(&recorder) };
        let kube = TracedKube { inner: &doubles, recorder: Some(&recorder) };
        let storage = TracedStorage { inner: &doubles, recorder: Some(&recorder) };
        kube.machines("demo").await.unwrap();
        let node = "node-cp-1";

        let request = StorageWrite::RequestEvacuation { node, since: Timestamp::EPOCH };
        storage_write(&storage, request).await;
        storage_write(&storage, request).await;
        assert_eq!(storage.replicas_on(node).await.unwrap(), 2);
        *doubles.replicas.lock().unwrap() = 0;
        storage.replicas_on(node).await.unwrap();
        storage.replicas_on(node).await.unwrap();
        let pull = PullRequest { image: "installer:v1.14.3".to_owned(), timeout: std::time::Duration::from_secs(60) };
        talos_write(&talos, &doubles, ADDRESS, TalosWrite::ImagePull(&pull)).await.unwrap();
        talos_write(&talos, &doubles, ADDRESS, TalosWrite::ImagePull(&pull)).await.unwrap();
        let read = NodeInfo { name: node.to_owned(), ..self::node(true, "boot-1", "v1.14.3") };
        let annotation = "since=1000;operation=default/demo/1";
        kube_write(&kube, &doubles, KubeWrite::Cordon { node: &read, annotation }).await.unwrap();
        for pod in kube.pods_on(node).await.unwrap() {
            let evict = KubeWrite::Evict { namespace: &pod.namespace, name: &pod.name, uid: pod.uid.as_deref() };
            kube_write(&kube, &doubles, evict).await.unwrap();
        }
        kube_write(&kube, &doubles, KubeWrite::Uncordon { node: &read }).await.unwrap();
        let before = Scheduling { allowed: true, eviction_requested: false };
        storage_write(&storage, StorageWrite::RestoreScheduling { node, before }).await;
        // Restored again (a pass that did not see its first restore's record): no second end.
        storage_write(&storage, StorageWrite::RestoreScheduling { node, before }).await;

        assert_eq!(
            kinds(&buffer),
            [
                "evacuation-start",
                "evacuated",
                "image-pull-start",
                "image-pulled",
                "cordon",
                "drain",
                "uncordon",
                "evacuation-end"
            ]
        );
    }

    #[tokio::test]
    async fn an_install_and_a_reboot_are_traced_and_a_write_that_failed_is_not() {
        let doubles = Doubles::new();
        let (buffer, recorder) = traced();
        let talos = TracedTalos { inner: &doubles, recorder: Some(&recorder) };
        TracedKube { inner: &doubles, recorder: Some(&recorder) }.machines("demo").await.unwrap();
        let started = std::sync::atomic::AtomicBool::new(false);
        let timeout = std::time::Duration::from_secs(60);
        let good = InstallRequest { image: "installer:v1.14.3".to_owned(), timeout };
        let broken = InstallRequest { image: "installer:broken".to_owned(), timeout };
        talos_write(&talos, &doubles, ADDRESS, TalosWrite::Install { request: &good, started: &started })
            .await
            .unwrap();
        // An install that exits non-zero began, but did not install.
        let install = TalosWrite::Install { request: &broken, started: &started };
        let outcome = talos_write(&talos, &doubles, ADDRESS, install).await.unwrap().install().unwrap();
        assert_eq!(outcome.exit_code, 1);
        talos_write(&talos, &doubles, ADDRESS, TalosWrite::Reboot).await.unwrap();
        // Refused: nothing after.
        let reset = ResetRequest { graceful: true, reboot: false };
        talos_write(&talos, &doubles, ADDRESS, TalosWrite::Reset(&reset)).await.unwrap_err();
        talos_write(&talos, &doubles, ADDRESS, TalosWrite::EtcdLeaveCluster).await.unwrap_err();

        assert_eq!(kinds(&buffer), ["install-start", "installed", "install-start", "reboot-call"]);
    }

    /// A write as the executor makes it (a pre-pull through `run_job`, with the seal only
    /// the executor has) passes the fence and then the trace, stacked as the controller
    /// stacks them: traced and answered while this replica leads; once it no longer leads,
    /// refused by the fence before it reaches the trace or the node.
    #[tokio::test]
    async fn a_sealed_write_passes_the_fence_then_the_trace_as_the_controller_stacks_them() {
        use std::time::{Duration, Instant};

        use ichor_executor::background::Job;
        use ichor_executor::{Executor, ExecutorConfig};

        let doubles = Doubles::new();
        let (buffer, recorder) = traced();
        TracedKube { inner: &doubles, recorder: Some(&recorder) }.machines("demo").await.unwrap();
        let (tx, rx) = tokio::sync::watch::channel(Some(Instant::now() + Duration::from_secs(15)));
        let fence = crate::fence::Fence::new(rx);
        let talos = crate::fence::FencedTalos {
            inner: &TracedTalos { inner: &doubles, recorder: Some(&recorder) },
            fence: &fence,
        };
        let config = ExecutorConfig::default();
        let ex = Executor {
            talos: &talos,
            kube: &doubles,
            storage: &doubles,
            clock: &ichor_adapters::clock::SystemClock,
            config: &config,
            snapshots: None,
            background: None,
        };
        let job = Job::Prepull {
            machine: "cp-1".to_owned(),
            address: ADDRESS.to_owned(),
            image: "installer:v1.14.3".to_owned(),
        };
        ichor_executor::jobs::run_job(&ex, &job).await;
        assert_eq!(kinds(&buffer), ["image-pull-start", "image-pulled"], "sent and answered while leading");
        tx.send(Some(Instant::now().checked_sub(Duration::from_millis(1)).unwrap())).unwrap();
        ichor_executor::jobs::run_job(&ex, &job).await;
        assert_eq!(kinds(&buffer), ["image-pull-start", "image-pulled"], "refused before the trace, never sent");
    }

    #[tokio::test]
    async fn a_failure_and_the_pause_it_brings_are_traced_with_their_reason_on_the_machine() {
        let doubles = Doubles::new();
        let (buffer, recorder) = traced();
        let kube = TracedKube { inner: &doubles, recorder: Some(&recorder) };
        kube.machines("demo").await.unwrap();
        let progressing = OperationStatus { phase: Phase::Progressing, ..OperationStatus::default() };
        kube.write_operation_status("upgrade", &progressing).await.unwrap();
        let record = MachineRecord {
            state: RecordState::Failed,
            reason: "UpgradeRefused".to_owned(),
            message: "etcd is unhealthy".to_owned(),
            recheck_at: None,
        };
        let paused = OperationStatus {
            phase: Phase::Paused(PauseReason::MachineFailed { machines: Vec::new() }),
            machines: [("cp-1".to_owned(), record)].into(),
            ..OperationStatus::default()
        };
        kube.write_operation_status("upgrade", &paused).await.unwrap();
        kube.write_operation_status("upgrade", &paused).await.unwrap();

        assert_eq!(kinds(&buffer), ["failed", "paused"]);
        let events = buffer.events();
        assert_eq!(events[0].node, "node-cp-1");
        assert_eq!(
            (events[0].reason.as_deref(), events[0].message.as_deref()),
            (Some("UpgradeRefused"), Some("etcd is unhealthy"))
        );
        assert_eq!(events[1].reason.as_deref(), Some(paused.phase.reason()));
    }

    #[tokio::test]
    async fn recorders_of_two_namespaces_keep_their_machines_apart_on_one_clock() {
        let (one, other) = (Doubles::new(), Doubles::new());
        let other_machine =
            MachineInfo { hostname: Some("node-cp-1.other".to_owned()), ..(*other.machines[0]).clone() };
        let other = Doubles { machines: vec![Arc::new(other_machine)], ..other };
        let (buffer, recorder) = traced();
        let scoped = recorder.scope();
        let first = TracedTalos { inner: &one, recorder: Some(&recorder) };
        let second = TracedTalos { inner: &other, recorder: Some(&scoped) };
        TracedKube { inner: &one, recorder: Some(&recorder) }.machines("demo").await.unwrap();
        TracedKube { inner: &other, recorder: Some(&scoped) }.machines("demo").await.unwrap();
        let request = upgrade_request();
        talos_write(&first, &one, ADDRESS, TalosWrite::Upgrade(&request)).await.unwrap();
        talos_write(&second, &other, ADDRESS, TalosWrite::Upgrade(&request)).await.unwrap();
        let events = buffer.events();
        let nodes: Vec<&str> = events.iter().map(|e| e.node.as_str()).collect();
        assert_eq!(nodes, ["node-cp-1", "node-cp-1.other"]);
        assert!(events[0].t <= events[1].t);
    }

    #[test]
    fn a_trace_file_holds_one_json_line_per_record() {
        let dir = std::env::temp_dir().join(format!("ichor-trace-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.jsonl");
        let file = TraceFile::create(&path).unwrap();
        let recorder = Recorder::new(Arc::new(file));
        // The first leadership is the start; the next two are restarts.
        for _ in 0..3 {
            recorder.controller_started("replica-1");
        }
        drop(recorder);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let lines = loop {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            if lines.len() == 2 || Instant::now() > deadline {
                break lines;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "controller-restart");
        assert_eq!(lines[0]["role"], "controller");
        assert!(lines[0]["t"].as_f64().unwrap() <= lines[1]["t"].as_f64().unwrap());
        std::fs::remove_dir_all(&dir).ok();

        let missing = dir.join("no-such-dir").join("trace.jsonl");
        assert!(TraceFile::create(&missing).is_err(), "an unwritable path fails at once");
    }
}
