//! `kubectl ichor`: a kubectl plugin (the `kubectl-ichor` binary on `PATH`) to see and
//! steer operations without reading the code. It talks to the API server, with the user's
//! kubeconfig, as kubectl does (`--kubeconfig`, `-n`), and never writes anything but the
//! annotations a person would write with `kubectl annotate`. Only `audit` talks to Talos,
//! to read etcd, with the talosconfig of the cluster's own Secret.
//!
//! | command | what it does |
//! | --- | --- |
//! | `status [NAME]` | each operation (or NAME): phase, reason, message, a progress bar, and each machine's step |
//! | `pause NAME` | sets `ichor.dev/pause` on an operation that has not ended: nothing new begins |
//! | `resume NAME` | removes `ichor.dev/pause`; on an operation a failure paused, sets `ichor.dev/resume` to the time now |
//! | `hold NAME` / `release NAME` | sets `ichor.dev/hold` on the TalosMachine NAME (else the Node NAME); a release removes it from the machine and its Node |
//! | `timeline NAME -o FILE.svg` | draws the operation from its machines' recorded history; a dry run's plan, its median run |
//! | `audit CLUSTER [-o json]` | the morning-after audit of TalosCluster CLUSTER, now: cordons left, static pods crash-looping, Nodes not Ready or off the declared versions, etcd, budgets at zero |
//!
//! Exit codes: 0 done (an audit: clean), 1 refused or failed (an operation that is not
//! paused, one not found, the API server's error), 2 a bad argument or an unusable
//! kubeconfig, 3 the audit found something (its report on standard output).

mod audit;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use ichor_adapters::kubernetes::crd::{PlanStatus, Role, TalosMachine, TalosOperation};
use ichor_timeline::{Options, Timeline, TraceRecord, render};

use crate::recorded::{Origin, history_records, machines_of};
use ichor_upgrade_core::machine::kubernetes::KUBERNETES_UPGRADE;
use ichor_upgrade_core::machine::removal::NODE_REMOVAL;
use ichor_upgrade_core::machine::vocabulary::TALOS_LIFECYCLE;
use ichor_upgrade_core::operation::{HOLD_ANNOTATION, OperationKind, PAUSE_ANNOTATION, RESUME_ANNOTATION};
use ichor_upgrade_core::upgrade_marker::TALOS_UPGRADE;
use ichor_upgrade_core::versions::TalosVersion;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::json;

/// Exit code: refused or failed.
pub const EXIT_FAILED: i32 = 1;
/// Exit code: a bad argument or kubeconfig.
pub const EXIT_BAD_ARGUMENT: i32 = 2;
/// Exit code: the audit found something.
pub const EXIT_FINDINGS: i32 = 3;

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "kubectl-ichor", version, about = "See and steer Ichor's Talos operations (kubectl ichor ...)")]
pub struct Args {
    /// The kubeconfig (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace (default: the context's, then `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The plugin's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Each operation (or the one named): phase, reason, progress, and its machines.
    Status {
        /// The TalosOperation.
        name: Option<String>,
    },
    /// Pauses an operation: nothing new begins (no machine starts, no call not yet made
    /// goes out); what is past its call finishes. `resume` lifts it.
    Pause {
        /// The TalosOperation.
        name: String,
    },
    /// Resumes a paused operation: lifts a pause put by `pause`, and resumes one paused by
    /// a failure (once its cause is fixed).
    Resume {
        /// The TalosOperation.
        name: String,
    },
    /// Holds a machine back: it is not started, and no operation completes while it is
    /// held. NAME is a TalosMachine of the namespace, else a Node.
    Hold {
        /// The TalosMachine, or the Node.
        name: String,
    },
    /// Releases a held machine: the hold on the TalosMachine and on its Node, wherever it
    /// was put. NAME is a TalosMachine of the namespace, else a Node.
    Release {
        /// The TalosMachine, or the Node.
        name: String,
    },
    /// Draws an operation's timeline (SVG) from its machines' recorded history.
    Timeline {
        /// The TalosOperation.
        name: String,
        /// Where to write the SVG.
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
    /// The morning-after audit of a TalosCluster, now: nothing left cordoned by the engine,
    /// no static pod crash-looping, every Node Ready on the versions the cluster declares,
    /// etcd healthy with every member a voter and no alarm, no budget at zero. Reads etcd
    /// through the Talos API with the cluster's talosconfig Secret; changes nothing. Exits
    /// 3 when it finds something.
    Audit {
        /// The TalosCluster.
        cluster: String,
        /// `text` (the default) or `json`.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = AuditFormat::Text)]
        output: AuditFormat,
    },
}

/// How `audit` prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditFormat {
    /// For people.
    Text,
    /// One JSON object: `cluster`, `talosVersion`, `kubernetesVersion`, `clean`, and
    /// `findings`, each tagged with its reason (`finding`).
    Json,
}

/// A failure, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A bad argument or kubeconfig (exit 2).
    #[error("{0}")]
    BadArgument(String),
    /// Refused or failed (exit 1).
    #[error("{0}")]
    Failed(String),
    /// The audit found something (exit 3): its report, for standard output.
    #[error("{0}")]
    Found(String),
}

impl PluginError {
    /// Its exit code.
    #[must_use]
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::BadArgument(_) => EXIT_BAD_ARGUMENT,
            Self::Failed(_) => EXIT_FAILED,
            Self::Found(_) => EXIT_FINDINGS,
        }
    }
}

