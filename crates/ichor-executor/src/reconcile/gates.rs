//! The gates a decision asks for, gathered: the etcd gate with the control planes'
//! components, the preflight of the machines about to go, the etcd snapshot.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use ichor_upgrade_core::etcd::snapshot::SnapshotState;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::machine::lifecycle::{CORDONED_ANNOTATION, cordoned_for};
use ichor_upgrade_core::machine::removal::is_removed;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::preflight::{Blocker, ClusterFacts, NodeFacts, Preflight, PreflightConfig, describe};
use ichor_upgrade_core::rollout::{ComponentsVerdict, Decision, EtcdVerdict, OperationView};
use ichor_upgrade_core::status::OperationStatus;
use ichor_upgrade_core::versions::KubernetesVersion;

use super::memory::PassMemory;
use super::observe::{Observed, by_name_in, past_the_point_of_no_return};
use super::view::Pass;
use crate::calls::{Executor, bounded};
use crate::cause::report;
use crate::etcd::{self, ControlPlane};
use crate::etcd_snapshot;
use crate::kube_api::{Event, EventType};

impl Pass<'_> {
    /// The preflight's verdict on each machine `asked`, beside the nodes down.
    pub(super) async fn judge_preflight(&self, asked: &[&str]) -> BTreeMap<String, Vec<Blocker>> {
        judge_preflight(self.ex, self.observed, self.status, &self.op.identity, self.removal, asked, &self.down).await
    }
}

/// The control-plane gate: the etcd gate's verdict and the control planes' own
/// components, gathered together.
pub(super) type GateVerdict = (EtcdVerdict, ComponentsVerdict);

/// Gathers the control-plane gate: the etcd gate from every control plane, and every
/// control plane's components ([`gather_components`]). A control plane whose node name is
/// unknown cannot be matched to its member: the gate fails, naming it, rather than guess.
pub(super) async fn gather_etcd_gate(ex: &Executor<'_>, observed: &[Observed]) -> GateVerdict {
    let (components, _) = gather_components(ex, observed).await;
    let mut control_planes = Vec::new();
    for o in observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane) {
        let Some(node) = o.node_name().map(str::to_owned) else {
            let reason = format!("the node name of control plane {} is unknown", o.machine.name);
            return (EtcdVerdict::Unhealthy { reason }, components);
        };
        control_planes.push(ControlPlane { address: o.machine.address.clone(), node });
    }
    (etcd::gate(ex, &control_planes).await, components)
}

/// Every control plane's components (kube-apiserver, kube-controller-manager,
/// kube-scheduler) as their mirror pods show them, in one read: each control plane with
/// those not Ready (no mirror pod, not Ready, crash-looping), and the oldest version a
/// kube-apiserver runs (`None` when one is not known). A control plane whose node name is
/// unknown counts as none Ready: never a guess. Removed control planes are not counted.
pub(super) async fn gather_components(
    ex: &Executor<'_>,
    observed: &[Observed],
) -> (ComponentsVerdict, Option<KubernetesVersion>) {
    let pods =
        match bounded("read the control planes' static pods", ex.config.call_timeout, ex.kube.control_plane_pods())
            .await
        {
            Ok(Ok(pods)) => pods,
            Ok(Err(error)) => return (ComponentsVerdict::Unreadable { reason: error.to_string() }, None),
            Err(timed_out) => return (ComponentsVerdict::Unreadable { reason: timed_out.to_string() }, None),
        };
    let mut not_ready = BTreeMap::new();
    let mut oldest: Option<KubernetesVersion> = None;
    let mut all_known = true;
    let control_planes =
        observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane && !is_removed(&o.machine.conditions));
    for o in control_planes {
        let on_node = o.node_name().and_then(|node| pods.get(node));
        let mut down = Vec::new();
        for component in Component::CONTROL_PLANE {
            let pod = on_node.and_then(|p| p.get(&component));
            if !pod.is_some_and(|p| p.ready && !p.crash_looping) {
                down.push(component);
            }
            if component == Component::KubeApiserver {
                match pod.and_then(|p| p.version.clone()) {
                    Some(v) => oldest = Some(oldest.map_or(v.clone(), |o| o.min(v))),
                    None => all_known = false,
                }
            }
        }
        if !down.is_empty() {
            not_ready.insert(o.machine.name.clone(), down);
        }
    }
    (ComponentsVerdict::Checked(not_ready), oldest.filter(|_| all_known))
}

