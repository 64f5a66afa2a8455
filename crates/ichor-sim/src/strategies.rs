//! Proptest strategies over simulated clusters and their faults, and a harness that runs
//! one's own API doubles through the engine on the simulated cluster (the `proptest`
//! feature).
//!
//! - [`faults`], [`faults_among`] and [`fault_schedule`] draw the simulator's faults and
//!   seeds; [`FaultSchedule::apply`] puts one on a [`SimConfig`].
//! - [`sim_case`] draws a whole case: a [`ClusterShape`] (roles, order labels, holds,
//!   NotReady Nodes), a fault schedule and `maxUnavailable`. [`SimCase::build`] makes the
//!   [`SimCluster`] with the operation [`OPERATION`] on it, and [`SimCase::run`] plays it
//!   through the real drivers with [`run_operation`], lifting the holds on the way.
//! - [`run_with`] runs the engine on a simulated cluster through a `TalosApi` and a
//!   `KubeApi` of one's own (a double that wraps the simulator's, or one written by hand
//!   over the same world), as a controller would: reconcile, then wait in virtual time for
//!   the requeue or a watch event.
//!
//! ```
//! use ichor_sim::RunEnd;
//! use ichor_sim::strategies::sim_case;
//! use ichor_executor::ExecutorConfig;
//! use proptest::prelude::*;
//!
//! proptest!(ProptestConfig::with_cases(2), |(case in sim_case(3..=3, 0..=2))| {
//!     let sim = case.build();
//!     let end = case.run(&sim, &ExecutorConfig::default(), 20_000);
//!     prop_assert!(matches!(end, RunEnd::Completed | RunEnd::Paused), "{:?}", end);
//!     prop_assert!(sim.report(case.max_unavailable as usize).max_control_planes_down <= 1);
//! });
//! ```

use std::time::Duration;

use ichor_executor::ExecutorConfig;
use ichor_executor::kube_api::KubeApi;
use ichor_executor::machine::talos::Executor;
use ichor_executor::reconcile::{PassMemory, reconcile_with};
use ichor_executor::talos_api::TalosApi;
use ichor_upgrade_core::operation::{HOLD_ANNOTATION, OperationSpec};
use ichor_upgrade_core::status::{Phase, WaitReason};
use ichor_upgrade_core::strategies::{ClusterShape, cluster_shape};
use ichor_upgrade_core::versions::TalosVersion;
use proptest::collection::SizeRange;
use proptest::prelude::*;

use super::config::{Fault, SimConfig};
use super::runner::{RunEnd, finished, run_operation, wait_for_wake};
use super::world::World;
use super::{SimCluster, runtime};

/// The name of the operation [`SimCase::build`] creates.
pub const OPERATION: &str = "upgrade";
/// The version the nodes of a [`SimCase`] run at the start.
pub const FROM: &str = "v1.14.3";
/// The version a [`SimCase`] upgrades to.
pub const TO: &str = "v1.14.4";

/// The faults a run must complete through: each delays it, none of them fails a machine.
/// The others (`ab-fallback`, `evacuation-stuck`, `snapshot-fails`, `pdb-zero`,
/// `single-replica`) may end it paused or waiting on a person.
pub const HARMLESS: [Fault; 9] = [
    Fault::ControllerCrash,
    Fault::ApiOutage,
    Fault::SlowReboot,
    Fault::PdbBlocked,
    Fault::EtcdLag,
    Fault::NotReady,
    Fault::CallLost,
    Fault::ControlPlaneNotReady,
    Fault::ComponentDown,
];

/// Any one fault.
pub fn fault() -> impl Strategy<Value = Fault> {
    prop::sample::select(Fault::ALL.to_vec())
}

/// A set of faults, each of [`Fault::ALL`] on with a chance of one in five, in the order
/// of [`Fault::ALL`].
pub fn faults() -> impl Strategy<Value = Vec<Fault>> {
    faults_among(&Fault::ALL, 0.2)
}

/// A set of faults from `among`, each on with `chance`, in the order of `among`.
pub fn faults_among(among: &[Fault], chance: f64) -> impl Strategy<Value = Vec<Fault>> {
    let among = among.to_vec();
    prop::collection::vec(prop::bool::weighted(chance), among.len())
        .prop_map(move |on| among.iter().zip(on).filter(|(_, on)| *on).map(|(f, _)| *f).collect())
}

