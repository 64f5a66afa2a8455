use super::*;
use ichor_adapters::kubernetes::crd::{
    MachineStep, Role, TalosMachineSpec, TalosMachineStatus, TalosOperationSpec, TalosOperationStatus,
};
use ichor_upgrade_core::labels::LabelSelector;
use ichor_upgrade_core::preflight::{BudgetFacts, PodFacts};
use serde_json::json;

pub(super) fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

fn condition(type_: &str, secs: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: type_.into(),
        message: String::new(),
        last_transition_time: at(secs),
        observed_generation: None,
    }
}

/// An upgrade of `prod` made at `made`, Completed at `completed`.
pub(super) fn operation(name: &str, made: i64, completed: Option<i64>, dry_run: bool) -> Arc<TalosOperation> {
    let mut o = crate::fixtures::operation(name, if completed.is_some() { "Completed" } else { "Progressing" }, "x");
    o.metadata.creation_timestamp = Some(at(made));
    o.metadata.uid = Some(format!("uid-{name}"));
    o.metadata.generation = Some(1);
    o.spec.dry_run = dry_run;
    if let Some(end) = completed {
        o.status.as_mut().unwrap().conditions.push(condition("Completed", end));
    }
    Arc::new(o)
}

/// A machine of `prod` whose history is an upgrade called at `call` and converged at
/// `converged`, if given.
fn machine(name: &str, role: Role, turn: Option<(i64, i64)>) -> Arc<TalosMachine> {
    let mut m = TalosMachine::new(
        name,
        TalosMachineSpec { cluster: "prod".into(), role, address: format!("10.5.0.{}", name.len()), hostname: None },
    );
    m.metadata.namespace = Some("ops".into());
    if let Some((call, converged)) = turn {
        let step = |reason: &str, secs: i64| MachineStep {
            type_: "TalosUpgrade".into(),
            status: "True".into(),
            reason: reason.into(),
            time: at(secs),
            bytes: None,
            seconds: None,
        };
        m.status = Some(TalosMachineStatus {
            history: vec![step("UpgradeRequested", call), step("Converged", converged)],
            ..TalosMachineStatus::default()
        });
    }
    Arc::new(m)
}

fn node(name: &str, os_image: &str, annotations: serde_json::Value) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { "pool": "prod" }, "annotations": annotations },
            "status": {
                "conditions": [{ "type": "Ready", "status": "True" }],
                "nodeInfo": {
                    "osImage": os_image, "kubeletVersion": "v1.34.1", "architecture": "amd64", "bootID": "b",
                    "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "",
                    "operatingSystem": "linux", "systemUUID": ""
                }
            }
        }))
        .unwrap(),
    )
}

fn defaults() -> Defaults {
    Defaults { phases: vec![("install".into(), (100.0, 100.0))], reaction_s: 2.0 }
}

pub(super) struct Cluster {
    pub(super) machines: Vec<Arc<TalosMachine>>,
    pub(super) nodes: Vec<Arc<Node>>,
    pub(super) operations: Vec<Arc<TalosOperation>>,
}

/// `prod` with 1 control plane and 3 workers, each turn recorded by `first` (made at
/// 1,000, completed at 1,500): a 10 s lead, then cp-1 100 s, then the workers one at a
/// time, each 2 s after the one before converged.
pub(super) fn cluster() -> Cluster {
    let machines = vec![
        machine("cp-1", Role::Controlplane, Some((1_010, 1_110))),
        machine("w-1", Role::Worker, Some((1_112, 1_172))),
        machine("w-2", Role::Worker, Some((1_174, 1_234))),
        machine("w-3", Role::Worker, Some((1_236, 1_296))),
    ];
    let nodes = ["cp-1", "w-1", "w-2", "w-3"].iter().map(|n| node(n, "Talos (v1.14.3)", json!({}))).collect();
    let operations = vec![operation("first", 1_000, Some(1_500), false), operation("plan", 2_000, None, true)];
    Cluster { machines, nodes, operations }
}

pub(super) fn dry_run<'a>(c: &'a Cluster, facts: ClusterFacts) -> DryRun<'a> {
    DryRun {
        operation: &c.operations[1],
        machines: &c.machines,
        nodes: &c.nodes,
        operations: &c.operations,
        facts,
        preflight: PreflightConfig::default(),
        preflight_warns: false,
        defaults: defaults(),
        own_node: None,
        storage: Ok(StorageNow::default()),
        maintenance: None,
        gates: Vec::new(),
        now: ichor_upgrade_core::Timestamp::from_unix_secs(1_767_225_600),
    }
}

