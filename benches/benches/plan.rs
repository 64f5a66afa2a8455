//! A plan of an upgrade (issue 33): 200 runs of the engine's schedule over 3 control
//! planes and 1,000 or 5,000 workers, turns drawn from a recorded history, at
//! `maxUnavailable` 20. The issue asks for a dry-run plan of 1,000 machines in seconds.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::plan::{
    DEFAULT_RUNS, EVACUATION, PlanInput, PlanMachine, RecordedTurn, StorageRate, TurnModel, plan,
};

fn machines(workers: usize) -> Vec<PlanMachine> {
    let cp = (1..=3).map(|i| PlanMachine {
        node: format!("cp-{i}"),
        role: MachineRole::ControlPlane,
        held: None,
        bytes: Some(0),
    });
    // Workers with storage, 1 to 40 GiB each.
    let w = (1..=workers).map(|i| PlanMachine {
        node: format!("worker-{i}"),
        role: MachineRole::Worker,
        held: None,
        bytes: Some((1 + (i as u64 % 40)) << 30),
    });
    cp.chain(w).collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    group.measurement_time(Duration::from_secs(10)).sample_size(20);
    for workers in [1_000, 5_000] {
        let machines = machines(workers);
        // A history of the same size: every worker's turn recorded once, with its phases
        // (an evacuation of 60 s, the install, the reboot, the rest).
        let turns: Vec<RecordedTurn> = (0..workers)
            .map(|i| {
                let seconds = 150.0 + f64::from(u32::try_from(i % 97).unwrap());
                let phases =
                    [(EVACUATION, 60.0), ("installing", 40.0), ("rebooting", seconds - 110.0), ("verifying", 10.0)];
                RecordedTurn { seconds, phases: phases.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect() }
            })
            .collect();
        let input = PlanInput {
            machines: &machines,
            control_plane: TurnModel::Recorded([230.0, 250.0, 270.0].map(RecordedTurn::of).to_vec()),
            worker: TurnModel::Recorded(turns),
            lead_s: 12.0,
            reaction_s: 1.5,
            storage: Some(StorageRate { bytes_per_s: 100.0 * 1024.0 * 1024.0 }),
            max_unavailable: 20,
            runs: DEFAULT_RUNS,
            seed: 1,
        };
        group.bench_function(format!("3 + {workers}, {DEFAULT_RUNS} runs"), |b| b.iter(|| plan(black_box(&input))));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
