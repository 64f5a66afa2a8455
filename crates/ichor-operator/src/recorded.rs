//! What an operation's machines recorded in their status (`status.history`), read back as
//! the timeline's trace records: `kubectl ichor timeline` draws them, and a dry run
//! ([`crate::dry_run`]) learns the durations of the last upgrade from them.

use std::borrow::Borrow;

use ichor_adapters::kubernetes::crd::{Role, TalosMachine, TalosOperation};
use ichor_timeline::TraceRecord;
use ichor_upgrade_core::machine::kubernetes::{self, KUBERNETES_UPGRADE};
use ichor_upgrade_core::machine::lifecycle::INSTALLER_PULL;
use ichor_upgrade_core::operation::OperationKind;
use kube::ResourceExt;

/// The machines an operation concerns, control planes first then by name: its cluster's
/// in its namespace, or the one it removes (from a list or a watch store's objects).
pub fn machines_of<'a, M: Borrow<TalosMachine>>(op: &TalosOperation, machines: &'a [M]) -> Vec<&'a TalosMachine> {
    let mut of: Vec<&TalosMachine> = machines
        .iter()
        .map(Borrow::borrow)
        .filter(|m| m.namespace() == op.namespace() && m.spec.cluster == op.spec.cluster)
        .filter(|m| op.spec.kind != OperationKind::REMOVE || op.spec.machine.as_deref() == Some(m.name_any().as_str()))
        .collect();
    of.sort_by_key(|m| (m.spec.role != Role::Controlplane, m.name_any()));
    of
}

/// Where a timeline's time starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// At the first record drawn (a picture starts where something happens).
    FirstRecord,
    /// At the operation's creation (a plan's lead is the time before the first record).
    Creation,
}

/// The timeline's records from the history of `machines` between the operation's
/// creation and `until` (Unix milliseconds; `None`: now): each step of a condition, as
/// the event the timeline draws, its time in seconds from `origin`.
pub fn history_records(
    op: &TalosOperation,
    machines: &[&TalosMachine],
    until: Option<i64>,
    origin: Origin,
) -> Vec<TraceRecord> {
    let since = op.creation_timestamp().map_or(0, |t| t.0.as_millisecond());
    let until = until.unwrap_or(i64::MAX);
    let mut records = Vec::new();
    let mut first = i64::MAX;
    for machine in machines {
        let role = ichor_upgrade_core::machine::vocabulary::MachineRole::from(machine.spec.role).as_str();
        for step in machine.status.iter().flat_map(|s| &s.history) {
            let at = step.time.0.as_millisecond();
            if at < since || at > until {
                continue;
            }
            // A pull recorded at its end: drawn from when it began.
            let events: &[(i64, &str)] = match (step.type_.as_str(), step.seconds) {
                (INSTALLER_PULL, Some(_)) => &[(step.began_ms().max(since), "image-pull-start"), (at, "image-pulled")],
                _ => match timeline_event(&step.type_, &step.status, &step.reason) {
                    Some(event) => &[(at, event)],
                    None => continue,
                },
            };
            for &(at, event) in events {
                first = first.min(at);
                let mut record = TraceRecord::new(0.0, &machine.name_any(), role, event).with_reason(&step.reason);
                record.bytes = step.bytes;
                records.push((at, record));
            }
        }
    }
    let zero = match origin {
        Origin::FirstRecord => first,
        Origin::Creation => since,
    };
    records.sort_by_key(|(at, r)| (*at, r.node.clone()));
    records
        .into_iter()
        .map(|(at, mut r)| {
            #[allow(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
            let t = (at - zero) as f64 / 1000.0;
            r.t = t;
            r
        })
        .collect()
}

/// The timeline event a condition's step stands for (`None`: not drawn).
fn timeline_event(type_: &str, status: &str, reason: &str) -> Option<&'static str> {
    Some(match (type_, reason) {
        ("StorageEvacuation", "Evacuating") => "evacuation-start",
        ("TalosUpgrade", "UpgradeRequested") => "upgrade-call",
        ("TalosUpgrade" | "TalosLifecycle", "Converged") if status == "False" || status == "True" => "converged",
        ("TalosUpgrade", "UpgradeRefused") | ("TalosLifecycle", "InstallFailed") => "failed",
        ("TalosLifecycle", "InstallRunning") => "install-start",
        ("TalosLifecycle", "Installed") => "installed",
        ("TalosLifecycle", "RebootRequested") => "reboot-call",
        ("NodeRemoval", "ResetRequested") => "reset-call",
        ("NodeRemoval", "Removed") => "removed",
        // A Kubernetes upgrade: each change's apply (its intent, just before the call),
        // its component verified, the machine on the version.
        (KUBERNETES_UPGRADE, kubernetes::reason::APPLY_REQUESTED) => "config-apply",
        (KUBERNETES_UPGRADE, kubernetes::reason::VERIFIED | kubernetes::reason::CONTROL_PLANE_CONVERGED) => {
            "component-ready"
        }
        (KUBERNETES_UPGRADE, kubernetes::reason::CONVERGED) => "converged",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_steps_map_to_the_timelines_events() {
        assert_eq!(timeline_event("TalosUpgrade", "True", "UpgradeRequested"), Some("upgrade-call"));
        assert_eq!(timeline_event("TalosUpgrade", "False", "Converged"), Some("converged"));
        assert_eq!(timeline_event("TalosUpgrade", "True", "UpgradeIntent"), None, "an intent is not a call");
        assert_eq!(timeline_event("NodeRemoval", "True", "Removed"), Some("removed"));
        // Issue 55 item 3: a Kubernetes upgrade's steps are drawn too.
        assert_eq!(timeline_event("KubernetesUpgrade", "Unknown", "ApplyRequested"), Some("config-apply"));
        assert_eq!(timeline_event("KubernetesUpgrade", "True", "Applied"), None, "the apply is drawn from its intent");
        assert_eq!(timeline_event("KubernetesUpgrade", "True", "ComponentVerified"), Some("component-ready"));
        assert_eq!(timeline_event("KubernetesUpgrade", "True", "ControlPlaneConverged"), Some("component-ready"));
        assert_eq!(timeline_event("KubernetesUpgrade", "True", "KubernetesConverged"), Some("converged"));
    }
}