/// The preflight's verdict on each machine `asked` (by name), its node judged beside the
/// nodes `down` (those of machines past their disruptive call): its blockers, or, when the
/// facts could not be read, the read's failure as every one's blocker.
pub(super) async fn judge_preflight(
    ex: &Executor<'_>,
    observed: &[Observed],
    status: &OperationStatus,
    operation: &str,
    removal: bool,
    asked: &[&str],
    down: &[&str],
) -> BTreeMap<String, Vec<Blocker>> {
    let asked: Vec<(&str, &str)> =
        asked.iter().map(|m| (*m, by_name_in(observed, m).and_then(Observed::node_name).unwrap_or(m))).collect();
    // Every pod on the nodes down too: a workload is judged over the whole set.
    let mut nodes: Vec<&str> = asked.iter().map(|(_, node)| *node).chain(down.iter().copied()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    match gather_preflight(ex, observed, status, operation, removal, &nodes).await {
        Ok(facts) => {
            let config = PreflightConfig::default();
            let gate = Preflight::new(&facts, &config);
            asked.iter().map(|(machine, node)| ((*machine).to_owned(), gate.blockers_with(node, down))).collect()
        }
        Err(error) => asked
            .iter()
            .map(|(machine, _)| ((*machine).to_owned(), vec![Blocker::NotObserved { error: error.clone() }]))
            .collect(),
    }
}

/// What the preflight gate reads: the cluster's workloads from the API, and its Nodes as
/// this pass observed them, each marked when this operation (`operation`, its identity)
/// took it out (a machine it recorded, one past its Upgrade call, or one carrying its
/// cordon). A read that fails is said, with its cause: it
/// blocks every machine, since nothing can be said to be safe.
pub(super) async fn gather_preflight(
    ex: &Executor<'_>,
    observed: &[Observed],
    status: &OperationStatus,
    operation: &str,
    removal: bool,
    asked: &[&str],
) -> Result<ClusterFacts, String> {
    let bound = ex.config.call_timeout;
    let mut facts = match bounded("read the cluster's workloads", bound, ex.kube.preflight_facts(asked)).await {
        Ok(Ok(facts)) => facts,
        Ok(Err(e)) => return Err(report(&e)),
        Err(e) => return Err(e.to_string()),
    };
    // Only a Node that is not Ready or is cordoned can block: the others are left out (a
    // pass over thousands of machines would copy every name for nothing).
    facts.nodes = observed
        .iter()
        .filter_map(|o| {
            let node = o.node.as_ref().filter(|n| !n.ready || n.unschedulable)?;
            let cordoned_by = node.annotations.get(CORDONED_ANNOTATION).and_then(|v| cordoned_for(v));
            Some(NodeFacts {
                name: node.name.clone(),
                ready: node.ready,
                unschedulable: node.unschedulable,
                by_operation: status.machines.contains_key(&o.machine.name)
                    || past_the_point_of_no_return(removal, &o.machine)
                    || cordoned_by.is_some_and(|by| by == operation),
                // Another operation's engine cordon (an aborted removal, a deleted upgrade)
                // is never lifted here: it blocks as a person's does, and says whose it is.
                cordoned_by: cordoned_by.filter(|by| *by != operation).map(str::to_owned),
            })
        })
        .collect();
    Ok(facts)
}

/// A Warning Event naming the machines the preflight holds back, once per change of them.
pub(super) async fn report_preflight(ex: &Executor<'_>, operation: &str, memory: &PassMemory, decision: &Decision) {
    let blocked = &decision.preflight_blocked;
    {
        let mut last = memory.preflight_reported.lock().unwrap_or_else(PoisonError::into_inner);
        if *last == *blocked {
            return;
        }
        last.clone_from(blocked);
    }
    if blocked.is_empty() {
        return;
    }
    let message = blocked
        .iter()
        .map(|(machine, blockers)| format!("{machine}: {}", describe(blockers)))
        .collect::<Vec<_>>()
        .join("; ");
    let event = Event {
        kind: "TalosOperation",
        name: operation.to_owned(),
        type_: EventType::Warning,
        reason: "PreflightBlocked".to_owned(),
        message: format!("not started while the preflight gate blocks them: {message}"),
    };
    if let Err(e) = bounded("record Event", ex.config.call_timeout, ex.kube.event(&event)).await {
        tracing::debug!(error = %e, "preflight Event not recorded");
    }
}

/// The etcd snapshot the decision asks for, from the Ready control planes, the one about to
/// be upgraded (`next`) last.
pub(super) async fn take_snapshot(
    ex: &Executor<'_>,
    cluster: &str,
    view: &OperationView,
    observed: &[Observed],
    next: Option<&str>,
) -> SnapshotState {
    let mut sources: Vec<etcd_snapshot::Source> = observed
        .iter()
        .filter(|o| o.machine.role == MachineRole::ControlPlane && o.node.as_ref().is_some_and(|n| n.ready))
        .filter_map(|o| {
            Some(etcd_snapshot::Source {
                machine: o.machine.name.clone(),
                address: o.machine.address.clone(),
                node: o.node_name()?.to_owned(),
            })
        })
        .collect();
    sources.sort_by_key(|s| Some(s.machine.as_str()) == next);
    etcd_snapshot::take(ex, cluster, &view.spec.target_version, &sources).await
}

/// The machines the preflight gate holds back, each with its blockers as one line.
pub(super) fn blocked_lines(decision: &Decision) -> Vec<(String, String)> {
    decision.preflight_blocked.iter().map(|(machine, blockers)| (machine.clone(), describe(blockers))).collect()
}
