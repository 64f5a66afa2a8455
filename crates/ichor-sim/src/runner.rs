//! The controller loop on the simulated cluster: reconcile, then wait, in virtual time,
//! for what wakes a real controller: a watch event reaching it, or its own requested
//! recheck. Nothing else wakes it ([`Wake::Watch`]); the old model, in which the runner
//! wakes at every change of the world, is kept as [`Wake::Oracle`] for comparison. Under
//! the controller-crash fault, the controller is killed at random calls and restarted
//! with nothing in memory.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use ichor_executor::ExecutorConfig;
use ichor_executor::background::{Job, JobQueue};
use ichor_executor::effects::Advancing;
use ichor_executor::etcd::ControlPlane;
use ichor_executor::jobs::run_job;
use ichor_executor::kube_api::KubeApi;
use ichor_executor::machine::removal::remove_machine;
use ichor_executor::machine::talos::Executor;
use ichor_executor::reconcile::{PassMemory, reconcile_with};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::status::RecordState;
use ichor_upgrade_core::status::{PauseReason, Phase};

use super::SimCluster;
use super::config::{Fault, Wake};
use super::trace::{TraceEvent, TraceKind};
use super::world::{StopDuringInstall, World};

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// The operation completed.
    Completed,
    /// The operation paused, with nothing left in flight.
    Paused,
    /// The operation was refused.
    Refused,
    /// Nothing more will happen and the operation is not finished (a wait with no end).
    Stalled(Phase),
    /// The pass bound was reached: a livelock.
    PassBound,
    /// The operation was deleted and its deletion carried out (its finalizer removed).
    Deleted,
}

/// How soon a controller killed in a job's call is restarted.
const DEAD_CHECK: Duration = Duration::from_secs(1);

/// After a failed pass (an outage), the controller retries after this long, as a
/// controller's error backoff would.
const ERROR_BACKOFF: Duration = Duration::from_secs(5);

/// Runs operation `name` to its end, at most `max_passes` reconciles. `on_pass` sees the
/// world after each pass.
pub async fn run_operation(
    sim: &SimCluster,
    name: &str,
    config: &ExecutorConfig,
    max_passes: usize,
    mut on_pass: impl FnMut(&SimCluster),
) -> RunEnd {
    let crashes = sim.with_world_untouched(|w| {
        w.start_clock();
        w.config.has(Fault::ControllerCrash)
    });
    let memory = PassMemory::new();
    let mut preflight = PreflightWatch::new(sim.now());
    // Calls that outlive a pass (the lifecycle install, pre-pulls) run beside the passes, as
    // a controller's tasks do; they die with the controller.
    let queue = JobQueue::new(name, config.prepull.limit);
    // The jobs see the queue too: an install that began is remembered in it (an outage may
    // keep its record from being written).
    let job_ex = Executor { background: Some(&queue), ..sim.executor(config) };
    let mut jobs = Jobs::new(&queue, job_ex);
    for _ in 0..max_passes {
        let storage = sim.with_world_untouched(|w| {
            w.sync_clock();
            w.counters.passes += 1;
            w.take_deliveries()
        });
        // Waited for as the operator defers: it is due.
        let _ = memory.defer_pass(sim.now(), config.pass_interval);
        // As the operator's watch of Longhorn's replicas does.
        for node in &storage {
            memory.storage_changed(node);
        }
        if crashes {
            sim.with_world_untouched(|w| {
                let budget = w.crash.max_kills.is_none_or(|max| w.counters.restarts < max);
                if w.crash.crash_at.is_none() && budget && w.crash_rng.chance(0.25) {
                    let after = w.crash_rng.in_range(1..=40);
                    let before = w.crash_rng.chance(0.5);
                    w.arm_crash(after, before);
                }
            });
        }
        let store = sim.snapshot_store();
        let ex = Executor { snapshots: Some(store.as_ref()), background: Some(&queue), ..sim.executor(config) };
        let result = jobs.beside(reconcile_with(&ex, name, &memory)).await;
        jobs.start_submitted();
        let restarted = sim.with_world_untouched(|w| {
            let restarted = w.take_restart();
            if restarted {
                let t = w.now.saturating_since(w.start).as_secs_f64();
                w.trace.push(TraceEvent {
                    t,
                    node: "controller".to_owned(),
                    role: "controller",
                    event: TraceKind::ControllerRestart,
                    version: None,
                    boot_id: None,
                    reason: None,
                    message: None,
                    component: None,
                    bytes: None,
                });
            }
            restarted
        });
        on_pass(sim);
        if restarted {
            // A new process: nothing in memory, none of the old one's calls under way.
            memory.clear();
            jobs.clear();
            // What the killed pass found of the preflight was never reported: the new
            // process traces what its own passes find.
            preflight = PreflightWatch::new(sim.now());
            continue;
        }
        let now = sim.now();
        let requeue = match result {
            Ok(outcome) => {
                preflight.observe(sim, now, &outcome.preflight_blocked, &outcome.preflight_cleared);
                if let Some(end) = finished(sim, name, &outcome.phase) {
                    return end;
                }
                outcome.requeue_at
            }
            Err(_) => Some(now.saturating_add(ERROR_BACKOFF)),
        };
        // The operator's rule: only wakes from outside are held to the pass interval.
        memory.pass_ended(now, requeue);
        let not_before = memory.next_pass_at(config.pass_interval).unwrap_or(now);
        if !jobs.beside_wait(sim, requeue, not_before).await {
            return RunEnd::Stalled(sim.with_world_untouched(|w| w.operations[name].info.status.phase.clone()));
        }
    }
    RunEnd::PassBound
}