fn failed(what: &str, e: &kube::Error) -> PluginError {
    PluginError::Failed(format!("{what}: {e}"))
}

/// A client and namespace from the kubeconfig, as kubectl picks them.
///
/// # Errors
/// [`PluginError::BadArgument`] naming the kubeconfig that cannot be used.
pub async fn connect(args: &Args) -> Result<(Client, String), PluginError> {
    let options = KubeConfigOptions::default();
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| PluginError::BadArgument(format!("--kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| PluginError::BadArgument(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None => Config::from_kubeconfig(&options).await.map_err(|e| {
            PluginError::BadArgument(format!("no usable kubeconfig ($KUBECONFIG, ~/.kube/config): {e}"))
        })?,
    };
    let namespace = args.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| PluginError::BadArgument(format!("the kubeconfig: {e}")))?;
    Ok((client, namespace))
}

/// Runs `args`; what it prints on success.
///
/// # Errors
/// [`PluginError`], with the exit code to leave with.
pub async fn run(args: &Args) -> Result<String, PluginError> {
    if let Command::Timeline { output, .. } = &args.command
        && output.parent().is_some_and(|d| !d.as_os_str().is_empty() && !d.is_dir())
    {
        return Err(PluginError::BadArgument(format!("-o {}: its directory does not exist", output.display())));
    }
    let (client, namespace) = connect(args).await?;
    let operations: Api<TalosOperation> = Api::namespaced(client.clone(), &namespace);
    let machines: Api<TalosMachine> = Api::namespaced(client.clone(), &namespace);
    match &args.command {
        Command::Status { name } => {
            let listed = match name {
                Some(name) => vec![get(&operations, name, &namespace).await?],
                None => {
                    operations.list(&ListParams::default()).await.map_err(|e| failed("list TalosOperations", &e))?.items
                }
            };
            if listed.is_empty() {
                return Ok(format!("no TalosOperations in namespace {namespace}\n"));
            }
            let all = machines.list(&ListParams::default()).await.map_err(|e| failed("list TalosMachines", &e))?.items;
            // The Nodes: which are held, and what they run. One who may not list Nodes sees
            // the machines' own holds, and a machine with no step recorded as waiting.
            let nodes: Api<Node> = Api::all(client.clone());
            let seen = nodes.list(&ListParams::default()).await.map(|l| NodesSeen::of(&l.items)).unwrap_or_default();
            Ok(listed.iter().map(|op| status_text(op, &all, &seen)).collect::<Vec<_>>().join("\n"))
        }
        Command::Audit { cluster, output } => {
            let audited = audit::audit(&client, &namespace, cluster).await?;
            let report = match output {
                AuditFormat::Text => audited.text(),
                AuditFormat::Json => {
                    serde_json::to_string_pretty(&audited).map_err(|e| PluginError::Failed(e.to_string()))? + "\n"
                }
            };
            if audited.clean { Ok(report) } else { Err(PluginError::Found(report)) }
        }
        Command::Pause { name } => pause(&operations, name, &namespace).await,
        Command::Resume { name } => resume(&operations, name, &namespace).await,
        Command::Hold { name } | Command::Release { name } => {
            let hold = matches!(args.command, Command::Hold { .. });
            hold_or_release(&client, &machines, name, hold, &namespace).await
        }
        Command::Timeline { name, output } => {
            let op = get(&operations, name, &namespace).await?;
            let all = machines.list(&ListParams::default()).await.map_err(|e| failed("list TalosMachines", &e))?.items;
            let plan = op.status.as_ref().and_then(|s| s.plan.as_ref());
            let (records, title) = match plan {
                // A dry run: its plan's median run.
                Some(plan) => (
                    planned_records(plan),
                    format!(
                        "{namespace}/{name}: plan, median run (p10 {:.0} s, p50 {:.0} s, p90 {:.0} s)",
                        plan.p10_seconds, plan.p50_seconds, plan.p90_seconds
                    ),
                ),
                None => {
                    let phase = op.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                    let records = history_records(&op, &machines_of(&op, &all), None, Origin::FirstRecord);
                    (records, format!("{namespace}/{name}: {phase}"))
                }
            };
            let timeline = Timeline::from_records(&records);
            if timeline.rows.is_empty() {
                // An empty picture would pass for one: say so, and write nothing.
                let kind = &op.spec.kind;
                return Err(PluginError::Failed(format!(
                    "{namespace}/{name}: nothing to draw: no machine of this {kind} operation has recorded a step \
                     yet; {} not written",
                    output.display()
                )));
            }
            let options = Options {
                title,
                max_unavailable: Some(crate::dry_run::workers_at_once(&op, &machines_of(&op, &all))),
                ..Options::default()
            };
            std::fs::write(output, render(&timeline, &options).to_string())
                .map_err(|e| PluginError::Failed(format!("writing {}: {e}", output.display())))?;
            Ok(format!("{}: {} machines, {} records\n", output.display(), timeline.rows.len(), records.len()))
        }
    }
}

