//! The controller: a kube-runtime `Controller` over `TalosOperation`s that runs one engine
//! pass ([`ichor_executor::reconcile()`]) per trigger, on the leader only.
//!
//! What triggers a pass of an operation: a change of the operation; of a `TalosMachine` or
//! the `TalosCluster` of its cluster; of a Node one of its machines names (by hostname or
//! address); of any `TalosStorage`; of a Longhorn node or replica on such a Node (when
//! Longhorn is installed); the engine's own `requeue_at`; this replica becoming the leader.
//! All reads come from the stores the watches feed ([`ichor_adapters::kubernetes::watch`]);
//! a pass costs no GET per object.
//!
//! Talos credentials come from the Secret the cluster names (`spec.talosconfigSecret`, key
//! `talosconfig`), read when first needed and again after [`TALOSCONFIG_TTL`]; they are
//! never logged. Without usable credentials a pass still runs (refusals and pauses still
//! happen) and every Talos call fails as unreachable with the reason, which the operation's
//! status shows as a wait.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use ichor_adapters::clock::SystemClock;
use ichor_adapters::kubernetes::crd::{TalosCluster, TalosMachine, TalosOperation, TalosStorage};
use ichor_adapters::kubernetes::{
    Counters, KubeCluster, Stores, WorkloadStores, engine_watcher, watch_observing, without_errors,
};
use ichor_adapters::longhorn::{LonghornStorage, REPLICA_NODE_LABEL};
use ichor_adapters::talos::client::{ClientOptions, TalosClient};
use ichor_executor::background::{Job, JobQueue};
use ichor_executor::jobs::run_job;
use ichor_executor::kube_api::KubeApi;
use ichor_executor::talos_api::{EtcdAlarm, EtcdMember, EtcdStatus, ImageInfo, TalosApi, TalosError};
use ichor_executor::writes::{Seal, TalosWrite, TalosWritten};
use ichor_executor::{Clock, Executor, ExecutorConfig, PassMemory, SnapshotStore, report};
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::plan::Defaults;
use ichor_upgrade_core::window::MaintenanceSpec;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::cluster_status;
use crate::discovery;
use crate::fence::{Fence, FencedKube, FencedStorage, FencedTalos};
use crate::leader::leads;
use crate::metrics::{EngineCalls, Metrics, Operations};
use crate::rbac;
use crate::trace::{Recorder, TraceSink, TracedKube, TracedStorage, TracedTalos};

/// How long a cluster's Talos client is used before its Secret is read again.
pub const TALOSCONFIG_TTL: Duration = Duration::from_secs(60);
/// How long the want of usable Talos credentials is remembered: a cluster or Secret created
/// just after the operation is picked up within this, not a whole [`TALOSCONFIG_TTL`].
pub const UNUSABLE_TALOSCONFIG_TTL: Duration = Duration::from_secs(5);
/// How long a pass waits before retrying after an error.
pub const ERROR_BACKOFF: Duration = Duration::from_secs(5);
/// How soon an operation is looked at again when it came before every watch had listed.
pub const NOT_LISTED_REQUEUE: Duration = Duration::from_millis(200);
/// The shortest requeue: the engine's `requeue_at` may be now.
pub const MIN_REQUEUE: Duration = Duration::from_millis(50);

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// Watch this namespace only (`None`: every namespace).
    pub namespace: Option<String>,
    /// This replica's name in Events (`reportingInstance`).
    pub identity: String,
    /// The engine's bounds and rollout settings.
    pub executor: ExecutorConfig,
    /// The Talos client's bounds.
    pub talos: ClientOptions,
    /// Where Longhorn runs.
    pub longhorn_namespace: String,
    /// Where etcd snapshots go (`None`: nowhere, and an operation that requires one pauses
    /// before its first control plane, saying so).
    pub snapshots: Option<Arc<dyn SnapshotStore>>,
    /// Where the trace of what the engine does and sees goes ([`crate::trace`]; `None`: no
    /// trace). Its time starts when the controller does.
    pub trace: Option<Arc<dyn TraceSink>>,
    /// The node this replica runs on (`NODE_NAME`, from the pod's `spec.nodeName`): its
    /// machine is upgraded last in its role, so that the leader is not drained and
    /// rebooted while it has others of its role to do.
    pub own_node: Option<String>,
    /// The operator's own namespace (its leader Lease's and, as `deploy/` makes it, its
    /// ServiceAccount's, named [`rbac::NAME`]): what a refused call says to grant
    /// ([`rbac::grant_command`]).
    pub operator_namespace: String,
    /// How many of the cluster's seconds pass in one of this process's: 1 for a real
    /// cluster, the simulated fleet's `--time-scale` for it. A dry run with no history
    /// divides a real cluster's default durations by it, so that its plan is in the
    /// cluster's own time ([`ichor_upgrade_core::plan::Defaults::sped_up`]).
    pub time_scale: f64,
}

/// Whether the operator is ready (its stores listed) and alive (its controller running).
#[derive(Debug, Default)]
pub struct Health {
    /// Every store has its first list.
    pub ready: AtomicBool,
    /// The controller loop runs.
    pub live: AtomicBool,
}

