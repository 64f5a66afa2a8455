use proptest::prelude::*;

use super::*;
use crate::labels::LabelSelectorRequirement;

fn node(name: &str) -> NodeFacts {
    NodeFacts { name: name.into(), ready: true, unschedulable: false, by_operation: false, cordoned_by: None }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn pod(namespace: &str, name: &str, on: &str, owner: Option<(&str, &str)>, app: &str) -> PodFacts {
    PodFacts {
        namespace: namespace.into(),
        name: name.into(),
        node: Some(on.into()),
        ready: true,
        labels: labels(&[("app", app)]),
        owner: owner.map(|(kind, name)| Owner { kind: kind.into(), name: name.into() }),
        mirror: false,
    }
}

fn deployment(namespace: &str, name: &str, replicas: i32) -> (WorkloadFacts, ReplicaSetFacts) {
    (
        WorkloadFacts { kind: WorkloadKind::Deployment, namespace: namespace.into(), name: name.into(), replicas },
        ReplicaSetFacts {
            namespace: namespace.into(),
            name: format!("{name}-5d4f"),
            replicas,
            deployment: Some(name.into()),
        },
    )
}

fn budget(namespace: &str, name: &str, app: &str, allowed: i32, healthy: i32, desired: i32) -> BudgetFacts {
    BudgetFacts {
        namespace: namespace.into(),
        name: name.into(),
        selector: Some(LabelSelector { match_labels: labels(&[("app", app)]), ..LabelSelector::default() }),
        disruptions_allowed: allowed,
        current_healthy: healthy,
        desired_healthy: desired,
    }
}

/// The runbook's example: a single-replica Deployment with a PDB that can never be met.
fn runbook_cluster() -> ClusterFacts {
    let (invoice, invoice_rs) = deployment("billing", "invoice-worker", 1);
    let (api, api_rs) = deployment("billing", "invoice-api", 3);
    ClusterFacts {
        nodes: ["worker-1", "worker-2", "worker-3", "worker-4"].map(node).into(),
        pods: vec![
            pod(
                "billing",
                "invoice-worker-5d4f-a",
                "worker-3",
                Some(("ReplicaSet", "invoice-worker-5d4f")),
                "invoice-worker",
            ),
            pod("billing", "invoice-api-5d4f-a", "worker-1", Some(("ReplicaSet", "invoice-api-5d4f")), "invoice-api"),
            pod("billing", "invoice-api-5d4f-b", "worker-2", Some(("ReplicaSet", "invoice-api-5d4f")), "invoice-api"),
            pod("billing", "invoice-api-5d4f-c", "worker-3", Some(("ReplicaSet", "invoice-api-5d4f")), "invoice-api"),
            pod("kube-system", "coredns-1", "worker-4", Some(("ReplicaSet", "coredns-7c")), "coredns"),
            pod("kube-system", "cilium-4", "worker-4", Some(("DaemonSet", "cilium")), "cilium"),
        ],
        budgets: vec![
            budget("billing", "invoice-worker", "invoice-worker", 0, 1, 1),
            budget("billing", "invoice-api", "invoice-api", 1, 3, 2),
            budget("kube-system", "coredns", "coredns", 0, 1, 1),
        ],
        workloads: vec![
            invoice,
            api,
            WorkloadFacts {
                kind: WorkloadKind::Deployment,
                namespace: "kube-system".into(),
                name: "coredns".into(),
                replicas: 1,
            },
        ],
        replica_sets: vec![
            invoice_rs,
            api_rs,
            ReplicaSetFacts {
                namespace: "kube-system".into(),
                name: "coredns-7c".into(),
                replicas: 1,
                deployment: Some("coredns".into()),
            },
        ],
    }
}

#[test]
fn the_runbooks_blockers_are_named_for_the_node_they_are_on_only() {
    let facts = runbook_cluster();
    let config = PreflightConfig::default();
    let preflight = Preflight::new(&facts, &config);
    let blockers = preflight.blockers("worker-3");
    let lines: Vec<String> = blockers.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec![
            "PDB billing/invoice-worker allows 0 disruptions (healthy 1/1)",
            "Deployment billing/invoice-worker has 1 replica: it goes down while worker-3 drains",
        ]
    );
    // A budget at zero and a single replica elsewhere do not stall this node's drain.
    assert_eq!(preflight.blockers("worker-1"), vec![]);
    // kube-system is ignored by default: coredns's single replica and budget at zero.
    assert_eq!(preflight.blockers("worker-4"), vec![]);
    assert_eq!(describe(&blockers), lines.join("; "));
}

