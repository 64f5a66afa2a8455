//! One rollout-engine decision over clusters of 10 to 5,000 machines.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ichor_benches::{mid_rollout, operation};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::rollout::{ComponentsVerdict, EtcdVerdict, RolloutConfig, RolloutInput, decide};

fn rollout_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("rollout_decision");
    let config = RolloutConfig::default();
    for machines in [10usize, 100, 1_000, 5_000] {
        let cluster = mid_rollout(machines - 3, 10);
        let (op, lease) = operation(10);
        group.throughput(Throughput::Elements(machines as u64));
        group.bench_with_input(BenchmarkId::from_parameter(machines), &cluster, |b, cluster| {
            b.iter(|| {
                decide(black_box(&RolloutInput {
                    kubernetes: None,
                    operation: &op,
                    release_talos_version: "v1.14.4",
                    releases: ichor_upgrade_core::releases::KnownReleases::built_in(),
                    kubernetes_version: "1.34.1",
                    lease: Some(&lease),
                    machines: cluster,
                    unaccounted_nodes: &[],
                    etcd: &EtcdVerdict::Healthy,
                    components: &ComponentsVerdict::all_ready(),
                    preflight: &ichor_upgrade_core::rollout::PreflightVerdict::Off,
                    windows: None,
                    gates: None,
                    config: &config,
                    now: Timestamp::from_unix_secs(1_010),
                }))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, rollout_decision);
criterion_main!(benches);
