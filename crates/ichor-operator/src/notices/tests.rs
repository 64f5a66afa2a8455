use super::*;
use ichor_adapters::kubernetes::crd::{MachineCounts, NotificationSink, SecretKeyRef, SinkType};
use ichor_upgrade_core::status::{FailedMachine, WaitReason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

/// `upgrade` of `prod`, made at 1,000, in `phase` (the engine's), its conditions
/// `(type, since)`.
fn op(phase: Phase, started: bool, conditions: &[(&str, i64)]) -> TalosOperation {
    let engine = OperationStatus {
        phase: phase.clone(),
        started_target: started.then(|| "v1.14.4".to_owned()),
        ..OperationStatus::default()
    };
    let mut o = crate::fixtures::operation("upgrade", phase.name(), phase.reason());
    o.metadata.uid = Some("u1".into());
    o.metadata.creation_timestamp = Some(Time(at(1_000)));
    let status = o.status.as_mut().unwrap();
    status.engine = Some(serde_json::to_value(&engine).unwrap());
    status.message = Some(phase.to_string());
    status.machines = Some(MachineCounts { total: 4, ..MachineCounts::default() });
    status.conditions = conditions
        .iter()
        .map(|(type_, since)| Condition {
            type_: (*type_).into(),
            status: "True".into(),
            reason: (*type_).into(),
            message: String::new(),
            last_transition_time: Time(at(*since)),
            observed_generation: None,
        })
        .collect();
    o
}

fn sink(name: &str) -> NotificationSink {
    NotificationSink {
        name: name.into(),
        type_: SinkType::Webhook,
        url_secret: SecretKeyRef { name: "hook".into(), key: "url".into() },
    }
}

fn ids(notices: &[Notice]) -> Vec<&str> {
    notices.iter().map(|n| n.id.as_str()).collect()
}

#[test]
fn each_event_is_owed_once_its_state_is_reached_with_an_id_that_never_changes() {
    let failed = PauseReason::MachineFailed {
        machines: vec![FailedMachine { name: "w-2".into(), reason: "rolled back to v1.14.3".into() }],
    };
    let paused = op(Phase::Paused(failed), true, &[("Paused", 1_200)]);
    let notices = owed(&paused, &[], None, 600, at(1_300));
    assert_eq!(ids(&notices), ["u1/started", "u1/failed/w-2/1200", "u1/paused/1200"]);
    assert_eq!(notices[0].message, "ops/upgrade (talos upgrade of prod to v1.14.4) started: 4 machines");
    assert!(notices[1].message.contains("machine w-2 failed: rolled back to v1.14.3"), "{}", notices[1].message);
    assert!(notices[2].message.ends_with("kubectl ichor resume upgrade -n ops"), "{}", notices[2].message);
    // Derived again later, by another replica: the same ids.
    assert_eq!(ids(&owed(&paused, &[], None, 600, at(9_999))), ids(&notices));
    // Paused again after a resume: a new pause, new ids.
    let again = op(Phase::Paused(PauseReason::Requested { by: "ana".into() }), true, &[("Paused", 1_500)]);
    assert_eq!(ids(&owed(&again, &[], None, 600, at(1_600))), ["u1/started", "u1/paused/1500"]);
    // Not started, a dry run: nothing.
    assert!(owed(&op(Phase::Pending, false, &[]), &[], None, 600, at(1_100)).is_empty());
    let mut dry = paused.clone();
    dry.spec.dry_run = true;
    assert!(owed(&dry, &[], None, 600, at(1_300)).is_empty());
}

#[test]
fn a_wait_is_owed_once_it_lasts_the_threshold_for_one_reason() {
    let waiting_op = op(Phase::Waiting(WaitReason::EtcdGateNotChecked), true, &[]);
    let since = waiting(&waiting_op, None, at(2_000)).unwrap();
    assert_eq!((since.reason.as_str(), since.since.0), ("EtcdGateNotChecked", at(2_000)));
    // Carried over while the reason stays; begun again when it changes; gone when it ends.
    assert_eq!(waiting(&waiting_op, Some(&since), at(2_500)), Some(since.clone()));
    let other = op(Phase::Waiting(WaitReason::EtcdSnapshotPending), true, &[]);
    assert_eq!(waiting(&other, Some(&since), at(2_500)).unwrap().since.0, at(2_500));
    assert_eq!(waiting(&op(Phase::Progressing, true, &[]), Some(&since), at(2_500)), None);

    let before = owed(&waiting_op, &[], Some(&since), 600, at(2_599));
    assert_eq!(ids(&before), ["u1/started"]);
    let after = owed(&waiting_op, &[], Some(&since), 600, at(2_600));
    assert_eq!(ids(&after), ["u1/started", "u1/waiting/EtcdGateNotChecked/2000"]);
    assert!(after[1].message.contains("has waited 600 s"), "{}", after[1].message);
    assert!(
        after[1].message.contains(&Phase::Waiting(WaitReason::EtcdGateNotChecked).to_string()),
        "{}",
        after[1].message
    );
}

#[test]
fn completion_gives_the_makespan_against_the_plan_when_one_was_made() {
    let done = op(Phase::Completed, true, &[("Completed", 1_420)]);
    let notices = owed(&done, &[], None, 600, at(1_500));
    assert_eq!(ids(&notices), ["u1/started", "u1/completed"]);
    assert!(notices[1].message.ends_with("completed in 420 s; no dry run planned it"), "{}", notices[1].message);

    let mut plan = crate::fixtures::operation("plan", "Completed", "Planned");
    plan.spec.dry_run = true;
    plan.metadata.creation_timestamp = Some(Time(at(900)));
    plan.status.as_mut().unwrap().plan = Some(ichor_adapters::kubernetes::crd::PlanStatus {
        p10_seconds: 300.0,
        p50_seconds: 400.0,
        p90_seconds: 500.0,
        ..Default::default()
    });
    let notices = owed(&done, &[Arc::new(plan)], None, 600, at(1_500));
    assert_eq!(
        notices[1].message,
        "ops/upgrade (talos upgrade of prod to v1.14.4) completed in 420 s; the plan plan said p50 400 s (p10 300, p90 500): +5.0 %, within its band"
    );
}

#[test]
fn the_outbox_gains_a_record_per_notice_and_sink_and_keeps_those_it_has() {
    let spec = NotificationsSpec { sinks: vec![sink("hook"), sink("slack")], ..NotificationsSpec::default() };
    let done = op(Phase::Completed, true, &[("Completed", 1_420)]);
    let notices = owed(&done, &[], None, 600, at(1_500));
    let outbox = merged(&NotificationsStatus::default(), &notices[..1], &spec, None, at(1_100));
    let outbox = NotificationsStatus {
        records: outbox.records.iter().map(|r| answered(&sending(r), Ok(()), 60, at(1_101))).collect(),
        ..outbox
    };
    let next = merged(&outbox, &notices, &spec, None, at(1_500));
    let seen: Vec<(&str, &str, &str)> =
        next.records.iter().map(|r| (r.id.as_str(), r.sink.as_str(), r.state.as_str())).collect();
    assert_eq!(
        seen,
        [
            ("u1/started", "hook", DELIVERED),
            ("u1/started", "slack", DELIVERED),
            ("u1/completed", "hook", PENDING),
            ("u1/completed", "slack", PENDING),
        ]
    );
    assert_eq!(merged(&next, &notices, &spec, None, at(1_600)), next, "merging again changes nothing");
}

#[test]
fn a_sinks_notices_go_in_order_retried_with_a_growing_backoff_then_given_up() {
    let spec = NotificationsSpec { sinks: vec![sink("hook")], ..NotificationsSpec::default() };
    let done = op(Phase::Completed, true, &[("Completed", 1_420)]);
    let mut outbox =
        merged(&NotificationsStatus::default(), &owed(&done, &[], None, 600, at(1_500)), &spec, None, at(1_500));
    assert_eq!(due(&outbox, "hook", at(1_500)), Some(0));
    assert_eq!(due(&outbox, "slack", at(1_500)), None, "no such sink: nothing");
    let mut delays = Vec::new();
    let mut now = at(1_500);
    while outbox.records[0].state != GAVE_UP {
        let Some(i) = due(&outbox, "hook", now) else {
            now += SignedDuration::from_secs(1);
            continue;
        };
        outbox.records[i] = sending(&outbox.records[i]);
        // A leader that dies here leaves Sending: the next one sends it again at once.
        assert_eq!(due(&outbox, "hook", now), Some(i));
        outbox.records[i] = answered(&outbox.records[i], Err("503 Service Unavailable".into()), 300, now);
        if let Some(next) = &outbox.records[i].next_attempt {
            delays.push(next.0.as_second() - now.as_second());
            // The second notice waits behind the first.
            assert_eq!(due(&outbox, "hook", next.0), Some(0));
        }
    }
    assert_eq!(delays[..7], [2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(outbox.records[0].last_error.as_deref(), Some("503 Service Unavailable"));
    assert!(now.as_second() - 1_500 >= 300 && now.as_second() - 1_500 < 360, "given up after 300 s");
    // Given up: the next notice goes.
    assert_eq!(due(&outbox, "hook", now), Some(1));
    outbox.records[1] = answered(&sending(&outbox.records[1]), Ok(()), 300, now);
    assert_eq!((outbox.records[1].state.as_str(), outbox.records[1].attempts), (DELIVERED, 1));
    assert_eq!(due(&outbox, "hook", now), None);
}

#[test]
fn a_webhook_gets_the_notice_as_json_and_slack_a_text() {
    let done = op(Phase::Completed, true, &[("Completed", 1_420)]);
    let spec = NotificationsSpec { sinks: vec![sink("hook")], ..NotificationsSpec::default() };
    let outbox =
        merged(&NotificationsStatus::default(), &owed(&done, &[], None, 600, at(1_500)), &spec, None, at(1_500));
    let hook = body(SinkType::Webhook, &outbox.records[1], &done);
    assert_eq!((hook["id"].as_str(), hook["event"].as_str()), (Some("u1/completed"), Some("Completed")));
    assert_eq!((hook["namespace"].as_str(), hook["operation"].as_str()), (Some("ops"), Some("upgrade")));
    let slack = body(SinkType::Slack, &outbox.records[1], &done);
    assert!(slack["text"].as_str().unwrap().starts_with("[ichor] Completed: ops/upgrade"), "{slack}");
    assert_eq!(slack.as_object().unwrap().len(), 1);
}