/// A plan's median run as the timeline's records: each machine's turn, from its start to
/// its convergence.
fn planned_records(plan: &PlanStatus) -> Vec<TraceRecord> {
    let mut records: Vec<TraceRecord> = plan
        .median_run
        .iter()
        .flat_map(|m| {
            [
                TraceRecord::new(m.start_seconds, &m.machine, &m.role, "upgrade-call"),
                TraceRecord::new(m.end_seconds, &m.machine, &m.role, "converged"),
            ]
        })
        .collect();
    records.sort_by(|a, b| a.t.total_cmp(&b.t));
    records
}

/// Puts [`PAUSE_ANNOTATION`] on operation `name`, under the resourceVersion read; an
/// operation that has ended is refused, one already paused so is said.
async fn pause(operations: &Api<TalosOperation>, name: &str, namespace: &str) -> Result<String, PluginError> {
    let op = get(operations, name, namespace).await?;
    let phase = op.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "new".to_owned());
    if phase == "Completed" || phase == "Refused" {
        return Err(PluginError::Failed(format!(
            "talosoperation {name} is {phase}: nothing to pause (nothing changed)"
        )));
    }
    if let Some(by) = op.annotations().get(PAUSE_ANNOTATION) {
        return Ok(format!("talosoperation {name} is paused already ({PAUSE_ANNOTATION}: {by})\n"));
    }
    let by = format!("kubectl ichor pause at {}", Timestamp::now());
    let patch = json!({ "metadata": {
        "resourceVersion": op.resource_version(),
        "annotations": { PAUSE_ANNOTATION: by },
    } });
    patch_operation(operations, name, &patch).await?;
    Ok(format!(
        "talosoperation {name} paused ({PAUSE_ANNOTATION}): nothing new begins, what is past its call finishes; \
         `kubectl ichor resume {name}` goes on\n"
    ))
}

/// Lifts a pause of operation `name`: removes [`PAUSE_ANNOTATION`] if it is there, and
/// sets [`RESUME_ANNOTATION`] to a new token if a failure paused it; under the
/// resourceVersion read. An operation paused by neither is refused.
async fn resume(operations: &Api<TalosOperation>, name: &str, namespace: &str) -> Result<String, PluginError> {
    let op = get(operations, name, namespace).await?;
    let status = op.status.as_ref();
    let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "new".to_owned());
    let requested = op.annotations().contains_key(PAUSE_ANNOTATION);
    let failure = phase == "Paused" && status.and_then(|s| s.reason.as_deref()) != Some("PauseRequested");
    if !requested && !failure {
        return Err(PluginError::Failed(format!(
            "talosoperation {name} is {phase}, not Paused: nothing to resume (nothing changed)"
        )));
    }
    let mut annotations = serde_json::Map::new();
    let mut said = Vec::new();
    if requested {
        annotations.insert(PAUSE_ANNOTATION.to_owned(), serde_json::Value::Null);
        said.push(format!("{PAUSE_ANNOTATION} removed"));
    }
    if failure {
        let mut token = Timestamp::now().as_second().to_string();
        if op.annotations().get(RESUME_ANNOTATION) == Some(&token) {
            // Resumed already this second: each distinct value resumes once.
            token = format!("{token}-{}", Timestamp::now().subsec_nanosecond());
        }
        said.push(format!("{RESUME_ANNOTATION}={token}"));
        annotations.insert(RESUME_ANNOTATION.to_owned(), json!(token));
    }
    // Under the resourceVersion read: an operation that moved on since (resumed by someone
    // else, or no longer paused) is not resumed on a stale reading.
    let patch = json!({ "metadata": { "resourceVersion": op.resource_version(), "annotations": annotations } });
    patch_operation(operations, name, &patch).await?;
    Ok(format!("talosoperation {name} resumed ({})\n", said.join(", ")))
}

/// Patches operation `name`'s metadata; a conflict (it changed since it was read) is said
/// as one, nothing changed.
async fn patch_operation(
    operations: &Api<TalosOperation>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), PluginError> {
    operations.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.map_err(|e| match &e {
        kube::Error::Api(s) if s.code == 409 => PluginError::Failed(format!(
            "talosoperation {name} changed since it was read: nothing changed; look again and try again"
        )),
        _ => failed(&format!("annotate talosoperation {name}"), &e),
    })?;
    Ok(())
}