/// The controller's failure.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The finalizer could not be added.
    #[error("adding the finalizer: {0}")]
    Finalizer(#[source] ichor_executor::KubeError),
    /// The engine's pass failed.
    #[error(transparent)]
    Reconcile(#[from] ichor_executor::reconcile::ReconcileError),
    /// A TalosMachine discovered from its Node could not be written.
    #[error("writing a discovered TalosMachine: {0}")]
    Discovery(#[source] kube::Error),
    /// A dry run could not read what it plans from.
    #[error("a dry run's read: {0}")]
    DryRunRead(#[source] ichor_executor::KubeError),
    /// A dry run's plan, or a calibration, could not be written.
    #[error("writing a plan or a calibration: {0}")]
    PlanWrite(#[source] kube::Error),
}

impl ControllerError {
    fn is_transient(&self) -> bool {
        match self {
            Self::Finalizer(e) => e.is_transient(),
            Self::Reconcile(e) => e.is_transient(),
            Self::Discovery(e) | Self::PlanWrite(e) => {
                !matches!(e, kube::Error::Api(s) if s.code == 403 || s.code == 422)
            }
            Self::DryRunRead(e) => e.is_transient(),
        }
    }

    fn kind(&self) -> &'static str {
        use ichor_executor::reconcile::ReconcileError as E;
        match self {
            Self::Finalizer(_) => "finalizer",
            Self::Discovery(_) => "discovery",
            Self::DryRunRead(_) => "dry-run-read",
            Self::PlanWrite(_) => "plan-write",
            Self::Reconcile(E::ReadOperation { .. }) => "read-operation",
            Self::Reconcile(E::ReadCluster { .. }) => "read-cluster",
            Self::Reconcile(E::WriteLease { .. }) => "write-lease",
            Self::Reconcile(E::WriteOperation { .. }) => "write-operation",
            Self::Reconcile(E::RetryReset { .. }) => "retry-reset",
            Self::Reconcile(E::EvacuationRecord { .. }) => "evacuation-record",
            Self::Reconcile(E::Manifests { .. }) => "manifests",
        }
    }
}

struct CachedTalos {
    /// The Secret's resourceVersion the client was built from (`None`: no usable client).
    version: Option<String>,
    api: Arc<dyn TalosApi>,
    fetched: Instant,
}

/// What every pass shares.
pub struct Context {
    client: Client,
    config: OperatorConfig,
    stores: Stores,
    /// The workloads' stores (pods, budgets, Deployments, StatefulSets, ReplicaSets).
    workloads: WorkloadStores,
    counters: Arc<Counters>,
    metrics: Arc<Metrics>,
    leading: tokio::sync::watch::Receiver<Option<Instant>>,
    storage: LonghornStorage,
    /// Records the trace, when one is asked for: the controller's own records.
    trace: Option<Arc<Recorder>>,
    /// Its recorders by namespace (machine names are unique only within one), on the same
    /// sink and clock.
    recorders: Mutex<HashMap<String, Arc<Recorder>>>,
    kubes: Mutex<HashMap<String, KubeCluster>>,
    talos: tokio::sync::Mutex<HashMap<(String, String), CachedTalos>>,
    /// Per operation (namespace, name): which machines' waits still stand. Forgotten
    /// whenever this replica does not lead, since another may have acted meanwhile.
    memories: Mutex<HashMap<(String, String), Arc<PassMemory>>>,
    /// Per operation: the calls that outlive a pass (lifecycle installs, pre-pulls), each
    /// run by a task of its own beside the passes.
    backgrounds: Mutex<HashMap<(String, String), Arc<JobQueue>>>,
    /// Those tasks, aborted when this replica stops leading (another may act meanwhile).
    jobs: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Asks for a pass of an operation: an install that ended wrote what it must see.
    wake: futures::channel::mpsc::UnboundedSender<ObjectRef<TalosOperation>>,
    /// This replica's leadership, checked before every side effect.
    fence: Fence,
}

impl Context {
    fn memory(&self, namespace: &str, name: &str) -> Arc<PassMemory> {
        let mut memories = self.memories.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(memories.entry((namespace.to_owned(), name.to_owned())).or_default())
    }

    fn forget(&self) {
        self.memories.lock().unwrap_or_else(PoisonError::into_inner).clear();
        for job in self.jobs.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            job.abort();
        }
        self.backgrounds.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    fn background(&self, namespace: &str, name: &str) -> Arc<JobQueue> {
        let mut queues = self.backgrounds.lock().unwrap_or_else(PoisonError::into_inner);
        let limit = self.config.executor.prepull.limit;
        Arc::clone(
            queues
                .entry((namespace.to_owned(), name.to_owned()))
                .or_insert_with(|| Arc::new(JobQueue::new(name, limit))),
        )
    }

    /// Starts the jobs the last pass of operation `name` submitted, each in a task of its
    /// own with the pass's Talos and Kubernetes clients; an install's end asks for a pass.
    fn start_jobs(
        self: &Arc<Self>,
        queue: &Arc<JobQueue>,
        talos: &Arc<dyn TalosApi>,
        kube: &KubeCluster,
        namespace: &str,
        name: &str,
    ) {
        let mut handles = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        handles.retain(|h| !h.is_finished());
        for job in queue.take() {
            let (ctx, queue, talos, kube) = (Arc::clone(self), Arc::clone(queue), Arc::clone(talos), kube.clone());
            let operation = ObjectRef::new(name).within(namespace);
            let recorder = self.recorder(namespace);
            let task = tokio::spawn(async move {
                let recorder = recorder.as_deref();
                // Every side effect of the job checks this replica's leadership first.
                let fence = &ctx.fence;
                let ex = Executor {
                    talos: &FencedTalos { inner: &TracedTalos { inner: talos.as_ref(), recorder }, fence },
                    kube: &FencedKube { inner: &TracedKube { inner: &kube, recorder }, fence },
                    storage: &FencedStorage { inner: &TracedStorage { inner: &ctx.storage, recorder }, fence },
                    clock: &SystemClock,
                    config: &ctx.config.executor,
                    snapshots: None,
                    // An install that began is remembered in its queue (an outage may keep
                    // its record from being written).
                    background: Some(queue.as_ref()),
                };
                let outcome = run_job(&ex, &job).await;
                let install = matches!(job, Job::Install { .. });
                queue.done(&job, outcome);
                if install {
                    // The receiver is gone only when the controller stopped.
                    ctx.wake.unbounded_send(operation).ok();
                }
            });
            handles.push(task.abort_handle());
        }
    }

    /// The trace's recorder of `namespace`'s machines, when a trace is asked for.
    fn recorder(&self, namespace: &str) -> Option<Arc<Recorder>> {
        let root = self.trace.as_ref()?;
        let mut recorders = self.recorders.lock().unwrap_or_else(PoisonError::into_inner);
        Some(Arc::clone(recorders.entry(namespace.to_owned()).or_insert_with(|| Arc::new(root.scope()))))
    }

    fn kube(&self, namespace: &str) -> KubeCluster {
        let mut kubes = self.kubes.lock().unwrap_or_else(PoisonError::into_inner);
        kubes
            .entry(namespace.to_owned())
            .or_insert_with(|| {
                KubeCluster::new(
                    self.client.clone(),
                    namespace,
                    self.stores.clone(),
                    Reporter { controller: "ichor-operator".to_owned(), instance: Some(self.config.identity.clone()) },
                    Arc::clone(&self.counters),
                )
                .with_last_node(self.config.own_node.clone())
                .with_forbidden_hint(self.grant_hint(namespace))
                .with_workloads(self.workloads.clone())
            })
            .clone()
    }

    /// What grants the operator `namespace`, for the message of a call refused there.
    fn grant_hint(&self, namespace: &str) -> String {
        format!(
            "the operator's ServiceAccount needs the ClusterRole {} in namespace {namespace}, the namespace of the \
             TalosCluster; grant it with: {}",
            rbac::CLUSTER_NAMESPACE_ROLE,
            rbac::grant_command(namespace, &self.config.operator_namespace, rbac::NAME)
        )
    }

    /// The Talos API of `cluster` in `namespace`, from its Secret, and whether it is usable
    /// (credentials found and read).
    async fn talos(&self, namespace: &str, cluster: &str) -> (Arc<dyn TalosApi>, bool) {
        let key = (namespace.to_owned(), cluster.to_owned());
        let mut cache = self.talos.lock().await;
        if let Some(entry) = cache.get(&key)
            && entry.fetched.elapsed()
                < if entry.version.is_some() { TALOSCONFIG_TTL } else { UNUSABLE_TALOSCONFIG_TTL }
        {
            return (Arc::clone(&entry.api), entry.version.is_some());
        }
        let cached = cache.remove(&key);
        let entry = self.load_talos(namespace, cluster, cached).await;
        let usable = entry.version.is_some();
        let api = Arc::clone(&entry.api);
        cache.insert(key, entry);
        (api, usable)
    }

    async fn load_talos(&self, namespace: &str, cluster: &str, cached: Option<CachedTalos>) -> CachedTalos {
        let unusable = |why: String| {
            tracing::warn!(namespace, cluster, reason = %why, "no usable Talos credentials");
            CachedTalos { version: None, api: Arc::new(NoTalos { why }), fetched: Instant::now() }
        };
        let Some(object) = self.stores.clusters.get(&ObjectRef::<TalosCluster>::new(cluster).within(namespace)) else {
            return unusable(format!("TalosCluster {namespace}/{cluster} not found"));
        };
        let secret_name = object.spec.talosconfig_secret.clone();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = match secrets.get_opt(&secret_name).await {
            Ok(Some(secret)) => secret,
            Ok(None) => return unusable(format!("Secret {namespace}/{secret_name} (talosconfigSecret) not found")),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                return unusable(format!(
                    "reading Secret {namespace}/{secret_name} is forbidden: {}; {}",
                    status.message,
                    self.grant_hint(namespace)
                ));
            }
            Err(e) => return unusable(format!("reading Secret {namespace}/{secret_name}: {e}")),
        };
        let version = secret.resource_version();
        if let Some(cached) = cached
            && cached.version.is_some()
            && cached.version == version
        {
            // Unchanged: keep the client and its connections.
            return CachedTalos { fetched: Instant::now(), ..cached };
        }
        let context = match talos_context(&secret, namespace, &secret_name) {
            Ok(context) => context,
            Err(why) => return unusable(why),
        };
        match TalosClient::new(&context, self.config.talos.clone()) {
            Ok(client) => {
                tracing::info!(namespace, cluster, secret = %secret_name, endpoints = ?context.endpoints.iter().map(ToString::to_string).collect::<Vec<_>>(), "Talos client ready");
                CachedTalos { version, api: Arc::new(client), fetched: Instant::now() }
            }
            Err(e) => unusable(format!("Secret {namespace}/{secret_name}: {}", report(&e))),
        }
    }
}

/// The Talos context of the talosconfig in `secret` (key `talosconfig`), or what keeps it
/// from being used, naming the Secret.
pub(crate) fn talos_context(
    secret: &Secret,
    namespace: &str,
    secret_name: &str,
) -> Result<ichor_talosconfig::TalosContext, String> {
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get("talosconfig")) else {
        return Err(format!("Secret {namespace}/{secret_name} has no key talosconfig"));
    };
    let Ok(text) = std::str::from_utf8(&bytes.0) else {
        return Err(format!("Secret {namespace}/{secret_name}: talosconfig is not UTF-8"));
    };
    ichor_talosconfig::parse(text, &ichor_talosconfig::Overrides::default())
        .map_err(|e| format!("Secret {namespace}/{secret_name}: talosconfig: {e}"))
}

/// The Talos API of a cluster without usable credentials: every call fails as unreachable,
/// saying why (a wait in the operation's status, not a failure).
#[derive(Debug)]
struct NoTalos {
    why: String,
}

impl NoTalos {
    fn error(&self) -> TalosError {
        TalosError::dial("talosconfig", self.why.clone())
    }
}

#[async_trait]
impl TalosApi for NoTalos {
    async fn nodename(&self, _node: &str) -> Result<String, TalosError> {
        Err(self.error())
    }
    async fn machine_stage(&self, _node: &str) -> Result<MachineStage, TalosError> {
        Err(self.error())
    }
    // Every write, as every read: the one refusal, saying why.
    async fn write(&self, _node: &str, _write: TalosWrite<'_>, _seal: Seal) -> Result<TalosWritten, TalosError> {
        Err(self.error())
    }
    async fn etcd_members(&self, _node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        Err(self.error())
    }
    async fn etcd_status(&self, _node: &str) -> Result<EtcdStatus, TalosError> {
        Err(self.error())
    }
    async fn etcd_alarms(&self, _node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        Err(self.error())
    }
    async fn image_list(&self, _node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        Err(self.error())
    }
    async fn boot_id(&self, _node: &str) -> Result<String, TalosError> {
        Err(self.error())
    }
}

/// The executor's configuration for a pass of `op`: where maintenance windows apply (its
/// own, or its cluster's), with the p90 turns its starts are admitted on taken from the
/// cluster's last completed upgrade ([`crate::dry_run::turn_p90`]), calibrated as a dry
/// run's plan is; elsewhere, and without history, the configured ones.
fn pass_config<'c>(ctx: &'c Context, op: &TalosOperation, namespace: &str) -> Cow<'c, ExecutorConfig> {
    let configured = &ctx.config.executor;
    let cluster = ctx.stores.clusters.get(&ObjectRef::new(&op.spec.cluster).within(namespace));
    let windows = op.spec.maintenance.as_ref().or(cluster.as_ref().and_then(|c| c.spec.maintenance.as_ref()));
    if windows.is_none_or(MaintenanceSpec::is_empty) {
        return Cow::Borrowed(configured);
    }
    let defaults = Defaults::talos(configured.pass_interval.as_secs_f64()).sped_up(ctx.config.time_scale);
    let history = crate::dry_run::turn_p90(op, &ctx.stores.machines.state(), &ctx.stores.operations.state(), &defaults);
    match history {
        Some(p90) => {
            let mut config = configured.clone();
            config.turn_p90 = p90;
            Cow::Owned(config)
        }
        None => Cow::Borrowed(configured),
    }
}

