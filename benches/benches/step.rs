//! One machine decision of the Talos executor's step, in the states a machine spends most
//! passes in, with the heap allocations of one decision counted.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::StorageObservation;
use ichor_upgrade_core::machine::talos::{StepInput, UpgradeTarget, step};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::{
    MachineSpec, MachineStage, NodeObservation, StepTimeouts, TalosObservation,
};
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, UpgradeMarker};
use ichor_upgrade_core::versions::TalosVersion;

struct Case {
    machine: MachineSpec,
    target: UpgradeTarget,
    node: NodeObservation,
    talos: TalosObservation,
    conditions: Conditions,
    storage: StorageObservation,
    timeouts: StepTimeouts,
}

fn case(rebooting: bool) -> Case {
    let target = UpgradeTarget {
        version: TalosVersion::parse("v1.14.4").unwrap(),
        schematic: Some("376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".into()),
        platform: "metal".into(),
        kubernetes_version: "1.34.1".into(),
    };
    let mut conditions = Conditions::new();
    if rebooting {
        let marker = UpgradeMarker {
            target: target.version.clone(),
            boot_id: "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11".into(),
            call_deadline: Timestamp::from_unix_secs(1_600),
            node: Some("worker-1".into()),
        };
        conditions.upsert(
            ConditionUpdate::new(TALOS_UPGRADE, ConditionStatus::True, "UpgradeRequested", marker.to_string()),
            Timestamp::from_unix_secs(1_000),
        );
    }
    Case {
        machine: MachineSpec { name: "worker-7".into(), role: MachineRole::Worker },
        target,
        node: NodeObservation {
            name: "worker-1".into(),
            ready: !rebooting,
            os_image: "Talos (v1.14.3)".into(),
            boot_id: "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11".into(),
            schematic: None,
        },
        talos: TalosObservation::Answered {
            stage: if rebooting { MachineStage::Upgrading } else { MachineStage::Running },
        },
        conditions,
        storage: StorageObservation::default(),
        timeouts: StepTimeouts::default(),
    }
}

fn decide(c: &Case) -> ichor_upgrade_core::machine::talos::Action {
    step(&StepInput {
        machine: &c.machine,
        target: &c.target,
        node: Some(&c.node),
        talos: &c.talos,
        conditions: &c.conditions,
        storage: &c.storage,
        etcd_member: None,
        authority: &ichor_upgrade_core::rollout::CallAuthority::Granted,
        timeouts: &c.timeouts,
        now: Timestamp::from_unix_secs(1_200),
    })
}

fn allocations_per_decision(c: &Case) -> f64 {
    const N: u64 = 10_000;
    let info = allocation_counter::measure(|| {
        for _ in 0..N {
            let _ = black_box(decide(black_box(c)));
        }
    });
    info.count_total as f64 / N as f64
}

fn machine_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("step");
    group.measurement_time(Duration::from_secs(3));
    for (name, rebooting) in [("waiting_for_reboot", true), ("deciding_the_call", false)] {
        let case = case(rebooting);
        eprintln!("step/{name}: {:.1} allocations per decision", allocations_per_decision(&case));
        group.bench_function(name, |b| b.iter(|| decide(black_box(&case))));
    }
    group.finish();
}

criterion_group!(benches, machine_decision);
criterion_main!(benches);
