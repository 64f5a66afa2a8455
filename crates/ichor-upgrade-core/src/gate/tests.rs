use super::*;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_unix_secs(secs)
}

fn rule(name: &str, phase: GatePhase, settle: u64) -> GateRule {
    GateRule {
        name: name.into(),
        phase,
        role: None,
        wave: None,
        settle: Duration::from_secs(settle),
        timeout: Some(Duration::from_secs(600)),
    }
}

fn reading(name: &str, r: GateReading) -> BTreeMap<String, GateReading> {
    BTreeMap::from([(name.to_owned(), r)])
}

fn fails() -> GateReading {
    GateReading::Fails { object: "Volume longhorn-system/pvc-1".into(), value: "false".into() }
}

#[test]
fn a_gate_passes_only_once_it_has_held_for_its_settle_without_a_break() {
    let r = rule("volumes", GatePhase::BeforeMachine, 60);
    let holds = reading("volumes", GateReading::Holds);
    let s = track(std::slice::from_ref(&r), &holds, &BTreeMap::new(), |_| 0, at(100));
    assert_eq!(s["volumes"].holding_since, Some(at(100)));
    let b = block(&r, &s["volumes"], holds.get("volumes"), at(130)).expect("settling");
    assert_eq!(b.settles_at, Some(at(160)));
    // A break begins the settle again.
    let s = track(std::slice::from_ref(&r), &reading("volumes", fails()), &s, |_| 0, at(150));
    assert_eq!(s["volumes"].holding_since, None);
    assert_eq!(s["volumes"].last.as_deref(), Some("Volume longhorn-system/pvc-1: false"));
    let s = track(std::slice::from_ref(&r), &holds, &s, |_| 0, at(170));
    assert!(block(&r, &s["volumes"], holds.get("volumes"), at(200)).is_some(), "170 + 60 is not yet");
    assert_eq!(block(&r, &s["volumes"], holds.get("volumes"), at(230)), None);
}

#[test]
fn what_was_not_read_never_passes() {
    let r = rule("volumes", GatePhase::BeforeMachine, 0);
    let unread = reading("volumes", GateReading::NotRead { why: "forbidden".into() });
    let s = track(std::slice::from_ref(&r), &unread, &BTreeMap::new(), |_| 0, at(0));
    let b = block(&r, &s["volumes"], unread.get("volumes"), at(0)).unwrap();
    assert_eq!(b.value, "not read: forbidden");
    let s = track(std::slice::from_ref(&r), &BTreeMap::new(), &s, |_| 0, at(1));
    assert!(block(&r, &s["volumes"], None, at(1)).is_some(), "no reading is no pass");
}

#[test]
fn an_after_machine_gate_settles_again_after_each_convergence_in_its_scope() {
    let r = rule("volumes", GatePhase::AfterMachine, 60);
    let holds = reading("volumes", GateReading::Holds);
    let s = track(std::slice::from_ref(&r), &holds, &BTreeMap::new(), |_| 1, at(0));
    let s = track(std::slice::from_ref(&r), &holds, &s, |_| 1, at(100));
    assert_eq!(s["volumes"].holding_since, Some(at(0)), "nothing new converged");
    // A second machine converged: the gate has held since then only.
    let s = track(std::slice::from_ref(&r), &holds, &s, |_| 2, at(200));
    assert_eq!((s["volumes"].holding_since, s["volumes"].after_converged), (Some(at(200)), 2));
    assert!(block(&r, &s["volumes"], holds.get("volumes"), at(230)).is_some());
}

#[test]
fn a_wait_times_out_at_its_bound_and_stays_timed_out() {
    let r = rule("volumes", GatePhase::BeforeMachine, 0);
    let mut state = GateState::default();
    assert!(!waited(&r, &mut state, at(1_000)));
    assert!(!waited(&r, &mut state, at(1_599)));
    assert!(waited(&r, &mut state, at(1_600)));
    assert!(waited(&r, &mut state, at(1_601)), "sticky until a resume clears it");
    let mut forever = GateState::default();
    let no_timeout = GateRule { timeout: None, ..r };
    assert!(!waited(&no_timeout, &mut forever, at(i64::MAX / 2_000)));
}

#[test]
fn scope_by_role_and_wave() {
    let r = GateRule { role: Some(MachineRole::Worker), wave: Some(2), ..rule("g", GatePhase::BeforeMachine, 0) };
    assert!(r.covers(MachineRole::Worker, Some("2")));
    assert!(!r.covers(MachineRole::Worker, Some("1")));
    assert!(!r.covers(MachineRole::Worker, None));
    assert!(!r.covers(MachineRole::ControlPlane, Some("2")));
}

fn spec(name: &str) -> GateSpec {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "objects": { "apiVersion": "longhorn.io/v1beta2", "kind": "Volume", "namespace": "longhorn-system" },
        "expression": "object.status.robustness == 'healthy'",
        "phase": "afterMachine",
        "scope": { "role": "worker" },
        "settleSeconds": 120,
        "timeoutSeconds": 1800,
    }))
    .unwrap()
}

#[test]
fn a_spec_reads_as_its_rule() {
    let rules = rules(&[spec("volumes")]).unwrap();
    assert_eq!(
        rules,
        [GateRule {
            name: "volumes".into(),
            phase: GatePhase::AfterMachine,
            role: Some(MachineRole::Worker),
            wave: None,
            settle: Duration::from_secs(120),
            timeout: Some(Duration::from_secs(1800)),
        }]
    );
}

