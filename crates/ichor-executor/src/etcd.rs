//! Reading etcd through the Talos API: one machine's membership, and the gate's reports
//! from every control plane. Both drivers (upgrade and removal) read it the same way.

use futures::future::join_all;
use ichor_upgrade_core::etcd::gate::{self as etcd_gate, ControlPlaneReport, Member, member_of};
use ichor_upgrade_core::machine::vocabulary::EtcdMembership;
use ichor_upgrade_core::rollout::EtcdVerdict;

use crate::calls::Executor;
use crate::talos_api::EtcdMember;

/// A control plane to ask: its Talos address and its node name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlane {
    /// The Talos API address.
    pub address: String,
    /// The node name (its etcd member's name, up to the first dot).
    pub node: String,
}

async fn members(ex: &Executor<'_>, address: &str) -> Result<Vec<EtcdMember>, String> {
    match tokio::time::timeout(ex.config.call_timeout, ex.talos.etcd_members(address)).await {
        Ok(Ok(members)) => Ok(members),
        Ok(Err(e)) => Err(crate::cause::report(&e)),
        Err(_) => Err(format!("no answer within {:?}", ex.config.call_timeout)),
    }
}

/// `node_name`'s membership in the list that the first of `ask` to answer gives.
pub async fn membership(ex: &Executor<'_>, ask: &[&str], node_name: &str) -> EtcdMembership {
    member(ex, ask, node_name).await.state
}

/// A control plane's etcd member, as one control plane listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLookup {
    /// Its membership.
    pub state: EtcdMembership,
    /// Its ID, when it is in the list.
    pub id: Option<u64>,
    /// The address of the control plane that answered.
    pub answered_by: Option<String>,
}

/// `node_name`'s member in the list that the first of `ask` to answer gives, with its ID
/// and who answered (to ask that one to remove it).
pub async fn member(ex: &Executor<'_>, ask: &[&str], node_name: &str) -> MemberLookup {
    let mut last_error = "no control plane to ask".to_owned();
    for address in ask {
        match members(ex, address).await {
            Ok(members) => {
                let found = members.iter().find(|m| member_of(&m.hostname, node_name));
                let state = match found {
                    Some(m) if m.is_learner => EtcdMembership::Learner,
                    Some(_) => EtcdMembership::Voter,
                    None => EtcdMembership::Absent,
                };
                return MemberLookup { state, id: found.map(|m| m.id), answered_by: Some((*address).to_owned()) };
            }
            Err(e) => last_error = e,
        }
    }
    MemberLookup { state: EtcdMembership::Unknown { error: last_error }, id: None, answered_by: None }
}

/// Runs one etcd read under the ordinary bound, with its error as text for the verdict.
async fn read<T>(ex: &Executor<'_>, future: impl Future<Output = Result<T, crate::TalosError>>) -> Result<T, String> {
    match tokio::time::timeout(ex.config.call_timeout, future).await {
        Ok(result) => result.map_err(|e| crate::cause::report(&e)),
        Err(_) => Err(format!("no answer within {:?}", ex.config.call_timeout)),
    }
}

/// The etcd gate's verdict before a control plane reboots, over these control planes, each
/// asked for its member list, its own member's status and the alarms
/// ([`etcd_gate::verdict`]).
pub async fn gate(ex: &Executor<'_>, control_planes: &[ControlPlane]) -> EtcdVerdict {
    etcd_gate::verdict(&reports(ex, control_planes).await)
}

/// Whether etcd is healthy enough for a member to leave ([`etcd_gate::health`]): as the
/// gate, but a two-member cluster may shrink to one.
pub async fn health(ex: &Executor<'_>, control_planes: &[ControlPlane]) -> EtcdVerdict {
    etcd_gate::health(&reports(ex, control_planes).await)
}

async fn reports(ex: &Executor<'_>, control_planes: &[ControlPlane]) -> Vec<ControlPlaneReport> {
    join_all(control_planes.iter().map(|cp| async {
        let members = members(ex, &cp.address).await.map(|list| {
            list.into_iter().map(|m| Member { id: m.id, name: m.hostname, is_learner: m.is_learner }).collect()
        });
        let status = read(ex, ex.talos.etcd_status(&cp.address)).await;
        let alarms = read(ex, ex.talos.etcd_alarms(&cp.address)).await;
        ControlPlaneReport { node: cp.node.clone(), members, status, alarms }
    }))
    .await
}