async fn reconcile(op: Arc<TalosOperation>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if !leads(*ctx.leading.borrow()) {
        ctx.forget();
        ctx.metrics.pass("skipped");
        return Ok(Action::await_change());
    }
    // An operation listed before the machines, clusters or Nodes would be decided from
    // caches that read empty: looked at again once every watch has listed.
    if !ctx.stores.is_ready() {
        ctx.metrics.pass("skipped");
        return Ok(Action::requeue(NOT_LISTED_REQUEUE));
    }
    let namespace = op.namespace().unwrap_or_default();
    let name = op.name_any();
    // At most one pass per pass interval: what woke this one early rides with the next.
    let now = SystemClock.now();
    if let Some(at) = ctx.memory(&namespace, &name).defer_pass(now, ctx.config.executor.pass_interval) {
        ctx.metrics.pass("deferred");
        let wait = Duration::from_millis(u64::try_from(at.unix_millis() - now.unix_millis()).unwrap_or(0));
        return Ok(Action::requeue(wait.max(MIN_REQUEUE)));
    }
    // Discovery first: the engine then accounts for every Node with the machines made.
    if discover(&ctx, &namespace, &op.spec.cluster).await.map_err(ControllerError::Discovery)? > 0 {
        // Decided once the machines' watch events have filled the store.
        return Ok(Action::requeue(MIN_REQUEUE));
    }
    if op.spec.dry_run {
        return dry_run(&ctx, &op).await.inspect_err(|e| ctx.metrics.error(e.kind()));
    }
    let started = Instant::now();
    let kube = ctx.kube(&namespace);
    let result: Result<_, ControllerError> = async {
        kube.ensure_finalizer(&name).await.map_err(ControllerError::Finalizer)?;
        let (talos, usable) = ctx.talos(&namespace, &op.spec.cluster).await;
        let queue = ctx.background(&namespace, &name);
        let recorder = ctx.recorder(&namespace);
        let recorder = recorder.as_deref();
        // Leadership is checked before every side effect of the pass, not only at its start:
        // a pass can last minutes.
        let fence = &ctx.fence;
        let config = pass_config(&ctx, &op, &namespace);
        let executor = Executor {
            snapshots: ctx.config.snapshots.as_deref(),
            talos: &FencedTalos { inner: &TracedTalos { inner: talos.as_ref(), recorder }, fence },
            kube: &FencedKube { inner: &TracedKube { inner: &kube, recorder }, fence },
            storage: &FencedStorage { inner: &TracedStorage { inner: &ctx.storage, recorder }, fence },
            clock: &SystemClock,
            config: &config,
            background: Some(queue.as_ref()),
        };
        let memory = ctx.memory(&namespace, &name);
        let outcome = ichor_executor::reconcile_with(&executor, &name, &memory).await;
        if let Ok(outcome) = &outcome {
            memory.pass_ended(SystemClock.now(), outcome.requeue_at);
        }
        ctx.start_jobs(&queue, &talos, &kube, &namespace, &name);
        Ok((outcome?, usable))
    }
    .await;
    ctx.metrics.duration.observe(started.elapsed().as_secs_f64());
    let (mut outcome, usable) = match result {
        Ok(outcome) => outcome,
        Err(e) => {
            ctx.metrics.pass("error");
            ctx.metrics.error(e.kind());
            return Err(e);
        }
    };
    ctx.metrics.pass("ok");
    tracing::debug!(%namespace, operation = %name, phase = %outcome.phase, requeue_at = ?outcome.requeue_at, "pass");
    // The pass that completed the operation wrote a status the store has not seen yet
    // (and status changes trigger no pass): read back once, for the cluster's summary and
    // the calibration.
    let completed = outcome.phase.name() == "Completed";
    let fresh = if completed && crate::dry_run::completed_at(&op).is_none() {
        let api: Api<TalosOperation> = Api::namespaced(ctx.client.clone(), &namespace);
        api.get_opt(&name).await.ok().flatten().map(Arc::new)
    } else {
        None
    };
    write_cluster_status(&ctx, &namespace, &op.spec.cluster, fresh.as_ref()).await;
    if !usable && !outcome.finished && outcome.phase.name() != "Refused" {
        // Decided without the cluster's Talos API (no TalosCluster, Secret or talosconfig
        // yet): looked at again once the credentials are read again, not at the wait's
        // own recheck (the etcd gate's is half a minute).
        let soon = SystemClock.now().saturating_add(UNUSABLE_TALOSCONFIG_TTL);
        outcome.requeue_at = Some(outcome.requeue_at.map_or(soon, |at| at.min(soon)));
    }
    // A completed upgrade after a dry run: the plan against what happened, once.
    if completed
        && let Some(calibration) =
            crate::dry_run::calibration(fresh.as_ref().unwrap_or(&op), &ctx.stores.operations.state())
    {
        write_plan_status(&ctx, &op, serde_json::json!({ "calibration": calibration })).await?;
    }
    if outcome.finished {
        return Ok(Action::await_change());
    }
    Ok(match outcome.requeue_at {
        Some(at) => {
            let now = SystemClock.now();
            let wait = Duration::from_millis(u64::try_from(at.unix_millis() - now.unix_millis()).unwrap_or(0));
            Action::requeue(wait.max(MIN_REQUEUE))
        }
        None => Action::await_change(),
    })
}