#[test]
fn a_plan_learns_turns_lead_and_reaction_from_the_last_completed_upgrade() {
    let c = cluster();
    let plan = plan_status(&dry_run(&c, ClusterFacts::default())).unwrap();
    assert_eq!(plan.history.as_deref(), Some("first"));
    assert_eq!(plan.order, ["cp-1", "w-1", "w-2", "w-3"]);
    // Every turn recorded is the same per role, so every run is the record: 10 + 100 +
    // 2 + 3 * 60 + 2 * 2.
    assert_eq!((plan.p10_seconds, plan.p50_seconds, plan.p90_seconds), (296.0, 296.0, 296.0));
    assert_eq!(plan.bound_seconds, 280.0);
    assert!(plan.assumed.iter().all(|a| !a.contains("recorded")), "{:?}", plan.assumed);
    assert_eq!(plan.median_run.len(), 4);
    assert_eq!((plan.median_run[1].machine.as_str(), plan.median_run[1].start_seconds), ("w-1", 112.0));
    assert_eq!(plan.median_run[0].role, "control-plane");
}

#[test]
fn with_no_completed_upgrade_it_plans_from_defaults_and_says_so() {
    let mut c = cluster();
    c.operations[0] = operation("first", 1_000, None, false);
    let plan = plan_status(&dry_run(&c, ClusterFacts::default())).unwrap();
    assert_eq!(plan.history, None);
    assert!(plan.assumed.iter().any(|a| a.starts_with("control planes: no turn recorded")), "{:?}", plan.assumed);
    // Defaults: 100 s a turn, no lead, 2 s reaction: 100 + 2 + 3 * 100 + 2 * 2.
    assert_eq!(plan.p50_seconds, 406.0);
}

#[test]
fn it_names_the_machines_a_budget_at_zero_or_a_hold_would_hold_and_leaves_those_on_target_out() {
    let mut c = cluster();
    c.nodes[1] = node("w-1", "Talos (v1.14.3)", json!({ HOLD_ANNOTATION: "kubectl-ichor" }));
    c.nodes[3] = node("w-3", "Talos (v1.14.4)", json!({}));
    let pod = PodFacts {
        namespace: "payments".into(),
        name: "ledger-0".into(),
        node: Some("w-2".into()),
        ready: true,
        labels: [("app".to_owned(), "ledger".to_owned())].into(),
        owner: None,
        mirror: false,
    };
    let budget = BudgetFacts {
        namespace: "payments".into(),
        name: "ledger".into(),
        selector: Some(LabelSelector {
            match_labels: [("app".to_owned(), "ledger".to_owned())].into(),
            ..Default::default()
        }),
        disruptions_allowed: 0,
        current_healthy: 2,
        desired_healthy: 2,
    };
    let facts = ClusterFacts { pods: vec![pod], budgets: vec![budget], ..ClusterFacts::default() };
    let plan = plan_status(&dry_run(&c, facts.clone())).unwrap();
    assert_eq!(plan.order, ["cp-1"], "w-3 already runs the target, the others are held");
    let held: Vec<(&str, &str)> = plan.held.iter().map(|h| (h.machine.as_str(), h.reason.as_str())).collect();
    assert_eq!(held.len(), 2, "{held:?}");
    assert_eq!(held[0], ("w-1", "held by the annotation ichor.dev/hold on Node w-1"));
    assert_eq!(held[1].0, "w-2");
    assert!(held[1].1.contains("payments/ledger") && held[1].1.contains("0 disruptions"), "{held:?}");
    assert!(
        plan.assumed.iter().any(|a| a == "1 machines already run v1.14.4: nothing to do for them"),
        "{:?}",
        plan.assumed
    );

    // Warn: the budget holds nothing, and the plan says it would go anyway.
    let warned = plan_status(&DryRun { preflight_warns: true, ..dry_run(&c, facts) }).unwrap();
    assert_eq!(warned.order, ["cp-1", "w-2"]);
    assert!(
        warned.assumed.iter().any(|a| a.starts_with("preflight Warn: started despite w-2: ")),
        "{:?}",
        warned.assumed
    );
}

#[test]
fn only_an_upgrade_with_a_version_and_what_it_plans_from_is_planned() {
    let c = cluster();
    let mut op = (*c.operations[1]).clone();
    op.spec = TalosOperationSpec { kind: "kubernetes".into(), ..op.spec.clone() };
    let refused = plan_status(&DryRun { operation: &op, ..dry_run(&c, ClusterFacts::default()) }).unwrap_err();
    assert_eq!(refused.reason, "DryRunUnsupported");
    op.spec = TalosOperationSpec { kind: "talos".into(), target_version: "latest".into(), ..op.spec.clone() };
    let refused = plan_status(&DryRun { operation: &op, ..dry_run(&c, ClusterFacts::default()) }).unwrap_err();
    assert_eq!(refused.reason, "InvalidTarget");
    let status = status_patch(&op, &Err(refused), at(5));
    assert_eq!((status["phase"].as_str(), status["plan"].is_null()), (Some("Refused"), true));
}