#[test]
fn other_nodes_not_ready_or_cordoned_block_unless_this_operation_took_them_out() {
    let mut facts = ClusterFacts { nodes: ["a", "b", "c", "d"].map(node).into(), ..ClusterFacts::default() };
    facts.nodes[1].ready = false;
    facts.nodes[2].unschedulable = true;
    let config = PreflightConfig::default();
    assert_eq!(
        Preflight::new(&facts, &config).blockers("a"),
        vec![Blocker::NodeNotReady { node: "b".into() }, Blocker::NodeCordoned { node: "c".into(), operation: None }]
    );
    // The node at hand does not block itself.
    assert_eq!(
        Preflight::new(&facts, &config).blockers("b"),
        vec![Blocker::NodeCordoned { node: "c".into(), operation: None }]
    );
    facts.nodes[1].by_operation = true;
    facts.nodes[2].by_operation = true;
    assert_eq!(Preflight::new(&facts, &config).blockers("a"), vec![], "machines this operation started");
}

#[test]
fn a_workload_whose_ready_pods_all_run_on_the_node_blocks_it_until_one_runs_elsewhere() {
    let (web, web_rs) = deployment("shop", "web", 3);
    let owner = Some(("ReplicaSet", "web-5d4f"));
    let mut facts = ClusterFacts {
        nodes: ["a", "b"].map(node).into(),
        pods: vec![pod("shop", "web-1", "a", owner, "web"), pod("shop", "web-2", "a", owner, "web"), {
            let mut p = pod("shop", "web-3", "b", owner, "web");
            p.ready = false;
            p
        }],
        workloads: vec![web],
        replica_sets: vec![web_rs],
        ..ClusterFacts::default()
    };
    let config = PreflightConfig::default();
    assert_eq!(
        Preflight::new(&facts, &config).blockers("a").iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["Deployment shop/web: all 2 Ready pods of 3 run on a"],
        "a pod that is not Ready elsewhere does not count"
    );
    assert_eq!(Preflight::new(&facts, &config).blockers("b"), vec![]);
    facts.pods[2].ready = true;
    assert_eq!(Preflight::new(&facts, &config).blockers("a"), vec![]);
}

#[test]
fn what_every_drain_leaves_is_not_checked() {
    let mut daemon = pod("shop", "agent-a", "a", Some(("DaemonSet", "agent")), "agent");
    daemon.labels = labels(&[("app", "web")]);
    let mut mirror = pod("shop", "static-a", "a", Some(("Node", "a")), "web");
    mirror.mirror = true;
    let facts = ClusterFacts {
        nodes: vec![node("a")],
        pods: vec![daemon, mirror],
        budgets: vec![budget("shop", "web", "web", 0, 1, 1)],
        ..ClusterFacts::default()
    };
    assert_eq!(Preflight::new(&facts, &PreflightConfig::default()).blockers("a"), vec![]);
}

