//! The etcd snapshot before the first control plane, on the simulated cluster (issue 14).

use std::sync::Arc;

use ichor_executor::ExecutorConfig;
use ichor_executor::snapshot::{SnapshotSink, SnapshotStore, SnapshotStoreError};
use ichor_executor::talos_api::TalosApi;
use ichor_sim::snapshot::{MemoryStore, snapshot_size};
use ichor_sim::{CLUSTER, Fault, RunEnd, SimCluster, SimConfig, TraceKind, run_operation};
use ichor_upgrade_core::etcd::snapshot::SnapshotState;
use ichor_upgrade_core::operation::{OperationSpec, RESUME_ANNOTATION, SnapshotMode};
use ichor_upgrade_core::status::{PauseReason, Phase};
use ichor_upgrade_core::versions::TalosVersion;
use sha2::{Digest, Sha256};

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

fn sim(cps: usize, workers: usize, faults: &[Fault]) -> (SimCluster, MemoryStore) {
    let config = SimConfig::new(cps, workers, v("v1.14.3"), v("v1.14.4")).with_seed(11).with_faults(faults.to_vec());
    let sim = SimCluster::new(config);
    let store = MemoryStore::default();
    sim.set_snapshot_store(Arc::new(store.clone()));
    (sim, store)
}

async fn run(sim: &SimCluster) -> RunEnd {
    run_operation(sim, "upgrade", &ExecutorConfig::default(), 5_000, |_| {}).await
}

fn recorded(sim: &SimCluster) -> Option<SnapshotState> {
    sim.read_world(|w| w.operations["upgrade"].info.status.etcd_snapshot.clone())
}