/// The controller's calls under way outside its passes.
struct Jobs<'a> {
    queue: &'a JobQueue,
    ex: Executor<'a>,
    running: FuturesUnordered<LocalBoxFuture<'a, (Job, MachineOutcome)>>,
}

impl<'a> Jobs<'a> {
    fn new(queue: &'a JobQueue, ex: Executor<'a>) -> Self {
        Self { queue, ex, running: FuturesUnordered::new() }
    }

    /// Starts the jobs the last pass submitted.
    fn start_submitted(&mut self) {
        for job in self.queue.take() {
            let ex = self.ex;
            self.running.push(Box::pin(async move {
                let outcome = run_job(&ex, &job).await;
                (job, outcome)
            }));
        }
    }

    /// The jobs die with the controller.
    fn clear(&mut self) {
        self.running.clear();
        self.queue.clear();
    }

    /// Runs `pass` to its end, the jobs under way going on meanwhile.
    async fn beside<T>(&mut self, pass: impl Future<Output = T>) -> T {
        let mut pass = std::pin::pin!(pass);
        loop {
            tokio::select! {
                // In a fixed order, so that a seed replays the same run.
                biased;
                result = &mut pass => return result,
                Some((job, outcome)) = self.running.next(), if !self.running.is_empty() => {
                    self.queue.done(&job, outcome);
                }
            }
        }
    }

    /// [`wait_for_wake`], the jobs going on meanwhile; an install that ends wakes the
    /// controller (it wrote what the next pass must see), a pre-pull does not (it wrote
    /// nothing, and the machine's turn comes by itself).
    async fn beside_wait(&mut self, sim: &SimCluster, requeue: Option<Timestamp>, not_before: Timestamp) -> bool {
        let mut requeue = requeue;
        if sim.with_world_untouched(|w| w.config.realism.wake == Wake::Oracle) {
            // Under the oracle nothing a job awaits takes time, and the wait below is over
            // at its first poll: the jobs run first, until each waits on the world (issue
            // 29 item 6: no lifecycle install was ever made under the oracle).
            while let Some(Some((job, outcome))) = self.running.next().now_or_never() {
                if matches!(job, Job::Install { .. }) {
                    requeue = Some(sim.now());
                }
                self.queue.done(&job, outcome);
            }
        }
        let waiting = wait_for_wake(sim, requeue, not_before);
        let mut waiting = std::pin::pin!(waiting);
        // A controller killed in a job's call is a process gone: it is restarted within a
        // second, not when its jobs next end (an install's stream outlived its process by
        // minutes, and the new one found the install over, unrecorded).
        let crashes = sim.with_world_untouched(|w| w.config.has(Fault::ControllerCrash));
        let mut dead_check = std::pin::pin!(tokio::time::sleep(DEAD_CHECK));
        // Whether nothing in the world will wake the controller: then only a job's end can.
        let mut silent = false;
        loop {
            let finished = if silent {
                tokio::select! {
                    biased;
                    done = self.running.next() => done,
                    () = &mut dead_check, if crashes => {
                        if sim.with_world_untouched(|w| w.crash.dead) {
                            return true;
                        }
                        dead_check.set(tokio::time::sleep(DEAD_CHECK));
                        continue;
                    }
                }
            } else {
                tokio::select! {
                    // In a fixed order, so that a seed replays the same run.
                    biased;
                    woken = &mut waiting => {
                        if woken {
                            return true;
                        }
                        silent = true;
                        continue;
                    }
                    done = self.running.next(), if !self.running.is_empty() => done,
                    () = &mut dead_check, if crashes && !self.running.is_empty() => {
                        if sim.with_world_untouched(|w| w.crash.dead) {
                            return true;
                        }
                        dead_check.set(tokio::time::sleep(DEAD_CHECK));
                        continue;
                    }
                }
            };
            let Some((job, outcome)) = finished else { return false };
            let wakes = matches!(job, Job::Install { .. });
            self.queue.done(&job, outcome);
            if wakes {
                // As a requeue for now: the next pass, once the pass interval allows it.
                waiting.set(wait_for_wake(sim, Some(sim.now()), not_before));
                silent = false;
            }
        }
    }
}