/// Found by the downstream properties: the lifecycle executor's drain (as `talosctl`'s,
/// kubectl's with `--force`) evicts a pod no controller owns, and a budget at zero over it
/// held that drain to its timeout, while the preflight had let the machine start.
#[test]
fn a_budget_at_zero_over_a_pod_no_controller_owns_blocks() {
    let bare = pod("shop", "bare", "a", None, "web");
    let facts = ClusterFacts {
        nodes: vec![node("a")],
        pods: vec![bare],
        budgets: vec![budget("shop", "web", "web", 0, 1, 1)],
        ..ClusterFacts::default()
    };
    let blockers = Preflight::new(&facts, &PreflightConfig::default()).blockers("a");
    assert_eq!(
        blockers,
        vec![Blocker::BudgetAtZero { namespace: "shop".into(), name: "web".into(), healthy: 1, desired: 1 }]
    );
}

#[test]
fn budget_selectors_none_empty_and_broken() {
    let job = pod("shop", "report-1", "a", Some(("Job", "report")), "report");
    let mut facts = ClusterFacts {
        nodes: vec![node("a")],
        pods: vec![job],
        budgets: vec![BudgetFacts { selector: None, ..budget("shop", "none", "x", 0, 0, 0) }],
        ..ClusterFacts::default()
    };
    let config = PreflightConfig::default();
    assert_eq!(Preflight::new(&facts, &config).blockers("a"), vec![], "no selector covers no pod");
    facts.budgets[0].selector = Some(LabelSelector::default());
    assert!(
        matches!(&Preflight::new(&facts, &config).blockers("a")[..], [Blocker::BudgetAtZero { .. }]),
        "empty: every pod"
    );
    facts.budgets[0].selector = Some(LabelSelector {
        match_expressions: vec![LabelSelectorRequirement {
            key: "app".into(),
            operator: "Near".into(),
            values: vec![],
        }],
        ..LabelSelector::default()
    });
    let blockers = Preflight::new(&facts, &config).blockers("a");
    assert!(matches!(&blockers[..], [Blocker::BudgetUnreadable { .. }]), "{blockers:?}");
    assert!(blockers[0].to_string().contains("unknown operator \"Near\""), "{}", blockers[0]);
    // A budget in another namespace never covers the pod.
    facts.budgets[0].namespace = "other".into();
    assert_eq!(Preflight::new(&facts, &config).blockers("a"), vec![]);
}

#[test]
fn a_single_replica_stateful_set_and_a_bare_replica_set_are_single_replicas() {
    let facts = ClusterFacts {
        nodes: vec![node("a")],
        pods: vec![
            pod("db", "pg-0", "a", Some(("StatefulSet", "pg")), "pg"),
            pod("db", "cache-x", "a", Some(("ReplicaSet", "cache")), "cache"),
            pod("db", "unknown-x", "a", Some(("StatefulSet", "unknown")), "unknown"),
        ],
        workloads: vec![WorkloadFacts {
            kind: WorkloadKind::StatefulSet,
            namespace: "db".into(),
            name: "pg".into(),
            replicas: 1,
        }],
        replica_sets: vec![ReplicaSetFacts {
            namespace: "db".into(),
            name: "cache".into(),
            replicas: 1,
            deployment: None,
        }],
        ..ClusterFacts::default()
    };
    let lines: Vec<String> =
        Preflight::new(&facts, &PreflightConfig::default()).blockers("a").iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec![
            "StatefulSet db/pg has 1 replica: it goes down while a drains",
            "ReplicaSet db/cache has 1 replica: it goes down while a drains",
        ],
        "a workload not observed (unknown) is not judged"
    );
}

