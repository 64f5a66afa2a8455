//! A rollout's trace: what happened, in time order, one record per change, as JSON lines;
//! its format, written ([`TraceEvent`], [`TraceKind`]) and read ([`TraceRecord`]), in one
//! place.
//!
//! The simulator (`ichor-sim`) writes one of every change of its simulated world (in
//! virtual time, `rollout --trace FILE`), and the operator one of what its engine did and
//! saw on a real cluster (in wall-clock time, `operator --trace FILE`), both with these
//! records, so that one tool draws either. Each record names the node it is about and its
//! role; records about the operation as a whole, the cluster's APIs or the controller name
//! those instead.

use std::io::BufRead;

use serde::{Deserialize, Serialize};

/// One record of a trace, as written. Only `t`, `node`, `role` and `event` are required;
/// unknown fields and events are kept or ignored, so that a newer trace still draws.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceRecord {
    /// Seconds since the start of the trace.
    pub t: f64,
    /// The node, or `operation`, `controller`, `cluster` for what is not one node's.
    pub node: String,
    /// `control-plane`, `worker`, `operation`, `controller` or `cluster`.
    pub role: String,
    /// What happened, such as `upgrade-call` or `reboot-end`.
    pub event: String,
    /// The node's Talos version, where known.
    #[serde(default)]
    pub version: Option<String>,
    /// Why (failures, pauses, waits): the CamelCase reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// The message for people.
    #[serde(default)]
    pub message: Option<String>,
    /// For an `evacuation-start`: the bytes the evacuation moves off the node, where
    /// known.
    #[serde(default)]
    pub bytes: Option<u64>,
}

impl TraceRecord {
    /// A record with no version, reason or message.
    #[must_use]
    pub fn new(t: f64, node: &str, role: &str, event: &str) -> Self {
        Self {
            t,
            node: node.to_owned(),
            role: role.to_owned(),
            event: event.to_owned(),
            version: None,
            reason: None,
            message: None,
            bytes: None,
        }
    }

    /// The same record with a reason.
    #[must_use]
    pub fn with_reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }

    /// Whether the record is about a machine (a control plane or a worker).
    #[must_use]
    pub fn is_machine(&self) -> bool {
        self.role == CONTROL_PLANE || self.role == WORKER
    }
}

/// The role of a control-plane machine in a trace.
pub const CONTROL_PLANE: &str = "control-plane";
/// The role of a worker machine in a trace.
pub const WORKER: &str = "worker";

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace could not be read.
    #[error("reading the trace: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a trace record.
    #[error("line {line}: not a trace record: {source}")]
    Record {
        /// The line, from 1.
        line: usize,
        /// What was wrong with it.
        #[source]
        source: serde_json::Error,
    },
    /// A record's time is not a number of seconds from the start.
    #[error("line {line}: time {t} is not a number of seconds from the start")]
    Time {
        /// The line, from 1.
        line: usize,
        /// The time it gives.
        t: f64,
    },
    /// Nothing in the trace is about a machine.
    #[error("the trace has no record of any machine (control-plane or worker)")]
    NoMachines,
}

/// Reads a trace of JSON lines (blank lines are skipped). Records may come in any order;
/// they are sorted by time, keeping the order of records with the same time.
///
/// # Errors
/// [`TraceError`] naming the first line that is not a record, or a time that is negative
/// or not finite, or a trace with no machine in it.
pub fn read_trace(reader: impl BufRead) -> Result<Vec<TraceRecord>, TraceError> {
    let mut records = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record: TraceRecord =
            serde_json::from_str(&line).map_err(|source| TraceError::Record { line: index + 1, source })?;
        if !record.t.is_finite() || record.t < 0.0 {
            return Err(TraceError::Time { line: index + 1, t: record.t });
        }
        records.push(record);
    }
    if !records.iter().any(TraceRecord::is_machine) {
        return Err(TraceError::NoMachines);
    }
    records.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(records)
}