/// Holds or releases `name`: the TalosMachine of that name in the namespace, else the Node
/// (the engine honours the hold on either). A release lifts the hold from the machine and
/// from its Node, wherever a person put it; what it lifted is said.
async fn hold_or_release(
    client: &Client,
    machines: &Api<TalosMachine>,
    name: &str,
    hold: bool,
    namespace: &str,
) -> Result<String, PluginError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let value = if hold { json!("kubectl-ichor") } else { serde_json::Value::Null };
    let patch = json!({ "metadata": { "annotations": { HOLD_ANNOTATION: value } } });
    let params = PatchParams::default();
    let held = |annotations: &std::collections::BTreeMap<String, String>| annotations.contains_key(HOLD_ANNOTATION);
    let machine = machines.get_opt(name).await.map_err(|e| failed(&format!("get talosmachine {name}"), &e))?;
    if let Some(machine) = machine {
        machines
            .patch(name, &params, &Patch::Merge(&patch))
            .await
            .map_err(|e| failed(&format!("annotate talosmachine {name}"), &e))?;
        if hold {
            return Ok(format!("talosmachine {name} held ({HOLD_ANNOTATION}): it is not started until released\n"));
        }
        let mut lifted = Vec::new();
        for node in machine.node_names() {
            let found = nodes.get_opt(&node).await.map_err(|e| failed(&format!("get node {node}"), &e))?;
            if found.is_some_and(|n| held(n.annotations())) {
                nodes
                    .patch(&node, &params, &Patch::Merge(&patch))
                    .await
                    .map_err(|e| failed(&format!("annotate node {node}"), &e))?;
                lifted.push(format!("node {node}"));
            }
        }
        return Ok(released(&format!("talosmachine {name}"), &lifted));
    }
    nodes.patch(name, &params, &Patch::Merge(&patch)).await.map_err(|e| match &e {
        kube::Error::Api(s) if s.code == 404 => {
            PluginError::Failed(format!("no talosmachine {name} in namespace {namespace}, and node {name} not found"))
        }
        _ => failed(&format!("annotate node {name}"), &e),
    })?;
    if hold {
        return Ok(format!("node {name} held ({HOLD_ANNOTATION}): it is not started until released\n"));
    }
    let all = machines.list(&ListParams::default()).await.map_err(|e| failed("list TalosMachines", &e))?.items;
    let mut lifted = Vec::new();
    for machine in all.iter().filter(|m| held(m.annotations()) && m.node_names().iter().any(|n| n == name)) {
        let machine = machine.name_any();
        machines
            .patch(&machine, &params, &Patch::Merge(&patch))
            .await
            .map_err(|e| failed(&format!("annotate talosmachine {machine}"), &e))?;
        lifted.push(format!("talosmachine {machine}"));
    }
    Ok(released(&format!("node {name}"), &lifted))
}

/// `node w-1 released`, with what else was held and is released with it.
fn released(what: &str, also: &[String]) -> String {
    if also.is_empty() { format!("{what} released\n") } else { format!("{what} released, and {}\n", also.join(", ")) }
}

async fn get(operations: &Api<TalosOperation>, name: &str, namespace: &str) -> Result<TalosOperation, PluginError> {
    operations
        .get_opt(name)
        .await
        .map_err(|e| failed(&format!("get talosoperation {name}"), &e))?
        .ok_or_else(|| PluginError::Failed(format!("talosoperation {name} not found in namespace {namespace}")))
}

/// `control-plane` or `worker`, as traces and timelines write a role.
fn role_name(role: Role) -> &'static str {
    ichor_upgrade_core::machine::vocabulary::MachineRole::from(role).as_str()
}

/// `12:05` (minutes and seconds).
fn minutes(seconds: f64) -> String {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a makespan, rounded")]
    let s = seconds.max(0.0).round() as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

/// `[#####.....]  5/10`.
fn progress_bar(converged: i64, total: i64) -> String {
    const WIDTH: i64 = 30;
    let filled = if total > 0 { (converged.clamp(0, total) * WIDTH) / total } else { 0 };
    let filled = usize::try_from(filled).unwrap_or(0);
    format!("[{}{}] {converged}/{total}", "#".repeat(filled), ".".repeat(30 - filled))
}

/// What `status` reads of the Nodes: which carry a hold, and what each runs.
#[derive(Debug, Default)]
struct NodesSeen {
    /// The Nodes carrying [`HOLD_ANNOTATION`].
    held: BTreeSet<String>,
    /// Each Node's `osImage` and kubelet version.
    running: BTreeMap<String, (String, String)>,
}

impl NodesSeen {
    fn of(nodes: &[Node]) -> Self {
        let mut seen = Self::default();
        for node in nodes {
            let name = node.name_any();
            if node.annotations().contains_key(HOLD_ANNOTATION) {
                seen.held.insert(name.clone());
            }
            if let Some(info) = node.status.as_ref().and_then(|s| s.node_info.as_ref()) {
                seen.running.insert(name, (info.os_image.clone(), info.kubelet_version.clone()));
            }
        }
        seen
    }

    /// Whether `machine`'s Node runs what `op` upgrades to: its Talos release, or its
    /// kubelet's version. A removal's machine never is.
    fn on_target(&self, op: &TalosOperation, machine: &TalosMachine) -> bool {
        let target = op.spec.target_version.trim_start_matches('v');
        machine.node_names().iter().filter_map(|n| self.running.get(n)).any(|(os_image, kubelet)| {
            match op.spec.kind.as_str() {
                OperationKind::TALOS => TalosVersion::from_os_image(os_image)
                    .is_ok_and(|v| TalosVersion::parse(target).is_ok_and(|t| v == t)),
                OperationKind::KUBERNETES => kubelet.trim_start_matches('v') == target,
                _ => false,
            }
        })
    }
}

/// The conditions that show a machine's step in an operation of `kind`, the first found
/// shown: a Kubernetes upgrade's is never a Talos upgrade's, and the reverse.
fn step_conditions(kind: &str) -> &'static [&'static str] {
    match kind {
        OperationKind::KUBERNETES => &[KUBERNETES_UPGRADE],
        OperationKind::REMOVE => &[NODE_REMOVAL],
        _ => &[TALOS_LIFECYCLE, TALOS_UPGRADE],
    }
}