/// The field manager of what a dry run writes and of a calibration: `status.plan` and a
/// dry run's phase, `status.calibration` (the engine's manager owns the rest).
const PLAN_FIELD_MANAGER: &str = "ichor-plan";

/// How soon a dry run for a cluster not yet made looks again.
const DRY_RUN_RETRY: Duration = Duration::from_secs(10);

/// A dry run's pass: the plan of the upgrade it describes, in its status; nothing else is
/// read past the stores but the preflight's facts, and nothing else is written
/// ([`crate::dry_run`]).
async fn dry_run(ctx: &Context, op: &TalosOperation) -> Result<Action, ControllerError> {
    if crate::dry_run::planned_already(op) {
        ctx.metrics.pass("ok");
        return Ok(Action::await_change());
    }
    let namespace = op.namespace().unwrap_or_default();
    let Some(cluster) = ctx.stores.clusters.get(&ObjectRef::new(&op.spec.cluster).within(&namespace)) else {
        let message = format!("TalosCluster {namespace}/{} not found: planned once it is made", op.spec.cluster);
        write_plan_status(
            ctx,
            op,
            serde_json::json!({ "phase": "Pending", "reason": "ClusterNotFound", "message": message }),
        )
        .await?;
        ctx.metrics.pass("ok");
        return Ok(Action::requeue(DRY_RUN_RETRY));
    };
    let nodes: Vec<Arc<Node>> =
        ctx.stores.nodes.state().into_iter().filter(|n| cluster.spec.selects(n.labels())).collect();
    let machines = ctx.stores.machines.state();
    let asked: Vec<String> = crate::recorded::machines_of(op, &machines)
        .into_iter()
        .filter_map(|m| crate::dry_run::node_of(m, &nodes).map(ResourceExt::name_any))
        .collect();
    let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
    let kubernetes = op.spec.kind == ichor_upgrade_core::operation::OperationKind::KUBERNETES;
    let (facts, storage, read) = if kubernetes {
        // A Kubernetes upgrade drains nothing and evacuates nothing: what it plans from is
        // the cluster's Kubernetes, and the machines' configurations (read only).
        let (talos, _) = ctx.talos(&namespace, &op.spec.cluster).await;
        let of = crate::recorded::machines_of(op, &machines);
        let bound = ctx.config.executor.call_timeout;
        let read = crate::dry_run::kubernetes::read(&ctx.kube(&namespace), talos.as_ref(), &of, &nodes, bound).await;
        let read = match read {
            Ok(read) => read,
            Err(crate::dry_run::kubernetes::ReadError::Refused(refusal)) => {
                let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
                write_plan_status(ctx, op, crate::dry_run::status_patch(op, &Err(refusal), now)).await?;
                ctx.metrics.pass("ok");
                return Ok(Action::await_change());
            }
            Err(crate::dry_run::kubernetes::ReadError::Kube(e)) => return Err(ControllerError::DryRunRead(e)),
        };
        (ichor_upgrade_core::preflight::ClusterFacts::default(), Ok(crate::dry_run::StorageNow::default()), Some(read))
    } else {
        let facts = ctx.kube(&namespace).preflight_facts(&asked).await.map_err(ControllerError::DryRunRead)?;
        // What storage holds now: its objects, and (only where there are any) one list of
        // the replicas' sizes. A read that fails is said in the plan, not a failed plan.
        let storage = async {
            let objects = ichor_storage::StorageReads::storage_objects(&ctx.storage).await?;
            let bytes = if objects.is_empty() { BTreeMap::new() } else { ctx.storage.bytes_by_node().await? };
            Ok::<_, ichor_storage::StorageError>(crate::dry_run::StorageNow { objects, bytes })
        }
        .await
        .map_err(|e| e.to_string());
        (facts, storage, None)
    };
    // The health gates, read now as the upgrade's pass would read them.
    let specs = op.spec.gates.as_deref().unwrap_or(cluster.spec.gates.as_deref().unwrap_or_default());
    let identity = format!("{namespace}/{}/{}", op.name_any(), op.uid().unwrap_or_default());
    let bound = ctx.config.executor.call_timeout;
    let gates = match crate::dry_run::read_gates(&ctx.kube(&namespace), bound, specs, &identity).await {
        Ok(gates) => gates,
        Err(refusal) => {
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
            write_plan_status(ctx, op, crate::dry_run::status_patch(op, &Err(refusal), now)).await?;
            ctx.metrics.pass("ok");
            return Ok(Action::await_change());
        }
    };
    let dry = crate::dry_run::DryRun {
        operation: op,
        machines: &machines,
        nodes: &nodes,
        operations: &ctx.stores.operations.state(),
        facts,
        preflight: ichor_upgrade_core::preflight::PreflightConfig::default(),
        preflight_warns: op.spec.preflight == Some(ichor_adapters::kubernetes::crd::Preflight::Warn),
        defaults: ichor_upgrade_core::plan::Defaults::talos(ctx.config.executor.pass_interval.as_secs_f64())
            .sped_up(ctx.config.time_scale),
        own_node: ctx.config.own_node.as_deref(),
        storage,
        maintenance: op.spec.maintenance.as_ref().or(cluster.spec.maintenance.as_ref()),
        gates,
        now: SystemClock.now(),
    };
    let started = Instant::now();
    let planned = match &read {
        Some(read) => crate::dry_run::kubernetes::plan_status(&dry, read),
        None => crate::dry_run::plan_status(&dry),
    };
    tracing::info!(
        %namespace,
        operation = %op.name_any(),
        seconds = started.elapsed().as_secs_f64(),
        machines = machines.len(),
        "dry run planned"
    );
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    write_plan_status(ctx, op, crate::dry_run::status_patch(op, &planned, now)).await?;
    ctx.metrics.pass("ok");
    Ok(Action::await_change())
}