/// A kind of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceKind {
    /// The machine as it was when the trace began (its role, version and boot ID): one
    /// per machine, first, so that a machine nothing happens to is in the trace too.
    Listed,
    /// The node began pulling the installer image (a legacy Upgrade call pulls before it
    /// answers).
    ImagePullStart,
    /// The installer image is in the node's store.
    ImagePulled,
    /// The node acknowledged an Upgrade call.
    UpgradeCall,
    /// A lifecycle install (`LifecycleService.Upgrade`) began.
    InstallStart,
    /// A lifecycle install ended with exit code 0: the other boot slot holds the target.
    Installed,
    /// The engine cordoned the Node (the lifecycle executor's drain).
    Cordon,
    /// The node took a Reboot call.
    RebootCall,
    /// The engine lifted its cordon.
    Uncordon,
    /// The node went down to reboot.
    RebootStart,
    /// The node booted (with the version it booted).
    RebootEnd,
    /// The Node turned Ready.
    Ready,
    /// The node went down (its kubelet stopped): the truth, which the Node object shows
    /// only later (see [`TraceKind::ShownNotReady`]).
    NotReady,
    /// The Node object turned NotReady, as the controller's cache shows it: after the node
    /// lifecycle controller's grace period and the watch's delay.
    ShownNotReady,
    /// Storage scheduling off and replicas asked to move.
    EvacuationStart,
    /// No replica left on the node.
    Evacuated,
    /// Storage scheduling back on.
    EvacuationEnd,
    /// The node was drained.
    Drain,
    /// An etcd snapshot was streamed from the node (before any control plane's Upgrade
    /// call).
    EtcdSnapshot,
    /// The node's etcd member left the member list.
    EtcdMemberMissing,
    /// The node's etcd member is a voter again.
    EtcdMemberBack,
    /// The machine was recorded converged.
    Converged,
    /// The machine was recorded failed.
    Failed,
    /// The operation paused.
    Paused,
    /// The operation resumed.
    Resumed,
    /// The controller was killed and restarted (the simulator), or began to lead (the
    /// operator, on the row `controller`).
    ControllerRestart,
    /// The node took a graceful Reset call (a removal): it leaves etcd, wipes its disks
    /// and powers off.
    ResetCall,
    /// The node was removed from the cluster.
    Removed,
    /// An Upgrade call broke off on the wire before it reached the node (the call-lost
    /// fault): the engine's intent stays unconfirmed.
    CallLost,
    /// The preflight gate holds the machine back; the message names the blockers (again
    /// when they change).
    PreflightBlocked,
    /// The preflight gate no longer holds the machine back.
    PreflightClear,
    /// The operation waits, for a reason new since the last record.
    Waiting,
    /// The cluster's APIs began refusing every call (the api-outage fault).
    ApiOutage,
    /// The cluster's APIs answer again.
    ApiBack,
    /// The operation was refused (at planning, or its spec): nothing was touched.
    Refused,
    /// A Kubernetes upgrade applied a machine configuration changing one component's image
    /// (`component` names it), with no reboot.
    ConfigApply,
    /// A Kubernetes component changed by an apply runs Ready on its new version
    /// (`component` names it).
    ComponentReady,
    /// A Kubernetes component changed by an apply crash-loops on its new version.
    ComponentCrashLoop,
    /// A control plane's component stops being Ready for reasons of its own (no change
    /// of the engine's: the simulator's `component-down` fault), its Node still Ready.
    ComponentDown,
    /// That component is Ready again.
    ComponentUp,
}

impl TraceKind {
    /// The name the trace file uses, such as `upgrade-call`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Listed => "listed",
            Self::ImagePullStart => "image-pull-start",
            Self::ImagePulled => "image-pulled",
            Self::UpgradeCall => "upgrade-call",
            Self::InstallStart => "install-start",
            Self::Installed => "installed",
            Self::Cordon => "cordon",
            Self::RebootCall => "reboot-call",
            Self::Uncordon => "uncordon",
            Self::RebootStart => "reboot-start",
            Self::RebootEnd => "reboot-end",
            Self::Ready => "ready",
            Self::NotReady => "not-ready",
            Self::ShownNotReady => "shown-not-ready",
            Self::EvacuationStart => "evacuation-start",
            Self::Evacuated => "evacuated",
            Self::EvacuationEnd => "evacuation-end",
            Self::Drain => "drain",
            Self::EtcdSnapshot => "etcd-snapshot",
            Self::EtcdMemberMissing => "etcd-member-missing",
            Self::EtcdMemberBack => "etcd-member-back",
            Self::Converged => "converged",
            Self::Failed => "failed",
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::ControllerRestart => "controller-restart",
            Self::ResetCall => "reset-call",
            Self::Removed => "removed",
            Self::CallLost => "call-lost",
            Self::PreflightBlocked => "preflight-blocked",
            Self::PreflightClear => "preflight-clear",
            Self::Waiting => "waiting",
            Self::ApiOutage => "api-outage",
            Self::ApiBack => "api-back",
            Self::Refused => "refused",
            Self::ConfigApply => "config-apply",
            Self::ComponentReady => "component-ready",
            Self::ComponentCrashLoop => "component-crash-loop",
            Self::ComponentDown => "component-down",
            Self::ComponentUp => "component-up",
        }
    }
}