/// What the preflight gate held back at the last pass: traced on each change, and counted
/// in machine-seconds.
struct PreflightWatch {
    blocked: BTreeMap<String, String>,
    since: Timestamp,
}

impl PreflightWatch {
    fn new(now: Timestamp) -> Self {
        Self { blocked: BTreeMap::new(), since: now }
    }

    /// The pass at `now` held back `blocked` (machine, blockers) and found `cleared` clear
    /// (or started them); the others stand as they were.
    fn observe(&mut self, sim: &SimCluster, now: Timestamp, blocked: &[(String, String)], cleared: &[String]) {
        let mut next = self.blocked.clone();
        next.retain(|machine, _| !cleared.contains(machine));
        next.extend(blocked.iter().cloned());
        sim.with_world_untouched(|w| {
            let held = now.saturating_since(self.since).as_millis() * self.blocked.len() as u128;
            w.counters.preflight_wait_ms += u64::try_from(held).unwrap_or(u64::MAX);
            for (machine, blockers) in &next {
                if self.blocked.get(machine) != Some(blockers)
                    && let Some(i) = w.node_index(machine)
                {
                    let why = ("PreflightBlocked".to_owned(), blockers.clone());
                    w.record_why(i, TraceKind::PreflightBlocked, Some(why));
                }
            }
            for machine in self.blocked.keys().filter(|m| !next.contains_key(*m)) {
                if let Some(i) = w.node_index(machine) {
                    w.record(i, TraceKind::PreflightClear);
                }
            }
        });
        self.blocked = next;
        self.since = now;
    }
}

/// Waits, in virtual time, until the controller is woken: its requeue time, or a watch
/// event reaching it (under [`Wake::Oracle`], any change of the world). The world moves on
/// meanwhile, change by change. `false` when nothing will ever wake it.
pub(crate) async fn wait_for_wake(sim: &SimCluster, requeue: Option<Timestamp>, not_before: Timestamp) -> bool {
    loop {
        let (now, wake, change, oracle) = sim.with_world_untouched(|w| {
            w.sync_clock();
            let oracle = w.config.realism.wake == Wake::Oracle;
            if oracle {
                // No clock runs under the oracle: what fell due at this instant (a change
                // the last pass made, as a Node shown NotReady at once) is applied here, or
                // it stays due, and the controller is woken by it for ever (issue 29 item 6).
                let now = w.now;
                w.advance_to(now);
            }
            let change = w.next_event_at();
            let wake = if oracle { change } else { w.next_delivery() };
            (w.now, wake, change, oracle)
        });
        // The oracle is woken at the instant of each change: no pass interval.
        let not_before = if oracle { now } else { not_before };
        let target = Timestamp::min_opt(requeue, wake).map(|t| t.max(not_before));
        if target.is_some_and(|t| t <= now) {
            return true;
        }
        // Nothing wakes the controller before the world's next change: move to it (a
        // change may send a watch event).
        let Some(next) = Timestamp::min_opt(target, change) else { return false };
        let next = next.max(now.saturating_add(std::time::Duration::from_millis(1)));
        if oracle {
            // The oracle is woken by the change itself.
            sim.with_world_untouched(|w| w.advance_to(next));
            return true;
        } else {
            tokio::time::sleep(next.saturating_since(now)).await;
            sim.with_world_untouched(World::sync_clock);
        }
    }
}