/// Applies `status` (part of a TalosOperation's status) as [`PLAN_FIELD_MANAGER`], under
/// the fence.
async fn write_plan_status(
    ctx: &Context,
    op: &TalosOperation,
    status: serde_json::Value,
) -> Result<(), ControllerError> {
    if !ctx.fence.leads() {
        return Err(ControllerError::PlanWrite(kube::Error::Service("not sent: this replica no longer leads".into())));
    }
    let api: Api<TalosOperation> = Api::namespaced(ctx.client.clone(), &op.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": "ichor.dev/v1alpha1",
        "kind": "TalosOperation",
        "metadata": { "name": op.name_any() },
        "status": status,
    });
    api.patch_status(&op.name_any(), &PatchParams::apply(PLAN_FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(ControllerError::PlanWrite)?;
    Ok(())
}

/// Writes `cluster`'s status when it changed ([`cluster_status`]), with `fresh` (an
/// operation read back after the pass that completed it) in place of the store's; best
/// effort (the next pass writes it again).
async fn write_cluster_status(ctx: &Context, namespace: &str, cluster: &str, fresh: Option<&Arc<TalosOperation>>) {
    let Some(object) = ctx.stores.clusters.get(&ObjectRef::new(cluster).within(namespace)) else { return };
    let mut operations = ctx.stores.operations.state();
    if let Some(fresh) = fresh {
        operations.retain(|o| o.uid() != fresh.uid());
        operations.push(Arc::clone(fresh));
    }
    let status =
        cluster_status::summarize(&object, &ctx.stores.nodes.state(), &ctx.stores.machines.state(), &operations);
    if let Err(e) = cluster_status::write(&ctx.client, &object, &status, &ctx.fence).await {
        tracing::warn!(%namespace, %cluster, error = %e, "the TalosCluster's status was not written");
    }
}

/// Makes the TalosMachines `cluster`'s Nodes lack when it asks for discovery
/// ([`crate::discovery`]); how many it wrote.
async fn discover(ctx: &Context, namespace: &str, cluster: &str) -> Result<usize, kube::Error> {
    let Some(cluster) = ctx.stores.clusters.get(&ObjectRef::new(cluster).within(namespace)) else { return Ok(0) };
    let machines: Vec<_> =
        ctx.stores.machines.state().into_iter().filter(|m| m.namespace().as_deref() == Some(namespace)).collect();
    let found = discovery::plan(&cluster, &ctx.stores.nodes.state(), &machines);
    for (node, why) in &found.skipped {
        tracing::warn!(%namespace, cluster = %cluster.name_any(), %node, why, "no TalosMachine discovered for the Node");
    }
    discovery::apply(&ctx.client, namespace, &found.apply, &ctx.fence).await
}

/// How often the leader tends every TalosCluster: discovery, status, desired state ([`crate::desired`]).
pub const CLUSTER_INTERVAL: Duration = Duration::from_secs(2);

/// The leader's care of every TalosCluster, beside the operations' passes, every
/// [`CLUSTER_INTERVAL`]: its machines discovered from its Nodes (`spec.discovery: Nodes`),
/// its status kept in step with its Nodes (versions, counts, the operation holding it),
/// and, for `spec.upgrades: Automatic`, its next operation made and its old ones collected
/// ([`crate::desired`]).
///
/// Its authority is the leader's, re-checked at each tick ([`leads`]) and before every
/// write (the fence). It never touches a machine: an operation it makes is decided by its
/// own passes under every gate. What it decides is read from the stores at the tick, so a
/// hold, a pause or a deletion made at any instant before is seen then, and one made after
/// by the pass of the operation (a paused cluster's new operation begins nothing; a
/// deleted cluster's operation is refused, and collected with its owner).
async fn tend_clusters(ctx: Arc<Context>) {
    loop {
        tokio::time::sleep(CLUSTER_INTERVAL).await;
        if !leads(*ctx.leading.borrow()) || !ctx.stores.is_ready() {
            continue;
        }
        for cluster in ctx.stores.clusters.state() {
            tend(&ctx, &cluster).await;
        }
    }
}

/// One cluster's care ([`tend_clusters`]); what fails is logged and tried at the next tick.
async fn tend(ctx: &Context, cluster: &TalosCluster) {
    let (namespace, name) = (cluster.namespace().unwrap_or_default(), cluster.name_any());
    match discover(ctx, &namespace, &name).await {
        Ok(0) => {}
        // Its status and next step once the store has the machines.
        Ok(_) => return,
        Err(e) => tracing::warn!(%namespace, cluster = %name, error = %e, "discovery failed"),
    }
    write_cluster_status(ctx, &namespace, &name, None).await;
    let operations = ctx.stores.operations.state();
    let api: Api<TalosOperation> = Api::namespaced(ctx.client.clone(), &namespace);
    if let crate::desired::Next::Make(op) = crate::desired::next(cluster, &ctx.stores.nodes.state(), &operations) {
        if !ctx.fence.leads() {
            return;
        }
        let made = op.name_any();
        match api.create(&kube::api::PostParams::default(), &op).await {
            Ok(_) => {
                tracing::info!(%namespace, cluster = %name, operation = %made, kind = %op.spec.kind, target = %op.spec.target_version, "operation made for the cluster's versions");
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => {
                tracing::warn!(%namespace, cluster = %name, operation = %made, error = %e, "the operation was not made")
            }
        }
    }
    for old in crate::desired::to_collect(cluster, &operations) {
        if !ctx.fence.leads() {
            return;
        }
        match delete_as_read(&api, old).await {
            Ok(true) => {
                tracing::info!(%namespace, cluster = %name, operation = %old.name_any(), "old completed operation deleted")
            }
            // Gone already, or changed since it was read: the next tick reads it again.
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%namespace, cluster = %name, operation = %old.name_any(), error = %e, "an old operation was not deleted")
            }
        }
    }
}