/// One machine's row in `status`: name, role, state, step. The step is a condition of the
/// operation's kind changed since the operation was made (one an earlier operation left
/// says nothing of this one); the state is the engine's record of the machine in this
/// operation, else `done` when that step ended or its Node runs the target, `held` when it
/// or its Node is held, `waiting` otherwise.
fn machine_row(op: &TalosOperation, m: &TalosMachine, record: &serde_json::Value, nodes: &NodesSeen) -> [String; 4] {
    let created = op.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let conditions = m.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let fresh = step_conditions(&op.spec.kind).iter().find_map(|t| {
        conditions.iter().find(|c| c.type_ == *t && created.is_none_or(|at| c.last_transition_time.0 >= at))
    });
    let step = fresh.map_or_else(|| "-".to_owned(), |c| format!("{}={}", c.type_, c.reason));
    let ended = fresh.is_some_and(|c| c.reason.ends_with("Converged") || c.reason == "Removed");
    let held = m.annotations().contains_key(HOLD_ANNOTATION) || m.node_names().iter().any(|n| nodes.held.contains(n));
    let state = match record["state"].as_str() {
        Some("converged") => "done",
        Some("failed") => "FAILED",
        Some(_) => "in progress",
        None if ended || nodes.on_target(op, m) => "done",
        None if held => "held",
        None => "waiting",
    };
    let reason = record["reason"].as_str().unwrap_or_default();
    let step = if reason.is_empty() { step } else { format!("{step} ({reason})") };
    [m.name_any(), role_name(m.spec.role).to_owned(), state.to_owned(), step]
}

/// A Kubernetes upgrade's progress: its machines whose Node's kubelet runs the target and
/// whose record, if any, is converged, out of its machines. The engine's own count
/// (`status.machines`) is of the stage under way (the control planes' components, then
/// every kubelet), so it fell from 3 to 0 as the kubelets' stage began: a bar that goes
/// back misreports. A kubelet is a machine's last change in the upgrade and never goes
/// back, so this count only grows.
fn kubernetes_done(
    op: &TalosOperation,
    machines: &[TalosMachine],
    nodes: &NodesSeen,
    engine: Option<&serde_json::Value>,
) -> (i64, i64) {
    let ours = machines_of(op, machines);
    let records = engine.and_then(|e| e.get("machines"));
    let done = ours
        .iter()
        .filter(|m| {
            let state = records.and_then(|r| r.get(m.name_any())).and_then(|r| r["state"].as_str());
            nodes.on_target(op, m) && state.is_none_or(|s| s == "converged")
        })
        .count();
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    (count(done), count(ours.len()))
}

/// What `status` prints for one operation.
fn status_text(op: &TalosOperation, machines: &[TalosMachine], nodes: &NodesSeen) -> String {
    let status = op.status.clone().unwrap_or_default();
    let counts = status.machines.clone().unwrap_or_default();
    let mut text = String::new();
    let target = if op.spec.kind == OperationKind::REMOVE {
        format!("remove {}", op.spec.machine.as_deref().unwrap_or("?"))
    } else {
        format!("{} {}", op.spec.kind, op.spec.target_version)
    };
    let _ = writeln!(
        text,
        "{}  cluster {}  {target}  {} ({})",
        op.name_any(),
        op.spec.cluster,
        status.phase.as_deref().unwrap_or("New"),
        status.reason.as_deref().unwrap_or("-")
    );
    // A dry run's status is its plan: no machine is counted (no `0/0` bar), and its
    // message repeats the plan's makespans in seconds (p50 printed twice, in two units).
    if status.plan.is_none() {
        let (done, total) = if op.spec.kind == OperationKind::KUBERNETES {
            kubernetes_done(op, machines, nodes, status.engine.as_ref())
        } else {
            (counts.converged, counts.total)
        };
        let _ = writeln!(text, "  {}", progress_bar(done, total));
        if let Some(message) = &status.message {
            let _ = writeln!(text, "  {message}");
        }
    }
    if let Some(waiting) = &status.waiting_for {
        let _ = writeln!(text, "  waiting for: {waiting}");
    }
    match &status.audit {
        Some(audit) if audit.clean => {
            let _ = writeln!(
                text,
                "  audit: clean (nothing left cordoned or crash-looping, every Node Ready on the target, etcd healthy, no budget at zero)"
            );
        }
        Some(audit) => {
            for finding in &audit.findings {
                let _ = writeln!(text, "  audit: {}: {}", finding.reason, finding.message);
            }
        }
        None => {}
    }
    // DESIGN §3 rule 5 as decided in decision 0015: an operation left with only held
    // machines keeps its cluster's lock, so nothing else runs on the cluster meanwhile.
    if status.reason.as_deref() == Some("Held") && status.phase.as_deref() == Some("Waiting") {
        let _ = writeln!(
            text,
            "  cluster lock: kept by this operation while held machines remain; `kubectl ichor release NAME` \
             lets them go on, deleting the operation releases the lock"
        );
    }
    if let Some(plan) = &status.plan {
        let _ = writeln!(
            text,
            "  plan: makespan p10 {}, p50 {}, p90 {} (bound {}), from {}",
            minutes(plan.p10_seconds),
            minutes(plan.p50_seconds),
            minutes(plan.p90_seconds),
            minutes(plan.bound_seconds),
            plan.history.as_deref().map_or_else(|| "default durations".to_owned(), |h| format!("the history of {h}"))
        );
        let _ = writeln!(text, "  order: {}", plan.order.join(", "));
        if let Some(windows) = &plan.windows {
            let _ = writeln!(text, "  windows: {}", windows.message);
        }
        for gate in &plan.gates {
            let _ = writeln!(text, "  gate {} ({}): {}", gate.name, gate.phase, gate.message);
        }
        for held in &plan.held {
            let _ = writeln!(text, "  held now: {}: {}", held.machine, held.reason);
        }
        if let Some(found) = &plan.kubernetes {
            kubernetes_findings(&mut text, found);
        }
        for assumed in &plan.assumed {
            let _ = writeln!(text, "  assumed: {assumed}");
        }
        return text;
    }
    if let Some(c) = &status.calibration {
        let _ = writeln!(
            text,
            "  against plan {}: took {}, p50 {} ({:+.1} %), {} p10-p90",
            c.plan,
            minutes(c.actual_seconds),
            minutes(c.p50_seconds),
            c.error_percent,
            if c.within_band { "within" } else { "outside" }
        );
    }
    let records = status.engine.as_ref().and_then(|e| e.get("machines")).cloned().unwrap_or_default();
    let rows: Vec<[String; 4]> = machines_of(op, machines)
        .into_iter()
        .map(|m| machine_row(op, m, &records[m.name_any().as_str()], nodes))
        .collect();
    if rows.is_empty() {
        return text;
    }
    let width =
        |i: usize| rows.iter().map(|r| r[i].len()).max().unwrap_or(0).max(["MACHINE", "ROLE", "STATE"][i].len());
    let (w0, w1, w2) = (width(0), width(1), width(2));
    let _ = writeln!(text, "  {:w0$}  {:w1$}  {:w2$}  STEP", "MACHINE", "ROLE", "STATE");
    for [name, role, state, reason] in &rows {
        let _ = writeln!(text, "  {name:w0$}  {role:w1$}  {state:w2$}  {reason}");
    }
    text
}