/// One record of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEvent {
    /// Seconds since the start of the trace: virtual in the simulator, wall-clock in the
    /// operator.
    pub t: f64,
    /// The node (for a record about something else: `operation`, `cluster`, `controller`).
    pub node: String,
    /// `control-plane` or `worker` for a node; `operation`, `cluster` or `controller` for a
    /// record about one of those.
    pub role: &'static str,
    /// What happened.
    pub event: TraceKind,
    /// The node's Talos version, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The node's boot ID, where it matters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Why, for failures, pauses, waits and refusals: the CamelCase reason the status
    /// and Events carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The message for people, with the reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Kubernetes component a Kubernetes upgrade's record is about: `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`, `kube-proxy` or `kubelet`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component: Option<&'static str>,
    /// For an `evacuation-start`: the bytes on the node that the evacuation moves off it,
    /// where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_records_skipping_blank_lines_and_sorting_by_time() {
        let text = r#"{"t":5.0,"node":"w-1","role":"worker","event":"ready","extra":1}

{"t":1.5,"node":"w-1","role":"worker","event":"upgrade-call","version":"v1.14.3"}
"#;
        let records = read_trace(text.as_bytes()).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].event, "upgrade-call");
        assert_eq!(records[0].version.as_deref(), Some("v1.14.3"));
        assert_eq!(records[1].t, 5.0);
    }

    #[test]
    fn a_bad_line_is_named() {
        let text = "{\"t\":1,\"node\":\"a\",\"role\":\"worker\",\"event\":\"x\"}\n{\"t\":2,\"node\":\"a\"}\n";
        let error = read_trace(text.as_bytes()).unwrap_err();
        assert!(matches!(error, TraceError::Record { line: 2, .. }), "{error}");
        assert!(error.to_string().starts_with("line 2: not a trace record"), "{error}");
    }

    #[test]
    fn a_negative_time_is_refused() {
        let text = "{\"t\":-1,\"node\":\"a\",\"role\":\"worker\",\"event\":\"x\"}\n";
        assert!(matches!(read_trace(text.as_bytes()), Err(TraceError::Time { line: 1, .. })));
    }

    #[test]
    fn a_trace_without_machines_is_refused() {
        let text = "{\"t\":1,\"node\":\"controller\",\"role\":\"controller\",\"event\":\"controller-restart\"}\n";
        assert!(matches!(read_trace(text.as_bytes()), Err(TraceError::NoMachines)));
        assert!(matches!(read_trace(&b""[..]), Err(TraceError::NoMachines)));
    }

    #[test]
    fn names_are_the_serialized_names() {
        for kind in [
            TraceKind::Listed,
            TraceKind::UpgradeCall,
            TraceKind::InstallStart,
            TraceKind::Installed,
            TraceKind::Cordon,
            TraceKind::RebootCall,
            TraceKind::Uncordon,
            TraceKind::EtcdMemberMissing,
            TraceKind::ControllerRestart,
            TraceKind::Removed,
            TraceKind::CallLost,
            TraceKind::Waiting,
            TraceKind::ApiOutage,
            TraceKind::ApiBack,
            TraceKind::Refused,
            TraceKind::ConfigApply,
            TraceKind::ComponentReady,
            TraceKind::ComponentCrashLoop,
            TraceKind::ComponentDown,
            TraceKind::ComponentUp,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::Value::String(kind.name().to_owned()));
        }
    }

    #[test]
    fn a_record_is_one_flat_object_without_the_fields_it_lacks() {
        let event = TraceEvent {
            t: 1.5,
            node: "cp-1".to_owned(),
            role: "control-plane",
            event: TraceKind::RebootEnd,
            version: Some("v1.14.4".to_owned()),
            boot_id: None,
            reason: None,
            message: None,
            component: None,
            bytes: None,
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"t":1.5,"node":"cp-1","role":"control-plane","event":"reboot-end","version":"v1.14.4"}"#
        );
    }

    #[test]
    fn what_is_written_is_read_back() {
        let event = TraceEvent {
            t: 12.25,
            node: "worker-1".to_owned(),
            role: WORKER,
            event: TraceKind::EvacuationStart,
            version: Some("v1.14.3".to_owned()),
            boot_id: Some("b-1".to_owned()),
            reason: Some("Draining".to_owned()),
            message: Some("moving 2 replicas".to_owned()),
            component: None,
            bytes: Some(4096),
        };
        let line = serde_json::to_string(&event).unwrap();
        let read = read_trace(line.as_bytes()).unwrap();
        let expected = TraceRecord {
            version: Some("v1.14.3".to_owned()),
            message: Some("moving 2 replicas".to_owned()),
            bytes: Some(4096),
            ..TraceRecord::new(12.25, "worker-1", WORKER, "evacuation-start").with_reason("Draining")
        };
        assert_eq!(read, [expected]);
    }
}