/// What goes wrong in a simulated run, and when: the faults, and the seed that places
/// them (which node falls back, when the outage comes) and draws every duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSchedule {
    /// The run's seed.
    pub seed: u64,
    /// The faults.
    pub faults: Vec<Fault>,
}

impl FaultSchedule {
    /// `config` with this schedule's seed and faults.
    #[must_use]
    pub fn apply(&self, config: SimConfig) -> SimConfig {
        config.with_seed(self.seed).with_faults(self.faults.iter().copied())
    }

    /// Whether every fault is one of [`HARMLESS`]: a run must then complete.
    #[must_use]
    pub fn harmless(&self) -> bool {
        self.faults.iter().all(|f| HARMLESS.contains(f))
    }

    /// The faults as the `rollout` example's `--faults` takes them (`ab-fallback,...`).
    #[must_use]
    pub fn names(&self) -> String {
        self.faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(",")
    }
}

/// A [`FaultSchedule`]: any seed, and [`faults`].
pub fn fault_schedule() -> impl Strategy<Value = FaultSchedule> {
    (any::<u64>(), faults()).prop_map(|(seed, faults)| FaultSchedule { seed, faults })
}

/// A [`FaultSchedule`] over the faults `among`, each on with `chance`.
pub fn fault_schedule_among(among: &[Fault], chance: f64) -> impl Strategy<Value = FaultSchedule> {
    (any::<u64>(), faults_among(among, chance)).prop_map(|(seed, faults)| FaultSchedule { seed, faults })
}

/// One simulated rollout: a cluster, what goes wrong in it, and the operation's
/// `maxUnavailable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimCase {
    /// The machines: roles, order labels, holds, and which Nodes are NotReady at the start.
    pub shape: ClusterShape,
    /// The faults and the seed.
    pub schedule: FaultSchedule,
    /// The operation's `maxUnavailable`.
    pub max_unavailable: i64,
    /// Whether the workers carry storage replicas.
    pub storage: bool,
    /// How long the Nodes the shape has NotReady stay so, in seconds from the start.
    pub not_ready_s: u64,
    /// After this many reconcile passes [`SimCase::run`] lifts every hold (sooner if the
    /// operation waits on held machines alone).
    pub lift_holds_at: usize,
    /// Under `controller-crash`, at most this many kills (`None`: no bound). A lifecycle
    /// install lasts as long as its stream: a controller killed for ever never installs
    /// anything (see [`CrashState::max_kills`](super::world::CrashState::max_kills)).
    pub max_kills: Option<u64>,
}

impl SimCase {
    /// The simulated cluster's configuration (the shape's labels, holds and NotReady Nodes
    /// are put on by [`SimCase::build`]).
    ///
    /// # Panics
    /// Never: [`FROM`] and [`TO`] parse.
    #[must_use]
    pub fn config(&self) -> SimConfig {
        let v = |t: &str| TalosVersion::parse(t).expect("a version");
        let config = SimConfig::new(self.shape.control_planes().count(), self.shape.workers().count(), v(FROM), v(TO))
            .with_storage(self.storage);
        self.schedule.apply(config)
    }

    /// The simulated cluster, with the shape's order labels and holds on its machines, its
    /// NotReady Nodes down for [`SimCase::not_ready_s`], and the operation [`OPERATION`]
    /// (to [`TO`], at `max_unavailable`) created.
    #[must_use]
    pub fn build(&self) -> SimCluster {
        let sim = SimCluster::new(self.config());
        sim.with_world(|w| {
            w.crash.max_kills = self.max_kills;
            let until = w.now.saturating_add(Duration::from_secs(self.not_ready_s));
            for m in &self.shape.machines {
                w.machine_labels.entry(m.name.clone()).or_default().extend(m.labels());
                w.machine_annotations.entry(m.name.clone()).or_default().extend(m.annotations());
                if !m.node_ready
                    && let Some(node) = w.nodes.iter_mut().find(|n| n.name == m.name)
                {
                    node.ready = false;
                    node.view.ready = false;
                    node.not_ready_until = Some(node.not_ready_until.map_or(until, |t| t.max(until)));
                }
            }
        });
        sim.create_operation(OPERATION, OperationSpec::talos(TO, self.max_unavailable));
        sim
    }

