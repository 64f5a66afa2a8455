//! A whole simulated rollout of 3 control planes and 200 workers at maxUnavailable 10,
//! through the real engine and drivers, with its makespan against the physical bound and
//! an ideal scheduler printed once.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ichor_executor::ExecutorConfig;
use ichor_sim::{RunEnd, SimCluster, SimConfig, run_operation};
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::versions::TalosVersion;

fn rollout(seed: u64) -> SimCluster {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    let sim = SimCluster::new(SimConfig::new(3, 200, v("v1.14.3"), v("v1.14.4")).with_seed(seed));
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 10));
    let runtime = ichor_sim::runtime();
    let end = runtime.block_on(run_operation(&sim, "upgrade", &ExecutorConfig::default(), 1_000_000, |_| {}));
    assert_eq!(end, RunEnd::Completed);
    sim
}

fn simulated_rollout(c: &mut Criterion) {
    for seed in 1..=5 {
        let r = rollout(seed).report(10);
        eprintln!(
            "seed {seed}: makespan {:.0} s, lower bound {:.0} s (x{:.4}), ideal scheduler {:.0} s (x{:.4}); {} Kubernetes writes, {} Talos calls",
            r.makespan_s,
            r.lower_bound_s,
            r.makespan_s / r.lower_bound_s,
            r.ideal_s,
            r.makespan_s / r.ideal_s,
            r.kube_writes,
            r.talos_calls
        );
    }
    let mut group = c.benchmark_group("simulated_rollout");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.bench_function("3_plus_200_at_10", |b| b.iter(|| rollout(1)));
    group.finish();
}

criterion_group!(benches, simulated_rollout);
criterion_main!(benches);
