//! Another operator's own `TalosApi` and `KubeApi` doubles, run through the engine's
//! `reconcile` on the simulated cluster with `ichor_sim::strategies::run_with`.
//! Each double wraps the simulator's API, passes most calls on, and answers some itself.

use std::sync::Arc;
use std::sync::Mutex;

use async_trait::async_trait;
use ichor_executor::ExecutorConfig;
use ichor_executor::kube_api::{
    ClusterInfo, Event, KubeApi, KubeError, LeaseInfo, LeaseWrite, MachineInfo, NodeInfo, OperationInfo, PodInfo,
};
use ichor_executor::talos_api::{EtcdAlarm, EtcdMember, EtcdStatus, ImageInfo, SnapshotStream, TalosApi, TalosError};
use ichor_executor::writes::{ConditionWrite, KubeWrite, KubeWritten, Seal, TalosWrite, TalosWritten};
use ichor_sim::strategies::FaultSchedule;
use ichor_sim::strategies::{FROM, OPERATION, SimCase, TO, run_with};
use ichor_sim::{RunEnd, SimCluster, runtime};
use ichor_storage::ConditionWriteError;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::status::RecordState;
use ichor_upgrade_core::status::{OperationStatus, Phase};
use ichor_upgrade_core::strategies::ClusterShape;
use ichor_upgrade_core::upgrade_marker::TALOS_UPGRADE;

/// A Talos API that refuses every Upgrade call to one address (as a node whose installer
/// image cannot be verified would) and passes everything else on to the simulator,
/// recording the Upgrade calls it saw.
struct RefusesOneUpgrade<'a> {
    sim: &'a SimCluster,
    refused: String,
    upgrades: Mutex<Vec<String>>,
}

#[async_trait]
impl TalosApi for RefusesOneUpgrade<'_> {
    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        self.sim.nodename(node).await
    }
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        self.sim.machine_stage(node).await
    }
    async fn write(&self, node: &str, write: TalosWrite<'_>, seal: Seal) -> Result<TalosWritten, TalosError> {
        if let TalosWrite::Upgrade(_) = write {
            self.upgrades.lock().unwrap().push(node.to_owned());
            if node == self.refused {
                return Err(TalosError::answer("FailedPrecondition", "installer image signature not trusted"));
            }
        }
        TalosApi::write(self.sim, node, write, seal).await
    }
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        self.sim.etcd_members(node).await
    }
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        self.sim.etcd_status(node).await
    }
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        self.sim.etcd_alarms(node).await
    }
    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        self.sim.etcd_snapshot(node).await
    }
    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        self.sim.image_list(node).await
    }
    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        self.sim.boot_id(node).await
    }
}

/// A Kubernetes API that loses the first `conflicts` writes of an operation's status to a
/// conflict (another writer got there first), and the first `intents` writes of the upgrade
/// intent (the `TalosUpgrade` condition, written before the call) of the machine
/// `lose_intent_of` (the API server unreachable), and passes everything else on to the simulator,
/// recording the phases it wrote.
struct LosesWrites<'a> {
    sim: &'a SimCluster,
    conflicts: Mutex<usize>,
    lose_intent_of: Option<String>,
    intents: Mutex<usize>,
    written: Mutex<Vec<Phase>>,
}