fn arbitrary_cluster() -> impl Strategy<Value = ClusterFacts> {
    let nodes = ["n1", "n2", "n3"];
    let namespaces = ["shop", "kube-system"];
    let apps = ["web", "db"];
    let pods = prop::collection::vec((0..3usize, 0..2usize, 0..2usize, any::<bool>(), 0..3usize), 0..12);
    let budgets = prop::collection::vec((0..2usize, 0..2usize, -1..3i32), 0..4);
    let workloads = prop::collection::vec((0..2usize, 0..2usize, 0..4i32), 0..4);
    let node_states = prop::collection::vec((any::<bool>(), any::<bool>(), any::<bool>()), 3);
    (pods, budgets, workloads, node_states).prop_map(move |(pods, budgets, workloads, states)| {
        let owners = ["ReplicaSet", "StatefulSet", "DaemonSet"];
        ClusterFacts {
            nodes: nodes
                .iter()
                .zip(states)
                .map(|(n, (ready, unschedulable, by_operation))| NodeFacts {
                    name: (*n).into(),
                    ready,
                    unschedulable,
                    by_operation,
                    cordoned_by: None,
                })
                .collect(),
            pods: pods
                .into_iter()
                .enumerate()
                .map(|(i, (n, ns, app, ready, owner))| {
                    let mut p =
                        pod(namespaces[ns], &format!("p{i}"), nodes[n], Some((owners[owner], apps[app])), apps[app]);
                    p.ready = ready;
                    p
                })
                .collect(),
            budgets: budgets
                .into_iter()
                .map(|(ns, app, allowed)| budget(namespaces[ns], apps[app], apps[app], allowed, 1, 1))
                .collect(),
            workloads: workloads
                .iter()
                .map(|&(ns, app, replicas)| WorkloadFacts {
                    kind: WorkloadKind::StatefulSet,
                    namespace: namespaces[ns].into(),
                    name: apps[app].into(),
                    replicas,
                })
                .collect(),
            replica_sets: workloads
                .iter()
                .map(|&(ns, app, replicas)| ReplicaSetFacts {
                    namespace: namespaces[ns].into(),
                    name: apps[app].into(),
                    replicas,
                    deployment: None,
                })
                .collect(),
        }
    })
}

proptest! {
    /// Nothing in an ignored namespace is ever a blocker, and adding to it changes nothing.
    #[test]
    fn ignored_namespaces_never_block(facts in arbitrary_cluster(), node in prop::sample::select(vec!["n1", "n2", "n3"])) {
        let config = PreflightConfig::default();
        let blockers = Preflight::new(&facts, &config).blockers(node);
        for b in &blockers {
            let namespace = match b {
                Blocker::BudgetAtZero { namespace, .. }
                | Blocker::BudgetUnreadable { namespace, .. }
                | Blocker::SingleReplica { namespace, .. }
                | Blocker::AllReadyPodsOnNode { namespace, .. }
                | Blocker::AllReadyPodsOnNodesDownTogether { namespace, .. } => namespace.as_str(),
                Blocker::NodeNotReady { .. } | Blocker::NodeCordoned { .. } | Blocker::NotObserved { .. } => continue,
            };
            prop_assert_ne!(namespace, "kube-system");
        }
        let without: ClusterFacts = ClusterFacts {
            pods: facts.pods.iter().filter(|p| p.namespace != "kube-system").cloned().collect(),
            budgets: facts.budgets.iter().filter(|b| b.namespace != "kube-system").cloned().collect(),
            ..facts.clone()
        };
        prop_assert_eq!(Preflight::new(&without, &config).blockers(node), blockers);
    }

    /// Judging a node with others down beside it only adds blockers: whatever blocks it
    /// alone still does (as itself or as the set's), and a set of none is the node alone.
    #[test]
    fn nodes_down_together_only_add_blockers(facts in arbitrary_cluster(), node in prop::sample::select(vec!["n1", "n2", "n3"]), other in prop::sample::select(vec!["n1", "n2", "n3"])) {
        let config = PreflightConfig::default();
        let gate = Preflight::new(&facts, &config);
        let alone = gate.blockers(node);
        prop_assert_eq!(&gate.blockers_with(node, &[]), &alone);
        let together = gate.blockers_with(node, &[other]);
        for b in &alone {
            let kept = together.contains(b) || match b {
                Blocker::AllReadyPodsOnNode { namespace, name, .. } => together.iter().any(|t| matches!(t,
                    Blocker::AllReadyPodsOnNodesDownTogether { namespace: n, name: w, .. } if n == namespace && w == name)),
                _ => false,
            };
            prop_assert!(kept, "{} lost beside {}: {:?}", b, other, together);
        }
    }

    /// A node's workload and budget blockers are about pods a drain of that node evicts:
    /// with no such pod on it, only other nodes can block it.
    #[test]
    fn a_node_with_nothing_to_evict_is_blocked_only_by_other_nodes(facts in arbitrary_cluster(), node in prop::sample::select(vec!["n1", "n2", "n3"])) {
        let mut emptied = facts.clone();
        emptied.pods.retain(|p| p.node.as_deref() != Some(node) || p.owner.as_ref().is_some_and(|o| o.kind == "DaemonSet"));
        let config = PreflightConfig::default();
        for b in Preflight::new(&emptied, &config).blockers(node) {
            prop_assert!(matches!(b, Blocker::NodeNotReady { .. } | Blocker::NodeCordoned { .. }), "{}", b);
        }
    }
}