/// The identity the main job's removal of machine `name` goes by (its cordon names it).
#[must_use]
pub fn removal_identity(name: &str) -> String {
    format!("rollout/remove-{name}")
}

/// Removes machine `name` through the removal path, at most `max_passes` passes. Ends
/// `Completed` when the Node is deleted, `Paused` when the removal failed.
pub async fn run_removal(sim: &SimCluster, name: &str, config: &ExecutorConfig, max_passes: usize) -> RunEnd {
    sim.with_world_untouched(World::start_clock);
    // Only for the pass interval: a removal's pass is `remove_machine`, not a reconcile.
    let memory = PassMemory::new();
    for _ in 0..max_passes {
        sim.with_world_untouched(|w| {
            w.sync_clock();
            w.take_deliveries();
            w.counters.passes += 1;
        });
        let _ = memory.defer_pass(sim.now(), config.pass_interval);
        let store = sim.snapshot_store();
        let ex = Executor { snapshots: Some(store.as_ref()), ..sim.executor(config) };
        let now = sim.now();
        let outcome = match sim.machine(name).await {
            Ok(Some(machine)) => {
                let control_planes: Vec<ControlPlane> = sim.with_world_untouched(|w| {
                    w.nodes
                        .iter()
                        .filter(|n| n.role == MachineRole::ControlPlane && !n.removed)
                        .map(|n| ControlPlane { address: n.address.clone(), node: n.name.clone() })
                        .collect()
                });
                // One machine, driven alone: the runner is its pass, advancing only it.
                let decision = ichor_upgrade_core::rollout::Decision::advancing([machine.name.clone()]);
                let Some(advancing) = Advancing::of(&machine.name, &decision) else {
                    unreachable!("a decision that advances a machine gives the authority to advance it")
                };
                remove_machine(&ex, &advancing, &removal_identity(name), &machine, &control_planes)
                    .await
                    .unwrap_or_else(|e| e.outcome(ex.retry_at()))
            }
            Ok(None) => return RunEnd::Stalled(Phase::Pending),
            Err(_) => {
                MachineOutcome::Waiting { reason: "ApiUnreachable".into(), message: String::new(), recheck_at: None }
            }
        };
        let requeue = match outcome {
            MachineOutcome::Converged => return RunEnd::Completed,
            MachineOutcome::Failed { reason, message } => {
                sim.with_world_untouched(|w| {
                    if let Some(i) = w.node_index(name).or_else(|| w.storage_node(name)) {
                        w.record_why(i, TraceKind::Failed, Some((reason, message)));
                    }
                });
                return RunEnd::Paused;
            }
            MachineOutcome::Progressed { .. } => Some(now),
            MachineOutcome::Waiting { recheck_at, .. } => recheck_at.or(Some(now.saturating_add(ERROR_BACKOFF))),
        };
        memory.pass_ended(sim.now(), requeue);
        let not_before = memory.next_pass_at(config.pass_interval).unwrap_or(now);
        if !wait_for_wake(sim, requeue, not_before).await {
            return RunEnd::Stalled(Phase::Pending);
        }
    }
    RunEnd::PassBound
}

/// Whether the run is over: completed, refused, or paused with nothing in flight.
pub(crate) fn finished(sim: &SimCluster, name: &str, phase: &Phase) -> Option<RunEnd> {
    if sim.with_world_untouched(|w| w.operations.get(name).is_some_and(|op| op.finalized)) {
        return Some(RunEnd::Deleted);
    }
    match phase {
        Phase::Completed => Some(RunEnd::Completed),
        Phase::Refused(_) => Some(RunEnd::Refused),
        // A person's pause the world lifts later (the fault `pause-requested-during-install`)
        // is waited out.
        Phase::Paused(PauseReason::Requested { .. })
            if sim.with_world_untouched(|w| matches!(w.stop_during_install, StopDuringInstall::PauseRequested(..))) =>
        {
            None
        }
        Phase::Paused(_) => sim.with_world_untouched(|w| {
            let upgrading = w.nodes.iter().any(|n| !n.removed && n.upgrading());
            let in_flight = w
                .operations
                .get(name)
                .is_some_and(|op| op.info.status.machines.values().any(|r| r.state == RecordState::InProgress));
            (!upgrading && !in_flight).then_some(RunEnd::Paused)
        }),
        Phase::Pending | Phase::Progressing | Phase::Waiting(_) => None,
    }
}
