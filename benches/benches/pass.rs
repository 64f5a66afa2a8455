//! One reconcile pass over a 5,005-machine cluster in mid-rollout, through the real engine
//! and drivers on the simulated cluster (oracle model: no virtual latency, so the time is
//! the engine's and the simulator's own work), and the heap it takes per machine.
//!
//! ```sh
//! cargo bench -p ichor-benches --bench pass
//! ```

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ichor_executor::{Executor, ExecutorConfig, PassMemory, reconcile_with};
use ichor_sim::{Realism, RunEnd, SimCluster, SimConfig, run_operation};
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::versions::TalosVersion;

const CONTROL_PLANES: usize = 5;
const WORKERS: usize = 5_000;

/// A cluster part-way through its rollout: the control planes and some waves of workers done.
fn mid_rollout(runtime: &tokio::runtime::Runtime) -> SimCluster {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    let config = SimConfig::new(CONTROL_PLANES, WORKERS, v("v1.14.3"), v("v1.14.4"))
        .with_seed(42)
        .with_realism(Realism::oracle());
    let sim = SimCluster::new(config);
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 100));
    let end = runtime.block_on(run_operation(&sim, "upgrade", &ExecutorConfig::default(), 1_500, |_| {}));
    assert_eq!(end, RunEnd::PassBound, "still under way");
    sim
}

fn pass(c: &mut Criterion) {
    let runtime = ichor_sim::runtime();
    let sim = mid_rollout(&runtime);
    let config = ExecutorConfig::default();
    let ex = Executor {
        talos: &sim,
        kube: &sim,
        storage: &sim,
        clock: &sim,
        config: &config,
        snapshots: None,
        background: None,
    };
    let memory = PassMemory::new();
    runtime.block_on(reconcile_with(&ex, "upgrade", &memory)).unwrap();
    let (converged, in_flight) = sim.with_world(|w| {
        let status = &w.operations["upgrade"].info.status;
        (status.converged, status.machines.len())
    });
    let machines = CONTROL_PLANES + WORKERS;
    let info = allocation_counter::measure(|| {
        runtime.block_on(reconcile_with(&ex, "upgrade", &memory)).unwrap();
    });
    #[allow(clippy::cast_precision_loss)]
    let per_machine = info.bytes_max as f64 / machines as f64;
    eprintln!(
        "one pass over {machines} machines ({converged} converged, {in_flight} under way, {} remembered waiting): \
         peak heap {} B ({per_machine:.0} B per machine), {} allocations",
        memory.waiting(),
        info.bytes_max,
        info.count_total
    );
    let mut group = c.benchmark_group("pass");
    group.sample_size(20).measurement_time(Duration::from_secs(10));
    group.bench_function("5005_machines_mid_rollout", |b| {
        b.iter(|| runtime.block_on(reconcile_with(&ex, "upgrade", &memory)).unwrap());
    });
    group.finish();
}

criterion_group!(benches, pass);
criterion_main!(benches);