#[tokio::test(start_paused = true)]
async fn one_snapshot_is_streamed_stored_and_recorded_before_the_first_control_plane_call() {
    let (sim, store) = sim(3, 4, &[]);
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 2));
    assert_eq!(run(&sim).await, RunEnd::Completed);

    let Some(SnapshotState::Taken(record)) = recorded(&sim) else {
        panic!("no snapshot recorded: {:?}", recorded(&sim))
    };
    let size = snapshot_size(7);
    assert_eq!(record.size, size as u64);
    let prefix = format!("memory://{CLUSTER}-etcd-before-v1.14.4-");
    assert!(record.location.starts_with(&prefix) && record.location.ends_with("Z.db"), "{}", record.location);
    assert_eq!(store.sizes().into_values().collect::<Vec<_>>(), vec![size], "one whole snapshot in the store");
    // The hash recorded is the hash of what a control plane serves.
    let again = SimCluster::new(SimConfig::new(3, 4, v("v1.14.3"), v("v1.14.4")).with_seed(11));
    let address = again.read_world(|w| w.nodes[0].address.clone());
    let mut stream = again.etcd_snapshot(&address).await.unwrap();
    let mut hash = Sha256::new();
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        hash.update(chunk.unwrap());
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(record.sha256, hex);

    sim.read_world(|w| {
        let at = |kind: TraceKind, role: &str| w.trace.iter().position(|e| e.event == kind && e.role == role);
        let snapshot = w.trace.iter().position(|e| e.event == TraceKind::EtcdSnapshot).expect("etcd-snapshot traced");
        let first_cp_call = at(TraceKind::UpgradeCall, "control-plane").expect("a control plane upgraded");
        assert!(snapshot < first_cp_call, "the snapshot comes before any control plane's Upgrade call");
        assert_eq!(w.trace.iter().filter(|e| e.event == TraceKind::EtcdSnapshot).count(), 1, "one snapshot");
        assert_eq!(w.trace[snapshot].node, record.node);
    });
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_that_fails_pauses_before_any_upgrade_call_and_a_resume_takes_it_again() {
    let (sim, store) = sim(3, 2, &[Fault::SnapshotFails]);
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    assert_eq!(run(&sim).await, RunEnd::Paused);
    sim.read_world(|w| {
        assert_eq!(w.counters.upgrade_calls, 0, "no Upgrade call at all");
        let phase = &w.operations["upgrade"].info.status.phase;
        assert!(
            matches!(phase, Phase::Paused(PauseReason::EtcdSnapshotFailed { reason }) if reason.contains("snapshot-fails")),
            "{phase:?}"
        );
    });
    assert!(store.sizes().is_empty(), "a partial snapshot is never kept: {:?}", store.sizes());
    assert!(matches!(recorded(&sim), Some(SnapshotState::Failed { .. })));
    // Still failing: a resume tries again and pauses again, still with no call.
    sim.annotate_operation("upgrade", RESUME_ANNOTATION, "r1");
    assert_eq!(run(&sim).await, RunEnd::Paused);
    assert_eq!(sim.read_world(|w| w.counters.upgrade_calls), 0);
    // Fixed, resumed: taken, and the rollout completes.
    sim.with_world(|w| w.config.faults.retain(|f| *f != Fault::SnapshotFails));
    sim.annotate_operation("upgrade", RESUME_ANNOTATION, "r2");
    assert_eq!(run(&sim).await, RunEnd::Completed);
    assert!(matches!(recorded(&sim), Some(SnapshotState::Taken(_))));
    assert_eq!(store.sizes().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn skip_takes_none_and_a_cluster_with_no_control_plane_to_upgrade_needs_none() {
    let (sim, store) = sim(3, 2, &[Fault::SnapshotFails]);
    let spec = OperationSpec { etcd_snapshot: Some(SnapshotMode::Skip), ..OperationSpec::talos("v1.14.4", 1) };
    sim.create_operation("upgrade", spec);
    assert_eq!(run(&sim).await, RunEnd::Completed);
    assert_eq!(recorded(&sim), None);
    assert!(store.sizes().is_empty());
    sim.read_world(|w| assert!(!w.trace.iter().any(|e| e.event == TraceKind::EtcdSnapshot)));
}

#[tokio::test(start_paused = true)]
async fn a_controller_killed_at_random_records_exactly_one_snapshot_and_never_a_partial_one() {
    for seed in 1..=12 {
        let config =
            SimConfig::new(3, 3, v("v1.14.3"), v("v1.14.4")).with_seed(seed).with_faults([Fault::ControllerCrash]);
        let sim = SimCluster::new(config);
        let store = MemoryStore::default();
        sim.set_snapshot_store(Arc::new(store.clone()));
        sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
        assert_eq!(run(&sim).await, RunEnd::Completed, "seed {seed}");
        let Some(SnapshotState::Taken(record)) = recorded(&sim) else { panic!("seed {seed}: none recorded") };
        let name = record.location.trim_start_matches("memory://");
        // A crash between the store and the record leaves a whole orphan at most; the
        // record always names a whole snapshot.
        assert_eq!(store.sizes().get(name), Some(&snapshot_size(6)), "seed {seed}: {:?}", store.sizes());
        assert!(store.sizes().values().all(|s| *s == snapshot_size(6)), "seed {seed}: a partial object");
    }
}

/// A store that kills the controller right after its first snapshot is stored whole, before
/// the pass can record it: the worst moment, a whole object no status names.
#[derive(Debug)]
struct KillAfterFirstSnapshot {
    inner: MemoryStore,
    sim: Arc<SimCluster>,
    killed: Arc<std::sync::atomic::AtomicBool>,
}

struct KillingSink {
    inner: Box<dyn SnapshotSink>,
    sim: Arc<SimCluster>,
    killed: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl SnapshotStore for KillAfterFirstSnapshot {
    async fn begin(&self, name: &str) -> Result<Box<dyn SnapshotSink>, SnapshotStoreError> {
        let inner = self.inner.begin(name).await?;
        Ok(Box::new(KillingSink { inner, sim: Arc::clone(&self.sim), killed: Arc::clone(&self.killed) }))
    }

    fn describe(&self) -> String {
        "memory (kills the controller once)".to_owned()
    }
}

#[async_trait::async_trait]
impl SnapshotSink for KillingSink {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), SnapshotStoreError> {
        self.inner.write(chunk).await
    }

    async fn finish(self: Box<Self>) -> Result<String, SnapshotStoreError> {
        let location = self.inner.finish().await?;
        if !self.killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // The next API call (the status write recording it) never happens.
            self.sim.with_world(|w| w.arm_crash(1, true));
        }
        Ok(location)
    }

    async fn abort(self: Box<Self>) {
        self.inner.abort().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_controller_killed_between_the_snapshot_and_its_record_takes_it_again_before_any_control_plane() {
    let sim = Arc::new(SimCluster::new(SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4")).with_seed(5)));
    let memory = MemoryStore::default();
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let store = KillAfterFirstSnapshot { inner: memory.clone(), sim: Arc::clone(&sim), killed: Arc::clone(&killed) };
    sim.set_snapshot_store(Arc::new(store));
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    assert_eq!(run(&sim).await, RunEnd::Completed);
    assert!(killed.load(std::sync::atomic::Ordering::SeqCst));

    let Some(SnapshotState::Taken(record)) = recorded(&sim) else { panic!("none recorded") };
    let stored = memory.sizes();
    // The retake, in the same virtual second, has the same name: it replaced the orphan
    // whole (a later retake would sit beside it).
    assert!(!stored.is_empty() && stored.values().all(|s| *s == snapshot_size(5)), "{stored:?}");
    let name = record.location.trim_start_matches("memory://");
    assert_eq!(stored.get(name), Some(&snapshot_size(5)), "the record names a whole snapshot");
    sim.read_world(|w| {
        assert_eq!(w.counters.restarts, 1);
        let snapshots: Vec<f64> = w.trace.iter().filter(|e| e.event == TraceKind::EtcdSnapshot).map(|e| e.t).collect();
        let first_cp_call = w
            .trace
            .iter()
            .find(|e| e.event == TraceKind::UpgradeCall && e.role == "control-plane")
            .map(|e| e.t)
            .unwrap();
        assert_eq!(snapshots.len(), 2, "taken again after the restart");
        assert!(snapshots.iter().all(|t| *t <= first_cp_call), "{snapshots:?} vs {first_cp_call}");
    });
}

/// A store whose snapshot ends as control plane cp-3's Node turns NotReady (shown at once):
/// the gate and the Nodes the pass read before the snapshot are stale by then.
#[derive(Debug)]
struct NotReadyAfterSnapshot {
    inner: MemoryStore,
    sim: Arc<SimCluster>,
}

struct NotReadySink {
    inner: Box<dyn SnapshotSink>,
    sim: Arc<SimCluster>,
}

#[async_trait::async_trait]
impl SnapshotStore for NotReadyAfterSnapshot {
    async fn begin(&self, name: &str) -> Result<Box<dyn SnapshotSink>, SnapshotStoreError> {
        let inner = self.inner.begin(name).await?;
        Ok(Box::new(NotReadySink { inner, sim: Arc::clone(&self.sim) }))
    }

    fn describe(&self) -> String {
        "memory (cp-3 NotReady as the snapshot ends)".to_owned()
    }
}

#[async_trait::async_trait]
impl SnapshotSink for NotReadySink {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), SnapshotStoreError> {
        self.inner.write(chunk).await
    }

    async fn finish(self: Box<Self>) -> Result<String, SnapshotStoreError> {
        let location = self.inner.finish().await?;
        self.sim.with_world(|w| {
            let i = w.nodes.iter().position(|n| n.name == "cp-3").expect("cp-3");
            let until = w.now.saturating_add(std::time::Duration::from_secs(600));
            w.nodes[i].ready = false;
            w.nodes[i].view.ready = false;
            w.nodes[i].not_ready_until = Some(until);
        });
        Ok(location)
    }

    async fn abort(self: Box<Self>) {
        self.inner.abort().await;
    }
}

/// Issue 29, item 9: the gate and Node readiness were gathered before the snapshot (up to
/// 30 minutes) and the first control plane was authorised from that verdict. Now the pass
/// that records the snapshot ends there; the next one reads the gate and the Nodes again.
#[tokio::test(start_paused = true)]
async fn the_first_control_plane_waits_for_a_control_plane_that_went_not_ready_during_the_snapshot() {
    let sim = Arc::new(SimCluster::new(SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4")).with_seed(5)));
    let store = NotReadyAfterSnapshot { inner: MemoryStore::default(), sim: Arc::clone(&sim) };
    sim.set_snapshot_store(Arc::new(store));
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    assert_eq!(run(&sim).await, RunEnd::Completed);
    sim.read_world(|w| {
        let snapshot = w.trace.iter().find(|e| e.event == TraceKind::EtcdSnapshot).map(|e| e.t).expect("a snapshot");
        let back = w
            .trace
            .iter()
            .find(|e| e.node == "cp-3" && e.event == TraceKind::Ready && e.t > snapshot)
            .map(|e| e.t)
            .expect("cp-3 Ready again");
        let first_cp_call = w
            .trace
            .iter()
            .find(|e| e.event == TraceKind::UpgradeCall && e.role == "control-plane")
            .map(|e| e.t)
            .expect("a control plane's call");
        assert!(first_cp_call > back, "first control plane called at {first_cp_call} s, cp-3 Ready again at {back} s");
    });
}
