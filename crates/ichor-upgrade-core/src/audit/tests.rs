use super::*;

fn node(name: &str, image: &str) -> AuditNode {
    AuditNode {
        name: name.into(),
        ready: true,
        os_image: Some(format!("Talos ({image})")),
        kubelet_version: Some("v1.35.0".into()),
        unschedulable: false,
        cordoned_by_engine: false,
    }
}

fn healthy_etcd() -> AuditEtcd {
    AuditEtcd::Read {
        members: vec![("cp-1".into(), false), ("cp-2".into(), false), ("cp-3".into(), false)],
        alarms: Vec::new(),
        unhealthy: None,
    }
}

fn talos(v: &str) -> AuditTarget {
    AuditTarget::Talos(TalosVersion::parse(v).unwrap())
}

#[test]
fn a_cluster_as_it_should_be_has_no_finding() {
    let nodes = [node("cp-1", "v1.14.4"), node("w-1", "v1.14.4")];
    let budgets = [AuditBudget { namespace: "a".into(), name: "b".into(), disruptions_allowed: 1, expected_pods: 3 }];
    let input = AuditInput {
        target: &talos("v1.14.4"),
        nodes: &nodes,
        static_pods: Ok(&[]),
        etcd: &healthy_etcd(),
        budgets: Ok(&budgets),
    };
    assert_eq!(audit(&input), Vec::new());
}

#[test]
fn each_thing_left_wrong_is_its_own_typed_finding() {
    let mut cordoned = node("w-1", "v1.14.4");
    cordoned.unschedulable = true;
    cordoned.cordoned_by_engine = true;
    // A person's cordon is theirs: no finding.
    let mut theirs = node("w-2", "v1.14.4");
    theirs.unschedulable = true;
    let mut down = node("w-3", "v1.14.3");
    down.ready = false;
    let nodes = [node("cp-1", "v1.14.4"), cordoned, theirs, down];
    let pods = [
        AuditPod { node: "cp-1".into(), name: "kube-apiserver".into(), crash_looping: true },
        AuditPod { node: "cp-1".into(), name: "kube-scheduler".into(), crash_looping: false },
    ];
    let etcd = AuditEtcd::Read {
        members: vec![("cp-1".into(), false), ("cp-4".into(), true)],
        alarms: vec!["NOSPACE".into()],
        unhealthy: Some("member cp-2 does not answer".into()),
    };
    let budgets = [
        AuditBudget { namespace: "pay".into(), name: "ledger".into(), disruptions_allowed: 0, expected_pods: 2 },
        // No pod: nothing is held by it.
        AuditBudget { namespace: "pay".into(), name: "empty".into(), disruptions_allowed: 0, expected_pods: 0 },
    ];
    let input = AuditInput {
        target: &talos("v1.14.4"),
        nodes: &nodes,
        static_pods: Ok(&pods),
        etcd: &etcd,
        budgets: Ok(&budgets),
    };
    let found = audit(&input);
    let reasons: Vec<&str> = found.iter().map(Finding::reason).collect();
    assert_eq!(
        reasons,
        [
            "LeftCordoned",
            "StaticPodCrashLooping",
            "NodeNotReady",
            "NodeNotOnTarget",
            "EtcdUnhealthy",
            "EtcdLearner",
            "EtcdAlarm",
            "BudgetAtZero"
        ],
        "{found:#?}"
    );
    assert!(found.contains(&Finding::NodeNotOnTarget {
        node: "w-3".into(),
        running: "v1.14.3".into(),
        target: "v1.14.4".into()
    }));
    assert_eq!(found[1].to_string(), "static pod kube-apiserver on cp-1 is crash-looping");
}

#[test]
fn a_kubernetes_target_is_checked_on_the_kubelets() {
    let mut old = node("w-1", "v1.14.4");
    old.kubelet_version = Some("v1.34.1".into());
    let nodes = [node("cp-1", "v1.14.4"), old];
    let target = AuditTarget::Kubernetes(KubernetesVersion::parse("1.35.0").unwrap());
    let input =
        AuditInput { target: &target, nodes: &nodes, static_pods: Ok(&[]), etcd: &healthy_etcd(), budgets: Ok(&[]) };
    assert_eq!(
        audit(&input),
        [Finding::NodeNotOnTarget { node: "w-1".into(), running: "1.34.1".into(), target: "1.35.0".into() }]
    );
}

#[test]
fn the_declared_versions_are_both_checked_a_finding_for_each_one_missed() {
    let mut both = node("w-1", "v1.14.3");
    both.kubelet_version = Some("v1.34.1".into());
    let mut unknown = node("w-2", "v1.14.4");
    unknown.kubelet_version = None;
    let nodes = [node("cp-1", "v1.14.4"), both, unknown];
    let target = AuditTarget::Declared {
        talos: TalosVersion::parse("v1.14.4").unwrap(),
        kubernetes: KubernetesVersion::parse("1.35.0").unwrap(),
    };
    let input =
        AuditInput { target: &target, nodes: &nodes, static_pods: Ok(&[]), etcd: &healthy_etcd(), budgets: Ok(&[]) };
    assert_eq!(
        audit(&input),
        [
            Finding::NodeNotOnTarget { node: "w-1".into(), running: "1.34.1".into(), target: "1.35.0".into() },
            Finding::NodeNotOnTarget { node: "w-1".into(), running: "v1.14.3".into(), target: "v1.14.4".into() },
            Finding::NodeNotOnTarget { node: "w-2".into(), running: "unknown".into(), target: "1.35.0".into() },
        ]
    );
}

#[test]
fn what_could_not_be_read_is_a_finding_never_a_clean_audit() {
    let nodes = [node("cp-1", "v1.14.4")];
    let etcd = AuditEtcd::NotRead("no control plane answered".into());
    let input = AuditInput {
        target: &AuditTarget::None,
        nodes: &nodes,
        static_pods: Err("forbidden"),
        etcd: &etcd,
        budgets: Err("timed out"),
    };
    let found = audit(&input);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found.iter().all(|f| f.reason() == "AuditNotRead"), "{found:?}");
}

#[test]
fn a_finding_reads_as_its_reason_in_json_tagged_finding() {
    let unread = serde_json::to_value(Finding::NotRead { what: "etcd".into() }).unwrap();
    assert_eq!(unread["finding"], "AuditNotRead");
    let finding = Finding::BudgetAtZero { namespace: "pay".into(), name: "ledger".into() };
    let json = serde_json::to_value(&finding).unwrap();
    assert_eq!(json, serde_json::json!({"finding": "BudgetAtZero", "namespace": "pay", "name": "ledger"}));
    assert_eq!(serde_json::from_value::<Finding>(json).unwrap(), finding);
}