/// Deletes `op` as it was read, and only so: not a namesake made since, nor the same
/// operation changed since (a person's hold or annotation), by preconditions on its uid
/// and resourceVersion. `Ok(true)` when this call deleted it; `Ok(false)` when it was gone
/// already or changed since it was read (the next reading decides again).
///
/// # Errors
/// The API server's, but for those two answers (404, 409).
pub async fn delete_as_read(api: &Api<TalosOperation>, op: &TalosOperation) -> Result<bool, kube::Error> {
    let preconditions = kube::api::Preconditions { uid: op.uid(), resource_version: op.resource_version() };
    let params = kube::api::DeleteParams { preconditions: Some(preconditions), ..kube::api::DeleteParams::default() };
    match api.delete(&op.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

fn error_policy(op: Arc<TalosOperation>, error: &ControllerError, _ctx: Arc<Context>) -> Action {
    let (namespace, operation) = (op.namespace().unwrap_or_default(), op.name_any());
    if error.is_transient() {
        // A conflict (the store behind the engine's own last write), an unreachable API
        // server: the next watch event or the backoff brings the next pass.
        tracing::info!(%namespace, %operation, error = %report(error), "pass ended early; retrying");
    } else {
        tracing::warn!(%namespace, %operation, error = %report(error), "pass failed; retrying");
    }
    Action::requeue(ERROR_BACKOFF)
}

/// The operations of `cluster` in `namespace`.
fn operations_of(
    store: &Store<TalosOperation>,
    namespace: Option<&str>,
    cluster: &str,
) -> Vec<ObjectRef<TalosOperation>> {
    store
        .state()
        .iter()
        .filter(|op| op.namespace().as_deref() == namespace && op.spec.cluster == cluster)
        .map(|op| ObjectRef::from_obj(op.as_ref()))
        .collect()
}

/// The operations whose machines name the Node `node` (by hostname or address).
fn operations_on_node(stores: &Stores, node: &str, addresses: &[String]) -> Vec<ObjectRef<TalosOperation>> {
    let machines = stores.machines.state();
    let clusters: Vec<(Option<String>, String)> = machines
        .iter()
        .filter(|m| m.spec.hostname.as_deref() == Some(node) || addresses.contains(&m.spec.address))
        .map(|m| (m.namespace(), m.spec.cluster.clone()))
        .collect();
    let mut refs: Vec<ObjectRef<TalosOperation>> = clusters
        .iter()
        .flat_map(|(namespace, cluster)| operations_of(&stores.operations, namespace.as_deref(), cluster))
        .collect();
    refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    refs.dedup();
    refs
}

fn node_addresses(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|a| a.address.clone()).collect())
        .unwrap_or_default()
}

/// The operations with a machine on Node `node`, each told that the node's storage changed
/// (see [`PassMemory::storage_changed`]).
fn storage_changed(ctx: &Context, stores: &Stores, node: &str) -> Vec<ObjectRef<TalosOperation>> {
    let operations = operations_on_node(stores, node, &[]);
    for op in &operations {
        ctx.memory(op.namespace.as_deref().unwrap_or_default(), &op.name).storage_changed(node);
    }
    operations
}

/// Whether a replica in `store` is on `node` (by Longhorn's node label).
fn has_replica_on(store: &Store<PartialObjectMeta<DynamicObject>>, node: &str) -> bool {
    store.find(|r| r.labels().get(REPLICA_NODE_LABEL).is_some_and(|n| n == node)).is_some()
}

/// Longhorn's kinds the controller watches, when Longhorn is installed.
struct LonghornKinds {
    node: ApiResource,
    replica: ApiResource,
    /// Served from Longhorn 1.12.1 (the v2 data engine's sharding).
    shard: Option<ApiResource>,
}

/// Longhorn's node, replica and (where served) shard kinds when Longhorn is installed,
/// `None` when the API server says it is not (the group version is not served, or serves
/// no nodes and replicas); an error when it could not tell (not reachable yet, a 5xx).
async fn longhorn_resources(client: &Client) -> Result<Option<LonghornKinds>, kube::Error> {
    match client.list_api_group_resources("longhorn.io/v1beta2").await {
        Ok(list) => {
            let has = |plural: &str| list.resources.iter().any(|r| r.name == plural);
            if !(has("nodes") && has("replicas")) {
                return Ok(None);
            }
            let resource = |kind: &str, plural: &str| {
                ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("longhorn.io", "v1beta2", kind), plural)
            };
            Ok(Some(LonghornKinds {
                node: resource("Node", "nodes"),
                replica: resource("Replica", "replicas"),
                shard: has("shards").then(|| resource("Shard", "shards")),
            }))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// How long the operator tries to learn whether Longhorn is installed before it starts
/// without watching it.
/// (Under the liveness probe's 30 s: the operator reports live only once it runs.)
pub const LONGHORN_DETECTION_BOUND: Duration = Duration::from_secs(20);

/// Whether Longhorn is installed, asked again with backoff (1 s doubling to 15 s) while the
/// API server cannot tell, for up to [`LONGHORN_DETECTION_BOUND`]. "Not installed" only on
/// a definite answer; after the bound, a warning and a Warning Event on this pod (when it
/// knows its name) say its objects are not watched: an evacuation still reads Longhorn on
/// each pass, only without the wake-ups its watch gives.
async fn detect_longhorn(client: &Client, bound: Duration) -> Option<LonghornKinds> {
    let deadline = Instant::now() + bound;
    let mut delay = Duration::from_secs(1);
    loop {
        // Bounded as a whole: the client itself retries some answers (a 503) on its own.
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        let answer = tokio::time::timeout(left, longhorn_resources(client))
            .await
            .unwrap_or_else(|_| Err(kube::Error::Service(format!("no answer within {left:?}").into())));
        match answer {
            Ok(Some(kinds)) => {
                tracing::info!(
                    shards = kinds.shard.is_some(),
                    "Longhorn is installed: its nodes and replicas are watched"
                );
                return Some(kinds);
            }
            Ok(None) => {
                tracing::info!("Longhorn is not installed (no longhorn.io/v1beta2 nodes and replicas): not watched");
                return None;
            }
            Err(e) if Instant::now() + delay < deadline => {
                tracing::warn!(error = %e, retry_in = ?delay, "could not tell whether Longhorn is installed; asking again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(15));
            }
            Err(e) => {
                let message = format!(
                    "could not tell whether Longhorn is installed within {}s ({e}): its objects are not watched \
                     until the operator restarts; evacuations still read Longhorn on each pass",
                    bound.as_secs()
                );
                tracing::warn!("{message}");
                warn_on_own_pod(client, "LonghornDetectionFailed", &message).await;
                return None;
            }
        }
    }
}

/// A Warning Event on this operator's pod (`POD_NAME`, `POD_NAMESPACE`, as
/// `deploy/operator.yaml` sets them); nothing when it does not know them.
async fn warn_on_own_pod(client: &Client, reason: &str, message: &str) {
    let (Ok(name), Ok(namespace)) = (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) else { return };
    let reporter = Reporter { controller: "ichor-operator".to_owned(), instance: Some(name.clone()) };
    let recorder = kube::runtime::events::Recorder::new(client.clone(), reporter);
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(name),
        namespace: Some(namespace),
        ..Default::default()
    };
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: reason.to_owned(),
        note: Some(message.chars().take(1000).collect()),
        action: reason.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, "could not record an Event on the operator's pod");
    }
}