impl<'a> LosesWrites<'a> {
    fn new(sim: &'a SimCluster, conflicts: usize, lose_intent_of: Option<(&str, usize)>) -> Self {
        Self {
            sim,
            conflicts: Mutex::new(conflicts),
            lose_intent_of: lose_intent_of.map(|(machine, _)| machine.to_owned()),
            intents: Mutex::new(lose_intent_of.map_or(0, |(_, n)| n)),
            written: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl KubeApi for LosesWrites<'_> {
    async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError> {
        self.sim.node(name).await
    }
    async fn nodes(&self, names: &[&str]) -> Result<Vec<Option<Arc<NodeInfo>>>, KubeError> {
        self.sim.nodes(names).await
    }
    async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError> {
        self.sim.operation(name).await
    }
    async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError> {
        self.sim.operation_exists(identity).await
    }
    async fn control_plane_pods(&self) -> Result<ichor_executor::kube_api::ControlPlanePods, KubeError> {
        self.sim.control_plane_pods().await
    }
    async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError> {
        self.sim.cluster(name).await
    }
    async fn machines(&self, cluster: &str) -> Result<Vec<Arc<MachineInfo>>, KubeError> {
        self.sim.machines(cluster).await
    }
    async fn preflight_facts(&self, asked: &[&str]) -> Result<ichor_upgrade_core::preflight::ClusterFacts, KubeError> {
        self.sim.preflight_facts(asked).await
    }
    async fn lease(&self, cluster: &str) -> Result<Option<LeaseInfo>, KubeError> {
        self.sim.lease(cluster).await
    }
    async fn write_lease(&self, cluster: &str, write: &LeaseWrite) -> Result<(), KubeError> {
        self.sim.write_lease(cluster, write).await
    }
    async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError> {
        {
            let mut conflicts = self.conflicts.lock().unwrap();
            if *conflicts > 0 {
                *conflicts -= 1;
                return Err(KubeError::Conflict(format!("TalosOperation {name}: the object has been modified")));
            }
        }
        self.written.lock().unwrap().push(status.phase.clone());
        self.sim.write_operation_status(name, status).await
    }
    async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError> {
        self.sim.remove_finalizer(name).await
    }
    async fn event(&self, event: &Event) -> Result<(), KubeError> {
        self.sim.event(event).await
    }
    async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError> {
        self.sim.machine(name).await
    }
    async fn write(&self, write: KubeWrite<'_>, seal: Seal) -> Result<KubeWritten, KubeError> {
        KubeApi::write(self.sim, write, seal).await
    }
    // Only a write the client holds to its own last version (`at: None`) is lost: one
    // held to the version the machine was read at goes through.
    async fn write_conditions(&self, write: ConditionWrite<'_>, seal: Seal) -> Result<(), ConditionWriteError> {
        if write.at.is_none() {
            let mut intents = self.intents.lock().unwrap();
            if *intents > 0
                && self.lose_intent_of.as_deref() == Some(write.machine)
                && write.conditions.get(TALOS_UPGRADE).is_some()
            {
                *intents -= 1;
                return Err(ConditionWriteError {
                    machine: write.machine.to_owned(),
                    message: "dial tcp 127.0.0.1:6443: connect: connection refused".to_owned(),
                    transient: true,
                });
            }
        }
        KubeApi::write_conditions(self.sim, write, seal).await
    }
    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        self.sim.pods_on(node).await
    }
}

/// Three control planes and three workers, nothing held, every Node Ready, no faults.
fn plain_case(seed: u64) -> SimCase {
    SimCase {
        shape: ClusterShape::plain(3, 3),
        schedule: FaultSchedule { seed, faults: Vec::new() },
        max_unavailable: 1.into(),
        storage: true,
        not_ready_s: 60,
        lift_holds_at: 1,
        max_kills: None,
    }
}

#[test]
fn an_upgrade_the_talos_api_refuses_fails_its_machine_once_and_pauses_the_rest() {
    let case = plain_case(5);
    let sim = case.build();
    let refused = sim.read_world(|w| w.node("worker-2").expect("worker-2").address.clone());
    let talos = RefusesOneUpgrade { sim: &sim, refused: refused.clone(), upgrades: Mutex::new(Vec::new()) };
    let end = runtime().block_on(run_with(&sim, &talos, &sim, OPERATION, &ExecutorConfig::default(), 20_000));

    assert_eq!(end, RunEnd::Paused);
    let upgrades = talos.upgrades.into_inner().unwrap();
    assert_eq!(upgrades.iter().filter(|a| **a == refused).count(), 1, "the refused call was sent again: {upgrades:?}");
    sim.read_world(|w| {
        let status = &w.operations[OPERATION].info.status;
        assert!(matches!(status.phase, Phase::Paused(_)), "{:?}", status.phase);
        assert_eq!(status.machines["worker-2"].state, RecordState::Failed, "{:?}", status.machines["worker-2"]);
        let version = |name: &str| w.node(name).expect(name).version.to_string();
        for name in ["cp-1", "cp-2", "cp-3", "worker-1"] {
            assert_eq!(version(name), TO, "{name}");
        }
        // One worker at a time, in name order: worker-3 never started.
        assert_eq!(version("worker-2"), FROM);
        assert_eq!(version("worker-3"), FROM);
    });
    assert_eq!(upgrades.len(), 5, "{upgrades:?}");
}

#[test]
fn status_writes_lost_to_conflicts_are_retried_and_the_rollout_completes() {
    let case = plain_case(9);
    let sim = case.build();
    let kube = LosesWrites::new(&sim, 3, None);
    let end = runtime().block_on(run_with(&sim, &sim, &kube, OPERATION, &ExecutorConfig::default(), 20_000));

    assert_eq!(end, RunEnd::Completed);
    assert_eq!(*kube.conflicts.lock().unwrap(), 0, "every conflict was met");
    let written = kube.written.into_inner().unwrap();
    assert_eq!(written.last(), Some(&Phase::Completed), "{written:?}");
    let report = sim.report(1);
    assert_eq!((report.on_target, report.upgrade_calls), (6, 6), "{report:?}");
}

/// Found by a random draw of the downstream properties (an API outage while a worker's
/// replicas moved): the write of a machine's upgrade intent, just before its call, fails on
/// an unreachable API server. That wait had no time of its own: the next storage event
/// (its last replica gone) woke it once, and when that write failed too nothing the
/// watches report changed for the machine again, and the rollout never ended. It is
/// looked at again a poll later, and the call goes out then, once.
#[test]
fn a_lost_write_of_the_upgrade_intent_is_retried_and_the_rollout_completes() {
    let case = plain_case(9);
    let sim = case.build();
    let kube = LosesWrites::new(&sim, 0, Some(("worker-2", 2)));
    let end = runtime().block_on(run_with(&sim, &sim, &kube, OPERATION, &ExecutorConfig::default(), 20_000));

    assert_eq!(end, RunEnd::Completed);
    assert_eq!(*kube.intents.lock().unwrap(), 0, "the intent's write was lost twice");
    let report = sim.report(1);
    assert_eq!((report.on_target, report.upgrade_calls), (6, 6), "{report:?}");
}