/// A Kubernetes dry run's findings: each node's changes on one line, then what the
/// target removes that is still in use, then every reason it would be refused.
fn kubernetes_findings(text: &mut String, found: &ichor_adapters::kubernetes::crd::KubernetesPlanned) {
    let nodes: std::collections::BTreeSet<&str> = found.changes.iter().map(|c| c.node.as_str()).collect();
    let _ = writeln!(text, "  changes: {} components on {} nodes", found.changes.len(), nodes.len());
    let mut lines: Vec<(&str, &str, &str, Vec<&str>)> = Vec::new();
    for change in &found.changes {
        match lines.iter_mut().find(|(n, f, t, _)| *n == change.node && *f == change.from && *t == change.to) {
            Some((_, _, _, components)) => components.push(&change.component),
            None => lines.push((&change.node, &change.from, &change.to, vec![&change.component])),
        }
    }
    for (node, from, to, components) in lines {
        let _ = writeln!(text, "    {node}: {} {from} -> {to}", components.join(", "));
    }
    for api in &found.removed_apis {
        let group = if api.group.is_empty() { String::new() } else { format!(".{}", api.group) };
        let seen = if api.seen_as == "StoredObjects" { "stored objects" } else { "requests" };
        let _ = writeln!(
            text,
            "  removed API in use: {}{group}/{} ({} {seen}, removed in {})",
            api.resource, api.version, api.count, api.removed_release
        );
    }
    for flag in &found.removed_flags {
        let _ = writeln!(
            text,
            "  removed {} set: {} {} {} (removed in {})",
            flag.kind, flag.node, flag.component, flag.name, flag.removed_release
        );
    }
    for refusal in &found.refusals {
        let _ = writeln!(text, "  would be refused: {}: {}", refusal.reason, refusal.message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_bar_fills_in_proportion() {
        assert_eq!(progress_bar(0, 10), format!("[{}] 0/10", ".".repeat(30)));
        assert_eq!(progress_bar(5, 10), format!("[{}{}] 5/10", "#".repeat(15), ".".repeat(15)));
        assert_eq!(progress_bar(13, 13), format!("[{}] 13/13", "#".repeat(30)));
        assert_eq!(progress_bar(0, 0), format!("[{}] 0/0", ".".repeat(30)), "nothing to do is not a panic");
    }

    fn operation(phase: &str, reason: &str, message: &str) -> TalosOperation {
        serde_json::from_value(json!({
            "apiVersion": "ichor.dev/v1alpha1",
            "kind": "TalosOperation",
            "metadata": {"name": "upgrade", "namespace": "default"},
            "spec": {"cluster": "prod", "kind": "talos", "targetVersion": "v1.14.4", "maxUnavailable": 1},
            "status": {"phase": phase, "reason": reason, "message": message},
        }))
        .unwrap()
    }

    /// Issue 56 item 3: a wait on the windows names itself and the next window's start,
    /// and a dry run's plan says how many windows the rollout needs.
    #[test]
    fn the_windows_show_in_status_as_a_wait_and_in_a_plan() {
        let wait = ichor_upgrade_core::status::Phase::Waiting(ichor_upgrade_core::status::WaitReason::OutsideWindow {
            next_start: Some(ichor_upgrade_core::Timestamp::from_unix_secs(1_767_232_800)),
        });
        let waiting = operation("Waiting", wait.reason(), &wait.to_string());
        let text = status_text(&waiting, &[], &NodesSeen::default());
        assert!(text.contains("OutsideWindow"), "{text}");
        assert!(text.contains("the next window opens at 2026-01-01T02:00:00Z"), "{text}");
        let mut planned = operation("Completed", "Planned", "planned (nothing touched)");
        planned.status.as_mut().unwrap().plan = Some(
            serde_json::from_value(json!({
                "p10Seconds": 560.0, "p50Seconds": 600.0, "p90Seconds": 660.0, "boundSeconds": 480.0, "runs": 200,
                "order": ["cp-1"],
                "windows": {"needed": 3, "finish": "2026-01-03T02:10:00Z",
                            "message": "the median run needs 3 maintenance windows, its last turn ending at 2026-01-03T02:10:00Z"},
            }))
            .unwrap(),
        );
        let text = status_text(&planned, &[], &NodesSeen::default());
        assert!(text.contains("windows: the median run needs 3 maintenance windows"), "{text}");
    }

    /// Issue 55 (papercuts): a dry run's status printed a `0/0` progress bar and its p50
    /// twice, once in seconds (the message) and once in minutes (the plan).
    #[test]
    fn a_dry_runs_status_is_its_plan_once_with_no_progress_bar() {
        let mut planned = operation(
            "Completed",
            "Planned",
            "planned (nothing touched): makespan p10 560 s, p50 600 s, p90 660 s; 4 machines",
        );
        let status = planned.status.as_mut().unwrap();
        status.plan = Some(
            serde_json::from_value(json!({
                "p10Seconds": 560.0, "p50Seconds": 600.0, "p90Seconds": 660.0, "boundSeconds": 480.0, "runs": 200,
                "order": ["cp-1", "cp-2", "cp-3", "worker-1"],
            }))
            .unwrap(),
        );
        let text = status_text(&planned, &[], &NodesSeen::default());
        assert_eq!(text.matches("p50").count(), 1, "{text}");
        assert!(text.contains("plan: makespan p10 "), "{text}");
        assert!(!text.contains("0/0") && !text.contains("[...."), "no progress bar for a dry run: {text}");
        // An operation that runs keeps its bar and its message.
        let running = status_text(
            &operation("Progressing", "Progressing", "1 of 4 machines converged"),
            &[],
            &NodesSeen::default(),
        );
        assert!(running.contains("] 0/0") && running.contains("1 of 4 machines converged"), "{running}");
    }

    /// Issue 55 item 4: a Kubernetes dry run's status shows each node's changes on one
    /// line, what the target removes still in use, and every reason it would be refused.
    #[test]
    fn a_kubernetes_dry_runs_status_lists_its_changes_removals_and_refusals() {
        let mut planned = operation("Completed", "Planned", "planned (nothing touched)");
        planned.spec.kind = "kubernetes".into();
        let change = |node: &str, component: &str| json!({ "node": node, "component": component, "from": "1.34.1", "to": "1.35.0" });
        planned.status.as_mut().unwrap().plan = Some(
            serde_json::from_value(json!({
                "p10Seconds": 60.0, "p50Seconds": 70.0, "p90Seconds": 80.0, "boundSeconds": 50.0, "runs": 200,
                "order": ["cp-1", "w-1"],
                "kubernetes": {
                    "changes": [change("cp-1", "kube-apiserver"), change("cp-1", "kube-scheduler"),
                                change("cluster", "kube-proxy"), change("cp-1", "kubelet"), change("w-1", "kubelet")],
                    "removedApis": [{ "group": "flowcontrol.apiserver.k8s.io", "version": "v1beta3",
                                      "resource": "flowschemas", "removedRelease": "1.35", "count": 3,
                                      "seenAs": "Requests" }],
                    "removedFlags": [{ "node": "w-1", "component": "kubelet", "kind": "flag",
                                       "name": "pod-infra-container-image", "removedRelease": "1.35" }],
                    "refusals": [{ "reason": "RemovedApisInUse", "message": "APIs removed ..." }]
                }
            }))
            .unwrap(),
        );
        let text = status_text(&planned, &[], &NodesSeen::default());
        for line in [
            "  changes: 5 components on 3 nodes\n",
            "    cp-1: kube-apiserver, kube-scheduler, kubelet 1.34.1 -> 1.35.0\n",
            "    cluster: kube-proxy 1.34.1 -> 1.35.0\n",
            "    w-1: kubelet 1.34.1 -> 1.35.0\n",
            "  removed API in use: flowschemas.flowcontrol.apiserver.k8s.io/v1beta3 (3 requests, removed in 1.35)\n",
            "  removed flag set: w-1 kubelet pod-infra-container-image (removed in 1.35)\n",
            "  would be refused: RemovedApisInUse: APIs removed ...\n",
        ] {
            assert!(text.contains(line), "{line:?} in:\n{text}");
        }
        assert!(!text.contains("0/0"), "{text}");
    }

    /// Issue 53 item 9: an operation left with only held machines keeps the cluster lock
    /// (decision 0015); `kubectl ichor status` says so, and how to let it go.
    #[test]
    fn status_says_a_held_operation_keeps_the_cluster_lock_and_how_to_release_it() {
        let held = operation("Waiting", "Held", "waiting: held machines remain: worker-1");
        let text = status_text(&held, &[], &NodesSeen::default());
        assert!(text.contains("cluster lock: kept by this operation while held machines remain"), "{text}");
        assert!(text.contains("kubectl ichor release NAME") && text.contains("deleting the operation"), "{text}");
        for (phase, reason) in [("Waiting", "LockHeld"), ("Progressing", "Progressing"), ("Completed", "Completed")] {
            let text = status_text(&operation(phase, reason, "-"), &[], &NodesSeen::default());
            assert!(!text.contains("cluster lock: kept"), "{phase}/{reason}: {text}");
        }
    }

    /// A TalosMachine of cluster `prod` with one condition, changed at `changed`.
    fn machine(name: &str, condition: (&str, &str), changed: &str, annotations: serde_json::Value) -> TalosMachine {
        serde_json::from_value(json!({
            "apiVersion": "ichor.dev/v1alpha1",
            "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"cluster": "prod", "role": "worker", "address": "10.0.0.1", "hostname": name},
            "status": {"conditions": [{
                "type": condition.0, "status": "True", "reason": condition.1, "message": "",
                "lastTransitionTime": changed,
            }]},
        }))
        .unwrap()
    }

    fn node(name: &str, os_image: &str, kubelet: &str, held: bool) -> Node {
        let annotations = if held { json!({ HOLD_ANNOTATION: "x" }) } else { json!({}) };
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "status": {"nodeInfo": {
                "osImage": os_image, "kubeletVersion": kubelet, "architecture": "amd64", "bootID": "b",
                "containerRuntimeVersion": "c", "kernelVersion": "k", "kubeProxyVersion": "", "machineID": "m",
                "operatingSystem": "linux", "systemUUID": "u",
            }},
        }))
        .unwrap()
    }

    /// The row of `machine` in `text`: its state and step.
    fn row<'t>(text: &'t str, machine: &str) -> Vec<&'t str> {
        let line = text.lines().find(|l| l.trim_start().starts_with(&format!("{machine} "))).unwrap_or_default();
        line.split_whitespace().skip(2).collect()
    }

    /// Issue 55 item 3: `status` of a Kubernetes upgrade showed the TalosUpgrade condition an
    /// earlier Talos upgrade left (`TalosUpgrade=Converged`, so `done`) on machines this
    /// operation had not touched. Each row is this operation's: its record, a condition of
    /// its kind changed since it was made, else what the Node runs; a held machine is held.
    #[test]
    fn status_of_a_kubernetes_upgrade_shows_its_own_progress_never_an_earlier_talos_upgrade() {
        let mut op = operation("Progressing", "Progressing", "1 of 4 machines converged");
        op.spec.kind = OperationKind::KUBERNETES.into();
        op.spec.target_version = "1.35.0".into();
        op.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-12-07T10:00:00Z".parse().unwrap()));
        let before = "2026-12-07T09:00:00Z";
        let after = "2026-12-07T10:05:00Z";
        let machines = [
            machine("w-untouched", ("TalosUpgrade", "Converged"), before, json!({})),
            machine("w-applying", ("KubernetesUpgrade", "Applied"), after, json!({})),
            machine("w-on-target", ("TalosUpgrade", "Converged"), before, json!({})),
            machine("w-held", ("TalosUpgrade", "Converged"), before, json!({ HOLD_ANNOTATION: "x" })),
            machine("w-held-node", ("KubernetesUpgrade", "KubernetesConverged"), before, json!({})),
        ];
        op.status.as_mut().unwrap().engine = Some(json!({"machines": {
            "w-applying": {"state": "inProgress", "reason": "Applied", "message": ""},
        }}));
        let nodes = NodesSeen::of(&[
            node("w-untouched", "Talos (v1.14.4)", "v1.34.1", false),
            node("w-on-target", "Talos (v1.14.4)", "v1.35.0", false),
            node("w-held-node", "Talos (v1.14.4)", "v1.34.1", true),
        ]);
        let text = status_text(&op, &machines, &nodes);
        assert_eq!(row(&text, "w-untouched"), ["waiting", "-"], "{text}");
        assert_eq!(row(&text, "w-applying"), ["in", "progress", "KubernetesUpgrade=Applied", "(Applied)"], "{text}");
        assert_eq!(row(&text, "w-on-target"), ["done", "-"], "{text}");
        assert_eq!(row(&text, "w-held"), ["held", "-"], "{text}");
        assert_eq!(
            row(&text, "w-held-node"),
            ["held", "-"],
            "an earlier Kubernetes upgrade's end says nothing: {text}"
        );
        assert!(!text.contains("TalosUpgrade"), "{text}");
        // Its bar counts the machines done with it (w-on-target): not the stage's count.
        assert!(text.contains("] 1/5"), "{text}");
        let mut next_stage = op.clone();
        next_stage.status.as_mut().unwrap().machines =
            Some(ichor_adapters::kubernetes::crd::MachineCounts { converged: 0, total: 5, ..Default::default() });
        assert!(status_text(&next_stage, &machines, &nodes).contains("] 1/5"), "a new stage's count of 0 is not shown");

        // A Talos upgrade after an earlier one: its old Converged is not this one's.
        let mut talos = op.clone();
        talos.spec.kind = OperationKind::TALOS.into();
        talos.spec.target_version = "v1.14.5".into();
        talos.status.as_mut().unwrap().engine = None;
        let text = status_text(&talos, &machines, &nodes);
        assert_eq!(row(&text, "w-untouched"), ["waiting", "-"], "{text}");
        let upgraded = NodesSeen::of(&[node("w-untouched", "Talos (v1.14.5)", "v1.34.1", false)]);
        let text = status_text(&talos, &machines, &upgraded);
        assert_eq!(row(&text, "w-untouched"), ["done", "-"], "its Node runs the target: {text}");
    }
}