/// Whether any object in `stores` (Longhorn's replicas, shards) is on `node`.
fn has_data_on(stores: &[Store<PartialObjectMeta<DynamicObject>>], node: &str) -> bool {
    stores.iter().any(|store| has_replica_on(store, node))
}

/// Runs the controller until `shutdown` resolves, then lets the passes in flight end.
///
/// `leading` says until when this replica leads ([`crate::leader::Leadership::subscribe`]);
/// passes triggered while it does not are skipped, and every operation is reconciled when
/// it starts to lead.
pub async fn run(
    client: Client,
    config: OperatorConfig,
    leading: tokio::sync::watch::Receiver<Option<Instant>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Every machine the watch applies, its status writes included, for the step durations.
    let steps = Arc::clone(&metrics);
    let (stores, streams) = watch_observing(&client, config.namespace.as_deref(), move |m| steps.machine_seen(m));
    let counters = Arc::new(Counters::default());
    metrics.register_collector(EngineCalls(Arc::clone(&counters)));
    metrics.register_collector(Operations(stores.operations.clone(), metrics.leader.clone()));
    // Whether Longhorn's CRDs exist, followed by watches of those two CRDs by name (reads
    // only, no authority): a cluster without Longhorn is asked nothing of it per machine.
    let storage = LonghornStorage::new(client.clone(), &config.longhorn_namespace)
        .with_crds(ichor_adapters::longhorn::LonghornCrds::watch(&client))
        .with_storage_objects(stores.storages.clone());
    let longhorn = detect_longhorn(&client, LONGHORN_DETECTION_BOUND).await;

    // Every operation is reconciled when this replica starts to lead, or leads again after
    // its leadership lapsed.
    let (gained_tx, gained_rx) = futures::channel::mpsc::unbounded::<()>();
    let recorder = config.trace.clone().map(|sink| Arc::new(Recorder::new(sink)));
    // An operation whose background install ended is looked at again at once.
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded::<ObjectRef<TalosOperation>>();
    {
        let leading = leading.clone();
        let metrics = Arc::clone(&metrics);
        let (recorder, identity) = (recorder.clone(), config.identity.clone());
        tokio::spawn(async move {
            let mut was = false;
            loop {
                let now = leads(*leading.borrow());
                metrics.leader.set(i64::from(now));
                if now && !was {
                    if let Some(recorder) = &recorder {
                        recorder.controller_started(&identity);
                    }
                    if gained_tx.unbounded_send(()).is_err() {
                        return;
                    }
                }
                was = now;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }

    {
        let stores = stores.clone();
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            while stores.ready(Duration::from_secs(60)).await.is_err() {
                tracing::warn!("the watches have not listed yet");
            }
            health.ready.store(true, Ordering::Relaxed);
            tracing::info!("watches listed; ready");
        });
    }

    let ctx = Arc::new(Context {
        client: client.clone(),
        config: config.clone(),
        stores: stores.clone(),
        // Reads only, fed from the watches' own tasks: no authority, nothing written. A
        // pass reads them, and the drain's decision that a node is empty is read again
        // from the API server (`ichor_adapters::kubernetes::workloads`).
        workloads: WorkloadStores::spawn(&client),
        counters,
        metrics: Arc::clone(&metrics),
        storage,
        trace: recorder,
        recorders: Mutex::new(HashMap::new()),
        kubes: Mutex::new(HashMap::new()),
        talos: tokio::sync::Mutex::new(HashMap::new()),
        memories: Mutex::new(HashMap::new()),
        backgrounds: Mutex::new(HashMap::new()),
        jobs: Mutex::new(Vec::new()),
        wake: wake_tx,
        fence: Fence::new(leading.clone()),
        leading,
    });
    // A replica that stops leading aborts its jobs at once (another may act meanwhile), not
    // when its next pass is triggered.
    let lapse = {
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let mut was = false;
            loop {
                let now = ctx.fence.leads();
                if was && !now {
                    tracing::warn!("no longer leading: jobs aborted, memory forgotten");
                    ctx.forget();
                }
                was = now;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let at_end = Arc::clone(&ctx);
    let tending = tokio::spawn(tend_clusters(Arc::clone(&ctx)));
    // The notices of each operation to its cluster's receivers: the leader's, fenced
    // ([`crate::notify`]).
    let notifying = tokio::spawn(
        crate::notify::Notifier::new(
            ctx.client.clone(),
            stores.operations.clone(),
            stores.clusters.clone(),
            Fence::new(ctx.leading.clone()),
        )
        .run(),
    );

    let ops = stores.operations.clone();
    let by_machine = move |m: TalosMachine| operations_of(&ops, m.namespace().as_deref(), &m.spec.cluster);
    let ops = stores.operations.clone();
    let by_cluster = move |c: TalosCluster| operations_of(&ops, c.namespace().as_deref(), &c.name_any());
    let ops = stores.operations.clone();
    let every =
        move |_: TalosStorage| ops.state().iter().map(|op| ObjectRef::from_obj(op.as_ref())).collect::<Vec<_>>();
    let on_node = stores.clone();
    let by_node = move |n: Node| operations_on_node(&on_node, &n.name_any(), &node_addresses(&n));

    // The trigger streams carry no errors (each watch backs its own off and relists at once
    // on a 410: `engine_watcher`, `without_errors`); the controller's own backoff over
    // them all, kept short in case, held every watch for one's error: 45 s with kube-rs's
    // default after an API server restart, then 2 s per watch's 410, one after another.
    let mut controller = Controller::for_stream(streams.operations, stores.operations.clone())
        .trigger_backoff(ichor_adapters::kubernetes::watch_backoff())
        .watches_stream(streams.machines, by_machine)
        .watches_stream(streams.clusters, by_cluster)
        .watches_stream(streams.nodes, by_node)
        .watches_stream(streams.storages, every);
    if let Some(LonghornKinds { node: node_kind, replica: replica_kind, shard: shard_kind }) = longhorn {
        let namespace = config.longhorn_namespace.clone();
        let nodes = without_errors(
            engine_watcher(
                Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &node_kind),
                watcher::Config::default(),
            )
            .touched_objects(),
        );
        // Replicas and shards are watched by their metadata only (the node label is all a
        // pass needs), each into a store of its own, which tell whether a node has any
        // data left.
        let data_watch = |kind: &ApiResource| {
            let writer = reflector::store::Writer::<PartialObjectMeta<DynamicObject>>::new(kind.clone());
            let store = writer.as_reader();
            let stream = without_errors(
                engine_watcher(
                    Api::<PartialObjectMeta<DynamicObject>>::namespaced_with(client.clone(), &namespace, kind),
                    watcher::Config::default(),
                )
                .reflect(writer)
                .touched_objects(),
            );
            (store, stream)
        };
        let (replica_store, replicas) = data_watch(&replica_kind);
        let shards = shard_kind.as_ref().map(data_watch);
        let data: Arc<[Store<PartialObjectMeta<DynamicObject>>]> =
            std::iter::once(replica_store).chain(shards.as_ref().map(|(store, _)| store.clone())).collect();
        // Each event also tells the passes of the operations on that node that its storage
        // changed: a machine evacuating there is looked at again at once, not at its next
        // poll.
        let (on_node, marks) = (stores.clone(), Arc::clone(&ctx));
        let by_longhorn_node = move |n: DynamicObject| storage_changed(&marks, &on_node, &n.name_any());
        // A replica's or shard's change matters to a pass only when it leaves its node with
        // none of either (an evacuation waits for that; nothing else a pass decides counts
        // them): the store has applied the change when the mapper sees it.
        let by_data = |stores: Stores, ctx: Arc<Context>, data: Arc<[Store<PartialObjectMeta<DynamicObject>>]>| {
            move |r: PartialObjectMeta<DynamicObject>| match r.labels().get(REPLICA_NODE_LABEL) {
                Some(node) if !has_data_on(&data, node) => storage_changed(&ctx, &stores, node),
                _ => Vec::new(),
            }
        };
        let by_replica = by_data(stores.clone(), Arc::clone(&ctx), Arc::clone(&data));
        controller = controller.watches_stream_with(nodes, by_longhorn_node, node_kind).watches_stream_with(
            replicas,
            by_replica,
            replica_kind,
        );
        if let (Some((_, shards)), Some(shard_kind)) = (shards, shard_kind) {
            let by_shard = by_data(stores.clone(), Arc::clone(&ctx), Arc::clone(&data));
            controller = controller.watches_stream_with(shards, by_shard, shard_kind);
        }
    }

    health.live.store(true, Ordering::Relaxed);
    controller
        .reconcile_all_on(gained_rx)
        .reconcile_on(wake_rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller");
            }
        })
        .await;
    // Before the caller releases the Lease: nothing of this replica's acts after it.
    lapse.abort();
    tending.abort();
    notifying.abort();
    at_end.forget();
    health.live.store(false, Ordering::Relaxed);
    tracing::info!("controller stopped; jobs aborted");
}