    /// Runs [`OPERATION`] on `sim` (made by [`SimCase::build`]) to its end with
    /// [`run_operation`], at most `max_passes` passes, on a runtime of its own
    /// ([`runtime`]). The holds come off (a person lifting them, seen through the watch)
    /// after [`SimCase::lift_holds_at`] passes, or as soon as the operation waits on held
    /// machines alone.
    pub fn run(&self, sim: &SimCluster, config: &ExecutorConfig, max_passes: usize) -> RunEnd {
        let mut passes = 0;
        let mut lifted = false;
        let lift_holds_at = self.lift_holds_at;
        let on_pass = |sim: &SimCluster| {
            passes += 1;
            if lifted {
                return;
            }
            let waits_on_holds = sim.read_world(|w| {
                w.operations
                    .get(OPERATION)
                    .is_some_and(|op| matches!(op.info.status.phase, Phase::Waiting(WaitReason::Held { .. })))
            });
            if passes >= lift_holds_at || waits_on_holds {
                lifted = true;
                sim.with_world(|w| {
                    for annotations in w.machine_annotations.values_mut() {
                        annotations.remove(HOLD_ANNOTATION);
                    }
                    w.watch_event();
                });
            }
        };
        runtime().block_on(run_operation(sim, OPERATION, config, max_passes, on_pass))
    }
}

/// A [`SimCase`] over a [`cluster_shape`] of `control_planes` and `workers` (two control
/// planes are refused at planning: draw them only to test that), with a
/// [`fault_schedule`], `maxUnavailable` 1 to 4, storage on the workers three times in four,
/// NotReady Nodes down for 1 to 15 minutes, holds lifted after 1 to 40 passes, and at
/// most 8 controller kills.
pub fn sim_case(control_planes: impl Into<SizeRange>, workers: impl Into<SizeRange>) -> impl Strategy<Value = SimCase> {
    sim_case_with(cluster_shape(control_planes, workers), fault_schedule())
}

/// A [`SimCase`] over these shapes and schedules, the rest drawn as [`sim_case`] does.
pub fn sim_case_with(
    shapes: impl Strategy<Value = ClusterShape>,
    schedules: impl Strategy<Value = FaultSchedule>,
) -> impl Strategy<Value = SimCase> {
    (shapes, schedules, 1i64..=4, prop::bool::weighted(0.75), 60u64..=900, 1usize..=40).prop_map(
        |(shape, schedule, max_unavailable, storage, not_ready_s, lift_holds_at)| SimCase {
            shape,
            schedule,
            max_unavailable,
            storage,
            not_ready_s,
            lift_holds_at,
            max_kills: Some(8),
        },
    )
}

/// After a failed pass (an outage), [`run_with`] retries after this long, as a
/// controller's error backoff would.
pub const ERROR_BACKOFF: Duration = Duration::from_secs(5);

/// Runs operation `name` on `sim` to its end, at most `max_passes` passes, through `talos`
/// and `kube` instead of the simulator's own APIs (storage, the clock and the etcd snapshot
/// store stay the simulator's). Each pass is [`reconcile_with`] with one [`PassMemory`];
/// between passes virtual time moves to the requeue time or the next watch event, as in
/// [`run_operation`]. No calls run outside the passes (a lifecycle install is carried out
/// inside its pass, nothing is pre-pulled) and the controller is never killed (the
/// `controller-crash` fault is [`run_operation`]'s). Await it on [`runtime`].
///
/// A double sees every call the engine makes and answers as it likes; what it passes on to
/// the simulator changes the simulated world, which the trace and
/// [`SimCluster::report`] then show.
pub async fn run_with(
    sim: &SimCluster,
    talos: &dyn TalosApi,
    kube: &dyn KubeApi,
    name: &str,
    config: &ExecutorConfig,
    max_passes: usize,
) -> RunEnd {
    sim.with_world_untouched(World::start_clock);
    let memory = PassMemory::new();
    for _ in 0..max_passes {
        let storage = sim.with_world_untouched(|w| {
            w.sync_clock();
            w.counters.passes += 1;
            w.take_deliveries()
        });
        for node in &storage {
            memory.storage_changed(node);
        }
        let _ = memory.defer_pass(sim.now(), config.pass_interval);
        let store = sim.snapshot_store();
        let ex = Executor { talos, kube, snapshots: Some(store.as_ref()), ..sim.executor(config) };
        let result = reconcile_with(&ex, name, &memory).await;
        let now = sim.now();
        let requeue = match result {
            Ok(outcome) => {
                if let Some(end) = finished(sim, name, &outcome.phase) {
                    return end;
                }
                outcome.requeue_at
            }
            Err(_) => Some(now.saturating_add(ERROR_BACKOFF)),
        };
        memory.pass_ended(now, requeue);
        let not_before = memory.next_pass_at(config.pass_interval).unwrap_or(now);
        if !wait_for_wake(sim, requeue, not_before).await {
            let phase = sim.read_world(|w| w.operations.get(name).map(|op| op.info.status.phase.clone()));
            return RunEnd::Stalled(phase.unwrap_or(Phase::Pending));
        }
    }
    RunEnd::PassBound
}