#[test]
fn a_completed_upgrade_after_a_plan_records_how_the_plan_did() {
    let mut c = cluster();
    let mut planned = (*c.operations[1]).clone();
    planned.status = Some(TalosOperationStatus {
        phase: Some("Completed".into()),
        plan: Some(PlanStatus { p10_seconds: 280.0, p50_seconds: 300.0, p90_seconds: 330.0, ..PlanStatus::default() }),
        ..TalosOperationStatus::default()
    });
    c.operations[1] = Arc::new(planned);
    let real = operation("second", 2_100, Some(2_410), false);
    c.operations.push(Arc::clone(&real));
    let calibration = calibration(&real, &c.operations).unwrap();
    assert_eq!(calibration.plan, "plan");
    assert_eq!((calibration.actual_seconds, calibration.error_percent, calibration.within_band), (310.0, 3.3, true));
    // Recorded once; none for a dry run, for an upgrade not completed, or with no plan
    // made before it.
    let mut recorded = (*real).clone();
    recorded.status.as_mut().unwrap().calibration = Some(calibration);
    assert_eq!(super::calibration(&recorded, &c.operations), None);
    assert_eq!(super::calibration(&c.operations[1], &c.operations), None);
    assert_eq!(super::calibration(&operation("third", 2_200, None, false), &c.operations), None);
    assert_eq!(super::calibration(&c.operations[0], &c.operations), None, "the plan came after it");
}

/// The workers of [`cluster`] with a `lastUpgrade` each: a 60 s turn that began with a
/// 20 s evacuation of 2,000 MiB (100 MiB/s).
fn cluster_with_storage() -> Cluster {
    let mut c = cluster();
    for machine in c.machines.iter_mut().filter(|m| m.spec.role == Role::Worker) {
        let status = Arc::make_mut(machine).status.as_mut().unwrap();
        let converged = status.history.last().unwrap().time.clone();
        // The history as the engine writes it: the evacuation opens the turn, the call
        // comes 20 s later.
        let call = status.history[0].time.0.as_second();
        status.history[0].time = at(call + 20);
        let opened = MachineStep {
            type_: "StorageEvacuation".into(),
            reason: "Evacuating".into(),
            time: at(call),
            bytes: Some(2000 * MIB),
            ..status.history[0].clone()
        };
        status.history.insert(0, opened);
        status.last_upgrade = Some(ichor_adapters::kubernetes::crd::LastUpgrade {
            start: at(converged.0.as_second() - 60),
            converged,
            seconds: 60.0,
            steps: [("evacuation".to_owned(), 20.0), ("upgrade".to_owned(), 40.0)].into(),
            evacuated_bytes: Some(2000 * MIB),
        });
    }
    c
}

const MIB: u64 = 1 << 20;

/// Storage selecting every node of `prod`, with these bytes on them.
fn storage_now(bytes: &[(&str, Option<u64>)]) -> StorageNow {
    let selector =
        LabelSelector { match_labels: [("pool".to_owned(), "prod".to_owned())].into(), ..Default::default() };
    StorageNow {
        objects: vec![StorageObject { name: "longhorn".into(), node_selector: selector, evacuation_timeout: None }],
        bytes: bytes.iter().map(|(node, b)| ((*node).to_owned(), *b)).collect(),
    }
}