#[cfg(test)]
mod tests {
    /// A loopback HTTP server answering every request with `status` and a JSON Status
    /// body; how many requests it answered.
    fn answering(status: u16) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let answered = Arc::clone(&count);
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer);
                answered.fetch_add(1, Ordering::SeqCst);
                let body = format!(
                    r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"answer {status}","reason":"","code":{status}}}"#
                );
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (url, count)
    }

    fn client(url: &str) -> Client {
        let config = kube::Config::new(url.parse().unwrap());
        Client::try_from(config).unwrap()
    }

    #[tokio::test]
    async fn longhorn_is_not_installed_only_on_a_definite_answer() {
        let (url, asked) = answering(404);
        assert!(detect_longhorn(&client(&url), Duration::from_secs(10)).await.is_none());
        assert_eq!(asked.load(Ordering::SeqCst), 1, "a 404 is an answer: asked once");

        let (url, asked) = answering(500);
        assert!(longhorn_resources(&client(&url)).await.is_err(), "a 500 is no answer");
        let started = Instant::now();
        assert!(detect_longhorn(&client(&url), Duration::from_secs(4)).await.is_none());
        assert!(asked.load(Ordering::SeqCst) >= 3, "asked again with backoff: {}", asked.load(Ordering::SeqCst));
        assert!(started.elapsed() >= Duration::from_secs(2), "it waited between the attempts");

        // The client retries a 503 on its own, without end: detection still ends (this
        // test would hang otherwise, as its first version did).
        let (url, _) = answering(503);
        assert!(detect_longhorn(&client(&url), Duration::from_secs(2)).await.is_none());
    }

    use kube::api::ObjectMeta;
    use kube::runtime::reflector::store::Writer;

    use super::*;

    fn replica(name: &str, node: &str) -> PartialObjectMeta<DynamicObject> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("longhorn-system".to_owned()),
                labels: Some([(REPLICA_NODE_LABEL.to_owned(), node.to_owned())].into()),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn a_node_has_a_replica_left_until_its_last_one_is_deleted() {
        let kind =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("longhorn.io", "v1beta2", "Replica"), "replicas");
        let mut writer = Writer::<PartialObjectMeta<DynamicObject>>::new(kind);
        let store = writer.as_reader();
        for (name, node) in [("r1", "w1"), ("r2", "w1"), ("r3", "w2")] {
            writer.apply_watcher_event(&watcher::Event::Apply(replica(name, node)));
        }
        assert!(has_replica_on(&store, "w1") && has_replica_on(&store, "w2"));
        assert!(!has_replica_on(&store, "w3"), "no replica was ever on w3");
        writer.apply_watcher_event(&watcher::Event::Delete(replica("r1", "w1")));
        assert!(has_replica_on(&store, "w1"), "r2 is still on w1");
        writer.apply_watcher_event(&watcher::Event::Delete(replica("r2", "w1")));
        assert!(!has_replica_on(&store, "w1"), "w1's last replica is gone");
        assert!(has_replica_on(&store, "w2"));

        // A shard left on w1 (Longhorn 1.12.1) is data left too.
        let kind =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("longhorn.io", "v1beta2", "Shard"), "shards");
        let mut shards = Writer::<PartialObjectMeta<DynamicObject>>::new(kind);
        shards.apply_watcher_event(&watcher::Event::Apply(replica("sg-0", "w1")));
        let data = [store.clone(), shards.as_reader()];
        assert!(has_data_on(&data, "w1"), "no replica, a shard");
        shards.apply_watcher_event(&watcher::Event::Delete(replica("sg-0", "w1")));
        assert!(!has_data_on(&data, "w1"));
    }
}
