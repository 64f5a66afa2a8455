//! Maintenance windows on the simulated cluster (issue 56 item 3): through the real
//! engine and drivers, every machine starts inside a window, with its p90 turn ending
//! before the window does, and none is stopped by a window's end.

use std::collections::BTreeSet;
use std::time::Duration;

use ichor_executor::ExecutorConfig;
use ichor_executor::calendar::calendar;
use ichor_sim::{RunEnd, SimCluster, SimConfig, TraceKind, run_operation};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::plan::models;
use ichor_upgrade_core::status::{Phase, WaitReason};
use ichor_upgrade_core::versions::TalosVersion;
use ichor_upgrade_core::window::{MaintenanceSpec, WindowSpec};

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

/// What a machine's turn begins with: the first thing that takes it out of service.
const STARTS: [TraceKind; 5] =
    [TraceKind::EvacuationStart, TraceKind::Cordon, TraceKind::Drain, TraceKind::UpgradeCall, TraceKind::InstallStart];

/// How long from a pass's decision to its first action on the machine, at most, in the
/// simulator (the reads and writes between them take virtual time).
const DECISION_TO_ACTION: Duration = Duration::from_secs(60);

/// Twelve minutes every four hours in Berlin: two or three turns fit in each.
fn short_windows() -> MaintenanceSpec {
    MaintenanceSpec {
        windows: vec![WindowSpec {
            schedule: "0 */4 * * *".into(),
            duration: "12m".into(),
            time_zone: Some("Europe/Berlin".into()),
        }],
        blackouts: Vec::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn every_machine_starts_inside_a_window_its_p90_turn_fits_in() {
    let config = SimConfig::new(3, 6, v("v1.14.3"), v("v1.14.4")).with_seed(11).with_maintenance(short_windows());
    let mut executor = ExecutorConfig::default();
    executor.turn_p90 = models(None, &config.plan_defaults(executor.pass_interval)).p90();
    let p90 = executor.turn_p90;
    let sim = SimCluster::new(config);
    let start = sim.now();
    let calendar = calendar(&short_windows(), start).expect("the windows read");
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 2));
    let mut waits = BTreeSet::new();
    let end = run_operation(&sim, "upgrade", &executor, 50_000, |sim| {
        sim.read_world(|w| {
            if let Some(Phase::Waiting(wait)) = w.operations.get("upgrade").map(|o| &o.info.status.phase) {
                waits.insert(match wait {
                    WaitReason::OutsideWindow { .. } => "OutsideWindow",
                    WaitReason::WouldOverrunWindow { .. } => "WouldOverrunWindow",
                    _ => "other",
                });
            }
        });
    })
    .await;
    assert_eq!(end, RunEnd::Completed);
    assert!(waits.contains("OutsideWindow") && waits.contains("WouldOverrunWindow"), "{waits:?}");
    sim.read_world(|w| {
        let mut used = BTreeSet::new();
        for node in &w.nodes {
            assert_eq!(node.version, v("v1.14.4"), "{}", node.name);
            let began = w.trace.iter().find(|e| e.node == node.name && STARTS.contains(&e.event)).expect("a turn");
            let at = start.saturating_add(Duration::from_secs_f64(began.t));
            let span = calendar
                .span_at(at)
                .unwrap_or_else(|| panic!("{} started at {} outside every window", node.name, at.rfc3339()));
            let turn = if node.role == MachineRole::ControlPlane { p90.control_plane } else { p90.worker };
            let decided = Timestamp::from_unix_millis(at.unix_millis() - DECISION_TO_ACTION.as_millis() as i64);
            assert!(
                decided.saturating_add(turn) <= span.end,
                "{} started at {}: its p90 of {turn:?} runs past the window's end at {}",
                node.name,
                at.rfc3339(),
                span.end.rfc3339()
            );
            used.insert(span);
        }
        assert!(used.len() >= 3, "nine turns of about four minutes need several twelve-minute windows: {used:?}");
    });
}