#[cfg(test)]
mod tests {
    use ichor_upgrade_core::operation::ORDER_LABEL;

    use super::*;

    #[test]
    fn a_built_case_carries_its_shapes_labels_holds_and_not_ready_nodes() {
        let mut shape = ClusterShape::plain(3, 2);
        shape.machines[1].order_label = Some("2".to_owned());
        shape.machines[3].held = true;
        shape.machines[4].node_ready = false;
        let case = SimCase {
            shape,
            schedule: FaultSchedule { seed: 3, faults: vec![Fault::SlowReboot] },
            max_unavailable: 1,
            storage: true,
            not_ready_s: 120,
            lift_holds_at: 5,
            max_kills: None,
        };
        let sim = case.build();
        sim.read_world(|w| {
            assert_eq!(w.config.seed, 3);
            assert_eq!(w.config.faults, [Fault::SlowReboot]);
            assert_eq!(w.machine_labels["cp-2"].get(ORDER_LABEL).map(String::as_str), Some("2"));
            assert!(w.machine_annotations["worker-1"].contains_key(HOLD_ANNOTATION));
            let down = w.node("worker-2").unwrap();
            assert!(!down.ready && down.not_ready_until.is_some());
            assert!(w.operations.contains_key(OPERATION));
        });
        let end = case.run(&sim, &ExecutorConfig::default(), 20_000);
        assert_eq!(end, RunEnd::Completed);
        sim.read_world(|w| {
            assert!(w.machine_annotations.values().all(|a| !a.contains_key(HOLD_ANNOTATION)));
            assert!(w.nodes.iter().all(|n| n.version.to_string() == TO));
        });
    }

    #[test]
    fn run_with_the_simulators_own_apis_completes_as_run_operation_does() {
        let case = SimCase {
            shape: ClusterShape::plain(3, 3),
            schedule: FaultSchedule { seed: 11, faults: Vec::new() },
            max_unavailable: 2,
            storage: true,
            not_ready_s: 60,
            lift_holds_at: 1,
            max_kills: None,
        };
        let sim = case.build();
        let end = runtime().block_on(run_with(&sim, &sim, &sim, OPERATION, &ExecutorConfig::default(), 20_000));
        assert_eq!(end, RunEnd::Completed);
        let report = sim.report(2);
        assert_eq!(report.on_target, 6);
        assert_eq!(report.upgrade_calls, 6);
    }

    #[test]
    fn schedules_name_their_faults_and_know_the_harmless_ones() {
        let schedule = FaultSchedule { seed: 1, faults: vec![Fault::ApiOutage, Fault::AbFallback] };
        assert_eq!(schedule.names(), "api-outage,ab-fallback");
        assert!(!schedule.harmless());
        assert!(FaultSchedule { seed: 1, faults: vec![Fault::ApiOutage] }.harmless());
        let config =
            schedule.apply(SimConfig::new(1, 0, TalosVersion::parse(FROM).unwrap(), TalosVersion::parse(TO).unwrap()));
        assert_eq!((config.seed, config.faults), (1, vec![Fault::ApiOutage, Fault::AbFallback]));
    }
}