#[test]
fn a_node_another_operation_left_cordoned_blocks_and_says_whose_it_is() {
    let mut left = node("c");
    left.unschedulable = true;
    left.cordoned_by = Some("ichor-system/remove-cp/7f3a".into());
    let facts = ClusterFacts { nodes: vec![node("a"), left], ..ClusterFacts::default() };
    let blockers = Preflight::new(&facts, &PreflightConfig::default()).blockers("a");
    assert_eq!(
        blockers,
        vec![Blocker::NodeCordoned { node: "c".into(), operation: Some("ichor-system/remove-cp/7f3a".into()) }]
    );
    let said = blockers[0].to_string();
    assert!(said.contains("cordoned by operation ichor-system/remove-cp/7f3a"), "{said}");
    let json = serde_json::to_value(&blockers[0]).unwrap();
    assert_eq!(json["operation"], "ichor-system/remove-cp/7f3a");
    let person = serde_json::to_value(Blocker::NodeCordoned { node: "c".into(), operation: None }).unwrap();
    assert!(person.get("operation").is_none(), "a person's cordon is written as before: {person}");
}

#[test]
fn two_nodes_down_together_that_hold_every_ready_pod_block_the_second() {
    // web has a Ready pod on a and one on b, none elsewhere: each node alone is clear
    // (the other keeps one), but with a down (past its call), b is not.
    let (web, web_rs) = deployment("shop", "web", 2);
    let owner = Some(("ReplicaSet", "web-5d4f"));
    let mut facts = ClusterFacts {
        nodes: ["a", "b", "c"].map(node).into(),
        pods: vec![pod("shop", "web-1", "a", owner, "web"), pod("shop", "web-2", "b", owner, "web")],
        workloads: vec![web],
        replica_sets: vec![web_rs],
        ..ClusterFacts::default()
    };
    let config = PreflightConfig::default();
    let gate = Preflight::new(&facts, &config);
    assert_eq!(gate.blockers("b"), vec![], "alone, b is clear");
    let together = gate.blockers_with("b", &["a"]);
    assert_eq!(
        together.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["Deployment shop/web: all 2 Ready pods of 2 run on b and a, which would be down together"]
    );
    assert_eq!(gate.blockers_with("b", &["c"]), vec![], "a node down elsewhere holds none of them");
    // Once a's pod is gone (drained) the question is b's alone, as before.
    facts.pods[0].ready = false;
    let gate = Preflight::new(&facts, &config);
    assert_eq!(
        gate.blockers_with("b", &["a"]).iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["Deployment shop/web: all 1 Ready pods of 2 run on b"]
    );
    // A third Ready pod on c clears it.
    facts.pods[0].ready = true;
    facts.pods.push(pod("shop", "web-3", "c", owner, "web"));
    assert_eq!(Preflight::new(&facts, &config).blockers_with("b", &["a"]), vec![]);
}
