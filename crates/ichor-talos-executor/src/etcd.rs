//! Reading etcd through the Talos API: one machine's membership, and the gate's reports
//! from every control plane. Both drivers (upgrade and removal) read it the same way.

use futures::future::join_all;
use ichor_upgrade_core::etcd_gate::{self, ControlPlaneReport, Member, member_of};
use ichor_upgrade_core::rollout::EtcdVerdict;
use ichor_upgrade_core::talos_step::EtcdMembership;

use crate::advance::Executor;
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
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {:?}", ex.config.call_timeout)),
    }
}

/// `node_name`'s membership in the list that the first of `ask` to answer gives.
pub async fn membership(ex: &Executor<'_>, ask: &[&str], node_name: &str) -> EtcdMembership {
    let mut last_error = "no control plane to ask".to_owned();
    for address in ask {
        match members(ex, address).await {
            Ok(members) => {
                return match members.iter().find(|m| member_of(&m.hostname, node_name)) {
                    Some(m) if m.is_learner => EtcdMembership::Learner,
                    Some(_) => EtcdMembership::Voter,
                    None => EtcdMembership::Absent,
                };
            }
            Err(e) => last_error = e,
        }
    }
    EtcdMembership::Unknown { error: last_error }
}

/// Runs one etcd read under the ordinary bound, with its error as text for the verdict.
async fn read<T>(ex: &Executor<'_>, future: impl Future<Output = Result<T, crate::TalosError>>) -> Result<T, String> {
    match tokio::time::timeout(ex.config.call_timeout, future).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {:?}", ex.config.call_timeout)),
    }
}

/// The etcd gate's verdict over these control planes, each asked for its member list, its
/// own member's status and the alarms.
pub async fn gate(ex: &Executor<'_>, control_planes: &[ControlPlane]) -> EtcdVerdict {
    let reports = join_all(control_planes.iter().map(|cp| async {
        let members = members(ex, &cp.address).await.map(|list| {
            list.into_iter().map(|m| Member { id: m.id, name: m.hostname, is_learner: m.is_learner }).collect()
        });
        let status = read(ex, ex.talos.etcd_status(&cp.address)).await;
        let alarms = read(ex, ex.talos.etcd_alarms(&cp.address)).await;
        ControlPlaneReport { node: cp.node.clone(), members, status, alarms }
    }))
    .await;
    etcd_gate::verdict(&reports)
}