#[test]
fn the_bytes_on_the_machines_now_time_their_evacuations_at_the_recorded_rate() {
    let c = cluster_with_storage();
    let previous = &c.operations[0];
    let record = recorded(previous, &c.machines);
    let rate = record.storage.expect("bytes were recorded");
    assert_eq!(rate.bytes_per_s, 100.0 * MIB as f64);
    // Each recorded worker's turn keeps its evacuation as a phase of its own.
    let workers = record.worker_turns;
    assert!(workers.iter().all(|t| t.seconds == 60.0 && t.phase(ichor_upgrade_core::plan::EVACUATION) == 20.0));
    assert_eq!(ichor_timeline::Phase::Evacuating.key(), ichor_upgrade_core::plan::EVACUATION);

    // As recorded: the record's schedule (296 s, as in the first test).
    let same = storage_now(&[("w-1", Some(2000 * MIB)), ("w-2", Some(2000 * MIB)), ("w-3", Some(2000 * MIB))]);
    let plan = plan_status(&DryRun { storage: Ok(same), ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    assert_eq!(plan.p50_seconds, 296.0);
    // The status says each phase's recorded distribution per role.
    let fit = |role: &str, phase: &str| {
        plan.phases.iter().find(|f| f.role == role && f.phase == phase).map(|f| (f.samples, f.p50_seconds, f.recorded))
    };
    assert_eq!(fit("worker", "evacuating"), Some((3, 20.0, true)));
    assert_eq!(fit("worker", "installing"), Some((3, 40.0, true)));
    assert_eq!(fit("worker", "turn"), Some((3, 60.0, true)));
    assert_eq!(fit("control-plane", "turn"), Some((1, 100.0, true)));
    // Twice the bytes on w-1 and w-3, none left on w-2: +20 +20 -20 s, one worker at a time.
    let now = storage_now(&[("w-1", Some(4000 * MIB)), ("w-3", Some(4000 * MIB))]);
    let plan = plan_status(&DryRun { storage: Ok(now), ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    assert_eq!(plan.p50_seconds, 316.0);
    let said = plan.assumed.iter().find(|a| a.starts_with("storage: ")).expect("storage is said");
    assert!(
        said.starts_with("storage: 7.8 GiB on 2 machines now, each evacuation timed at the recorded 100 MiB/s"),
        "{said}"
    );
    // No storage object selects anything now: no evacuation at all.
    let none = StorageNow::default();
    let plan = plan_status(&DryRun { storage: Ok(none), ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    assert_eq!(plan.p50_seconds, 296.0 - 60.0);
    // A size that did not read, or storage that could not be read: as recorded, and said.
    let unknown = storage_now(&[("w-1", None), ("w-2", Some(2000 * MIB)), ("w-3", Some(2000 * MIB))]);
    let plan = plan_status(&DryRun { storage: Ok(unknown), ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    assert_eq!(plan.p50_seconds, 296.0);
    let failed = Err("list Longhorn replicas: forbidden".to_owned());
    let plan = plan_status(&DryRun { storage: failed, ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    assert_eq!(plan.p50_seconds, 296.0);
    assert!(plan.assumed.iter().any(|a| a.starts_with("storage: not read (list Longhorn replicas: forbidden)")));
    // A history that recorded no bytes gives no rate: the bytes now change nothing.
    let plain = cluster();
    let now = storage_now(&[("w-1", Some(4000 * MIB))]);
    let plan = plan_status(&DryRun { storage: Ok(now), ..dry_run(&plain, ClusterFacts::default()) }).unwrap();
    assert_eq!(plan.p50_seconds, 296.0);
}

/// Issue 56 item 3: a dry run says how many maintenance windows the median run needs, or
/// that no window can take a turn, and refuses windows that do not read.
#[test]
fn a_dry_run_counts_the_maintenance_windows_its_median_run_needs() {
    use ichor_upgrade_core::window::{MaintenanceSpec, WindowSpec};
    let c = cluster();
    let spec = |schedule: &str, duration: &str, zone: &str| MaintenanceSpec {
        windows: vec![WindowSpec {
            schedule: schedule.into(),
            duration: duration.into(),
            time_zone: Some(zone.into()),
        }],
        blackouts: Vec::new(),
    };
    // Every turn is 100 s for the control plane and 60 s per worker here, one at a time:
    // two minutes a day takes one turn a day.
    let daily = spec("0 2 * * *", "2m", "Europe/Berlin");
    let plan = plan_status(&DryRun { maintenance: Some(&daily), ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    let windows = plan.windows.expect("windows counted");
    assert!(windows.needed.is_some_and(|n| n >= 2), "{windows:?}");
    assert!(windows.message.contains("maintenance windows"), "{}", windows.message);
    // An hour a day takes them all.
    let hour = spec("0 2 * * *", "1h", "UTC");
    let plan = plan_status(&DryRun { maintenance: Some(&hour), ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    assert_eq!(plan.windows.and_then(|w| w.needed), Some(1));
    // A minute a day takes none.
    let minute = spec("0 2 * * *", "1m", "UTC");
    let plan = plan_status(&DryRun { maintenance: Some(&minute), ..dry_run(&c, ClusterFacts::default()) }).unwrap();
    let windows = plan.windows.expect("windows said");
    assert_eq!(windows.needed, None);
    assert!(windows.message.contains("longer than every maintenance window"), "{}", windows.message);
    // Without windows, nothing is said of them.
    assert_eq!(plan_status(&dry_run(&c, ClusterFacts::default())).unwrap().windows, None);
    // Windows that do not read: refused, as the upgrade would be.
    let mars = spec("0 2 * * *", "1h", "Mars/Olympus");
    let refused =
        plan_status(&DryRun { maintenance: Some(&mars), ..dry_run(&c, ClusterFacts::default()) }).unwrap_err();
    assert_eq!(refused.reason, "InvalidMaintenance");
    assert!(refused.message.contains("Mars/Olympus"), "{}", refused.message);
}