#[test]
fn specs_that_do_not_read_are_refused_naming_the_gate_and_field() {
    let twice = rules(&[spec("volumes"), spec("volumes")]).unwrap_err();
    assert!(twice.contains("gates[1].name \"volumes\" is taken"), "{twice}");
    let negative = rules(&[GateSpec { settle_seconds: -1, ..spec("volumes") }]).unwrap_err();
    assert_eq!(negative, "gates[0] (volumes).settleSeconds is negative: -1");
    let mut no_kind = spec("volumes");
    no_kind.objects.as_mut().unwrap().kind = String::new();
    assert!(rules(&[no_kind]).unwrap_err().contains("objects need an apiVersion and a kind"));
    assert!(rules(&[spec(" ")]).unwrap_err().contains("gates[0].name is empty"));
}

fn alert_gate(alerts: serde_json::Value) -> GateSpec {
    serde_json::from_value(serde_json::json!({
        "name": "alerts",
        "alerts": alerts,
        "phase": "beforeMachine",
    }))
    .unwrap()
}

#[test]
fn an_alert_gate_reads_as_a_rule_with_its_silence_defaults() {
    let spec = alert_gate(serde_json::json!({
        "alertmanager": "http://alertmanager.monitoring:9093",
        "matchers": ["severity=critical"],
        "silence": {},
    }));
    let silence = spec.alerts.as_ref().unwrap().silence.as_ref().unwrap();
    assert_eq!((silence.node_label.as_str(), silence.lease_seconds, silence.max_seconds), ("node", 300, 3600));
    let rule = &rules(&[spec]).unwrap()[0];
    assert_eq!((rule.phase, rule.settle, rule.timeout), (GatePhase::BeforeMachine, Duration::ZERO, None));
}

#[test]
fn alert_gates_that_do_not_read_are_refused_naming_the_field() {
    let refused = |spec: GateSpec| rules(&[spec]).unwrap_err();
    let am = "http://am:9093";
    assert_eq!(
        refused(alert_gate(serde_json::json!({}))),
        "gates[0] (alerts).alerts: name one source, alertmanager or prometheus"
    );
    let both = refused(alert_gate(serde_json::json!({ "alertmanager": am, "prometheus": "http://p:9090" })));
    assert!(both.contains("name one source"), "{both}");
    let url = refused(alert_gate(serde_json::json!({ "alertmanager": "am:9093" })));
    assert!(url.contains("\"am:9093\" is not an http:// or https:// URL"), "{url}");
    let prometheus = refused(alert_gate(serde_json::json!({ "prometheus": "http://p:9090", "silence": {} })));
    assert!(prometheus.contains("alerts.silence needs alertmanager"), "{prometheus}");
    let short = refused(alert_gate(serde_json::json!({ "alertmanager": am, "silence": { "leaseSeconds": 5 } })));
    assert!(short.contains("leaseSeconds is 5: at least 10"), "{short}");
    let cap = refused(alert_gate(serde_json::json!({ "alertmanager": am, "silence": { "maxSeconds": 60 } })));
    assert!(cap.contains("maxSeconds (60) is below leaseSeconds (300)"), "{cap}");
    let negative = refused(alert_gate(serde_json::json!({ "alertmanager": am, "silence": { "maxSeconds": -1 } })));
    assert!(negative.contains("alerts.silence.maxSeconds is negative"), "{negative}");
    // Objects and alerts, or neither; objects with no expression.
    let mut both_kinds = spec("volumes");
    both_kinds.alerts = Some(AlertSelector { alertmanager: Some(am.into()), ..AlertSelector::default() });
    assert!(refused(both_kinds).contains("a gate reads objects or alerts, one of the two"));
    let mut neither = spec("volumes");
    neither.objects = None;
    assert!(refused(neither).contains("one of the two"));
    let mut no_expression = spec("volumes");
    no_expression.expression = String::new();
    assert!(refused(no_expression).contains("objects need an expression"));
}

#[test]
fn a_silence_is_a_lease_capped_from_its_first_start() {
    let (lease, max) = (Duration::from_secs(300), Duration::from_secs(3600));
    // Begun now: a lease from now.
    assert_eq!(silence_until(lease, max, None, at(1000)), Some(at(1300)));
    // Renewed: a lease from now, until the cap.
    assert_eq!(silence_until(lease, max, Some(at(1000)), at(2000)), Some(at(2300)));
    assert_eq!(silence_until(lease, max, Some(at(1000)), at(4500)), Some(at(4600)), "capped at 1000 + 3600");
    assert_eq!(silence_until(lease, max, Some(at(1000)), at(4600)), None, "lapses at the cap");
    // Renewed once less than half the lease is left.
    assert!(!silence_due(lease, at(1300), at(1100)));
    assert!(silence_due(lease, at(1300), at(1150)));
    assert_eq!(silence_renew_at(lease, at(1300)), at(1150));
}

proptest::proptest! {
    /// Whatever the times, a silence never runs past its cap, nor more than a lease
    /// ahead, and is held only while it would end after now.
    #[test]
    fn no_silence_outlives_its_cap_or_its_lease(
        lease in 10_u64..3600,
        extra in 0_u64..7200,
        first in 0_i64..100_000,
        later in 0_i64..20_000,
    ) {
        let (lease, max) = (Duration::from_secs(lease), Duration::from_secs(lease + extra));
        let now = at(first + later);
        if let Some(until) = silence_until(lease, max, Some(at(first)), now) {
            proptest::prop_assert!(until > now);
            proptest::prop_assert!(until <= at(first).saturating_add(max));
            proptest::prop_assert!(until <= now.saturating_add(lease));
        } else {
            proptest::prop_assert!(now >= at(first).saturating_add(max));
        }
    }
}
