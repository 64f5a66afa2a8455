use super::*;
use crate::dry_run::tests::{Cluster, at, cluster, dry_run, operation};
use crate::dry_run::{calibration, status_patch};
use ichor_adapters::kubernetes::crd::{MachineStep, TalosOperationSpec, TalosOperationStatus};
use ichor_upgrade_core::kubernetes::args::ComponentArgs;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::plan::{ApiUseSeenAs, DeprecatedApiUse, NodeKubernetes};
use ichor_upgrade_core::machine::kubernetes::{KUBERNETES_UPGRADE, reason};
use ichor_upgrade_core::preflight::ClusterFacts;
use ichor_upgrade_core::versions::KubernetesVersion;
use std::collections::BTreeMap;

fn k(text: &str) -> KubernetesVersion {
    KubernetesVersion::parse(text).unwrap()
}

fn seen(name: &str, role: MachineRole, version: &str) -> NodeKubernetes {
    NodeKubernetes {
        name: name.into(),
        role,
        talos: TalosVersion::parse("v1.14.3").unwrap(),
        kubelet: Some(k(version)),
        control_plane: match role {
            MachineRole::ControlPlane => Component::CONTROL_PLANE.iter().map(|c| (*c, k(version))).collect(),
            MachineRole::Worker => BTreeMap::new(),
        },
    }
}

/// A dry run of a Kubernetes upgrade of [`cluster`] to 1.35.0, made at 2,000: cp-1,
/// w-1 and w-2 on 1.34.1, w-3 on the target already.
fn kubernetes_dry_run(c: &mut Cluster) -> KubernetesRead {
    let mut op = (*c.operations[1]).clone();
    op.spec = TalosOperationSpec { kind: "kubernetes".into(), target_version: "1.35.0".into(), ..op.spec };
    c.operations[1] = Arc::new(op);
    KubernetesRead {
        nodes: vec![
            seen("cp-1", MachineRole::ControlPlane, "1.34.1"),
            seen("w-1", MachineRole::Worker, "1.34.1"),
            seen("w-2", MachineRole::Worker, "1.34.1"),
            seen("w-3", MachineRole::Worker, "1.35.0"),
        ],
        deprecated_apis: Vec::new(),
        kube_proxy: Some(k("1.34.1")),
        args: Vec::new(),
        unread: Vec::new(),
    }
}

#[test]
fn it_names_each_change_removed_api_and_flag_and_every_refusal_with_a_plan_from_talos_history() {
    let mut c = cluster();
    let mut read = kubernetes_dry_run(&mut c);
    read.deprecated_apis.push(DeprecatedApiUse {
        group: "flowcontrol.apiserver.k8s.io".into(),
        version: "v1beta3".into(),
        resource: "flowschemas".into(),
        removed_release: "1.35".into(),
        count: 3,
        seen_as: ApiUseSeenAs::Requests,
    });
    read.args.push(ComponentArgs {
        node: "w-1".into(),
        component: Component::Kubelet,
        args: vec![("pod-infra-container-image".into(), "registry.k8s.io/pause:3.10".into())],
    });
    read.unread.push(("w-2".into(), "connection refused".into()));
    let plan = plan_status(&dry_run(&c, ClusterFacts::default()), &read).unwrap();
    let found = plan.kubernetes.as_ref().unwrap();
    let changes: Vec<String> =
        found.changes.iter().map(|c| format!("{}/{} {}->{}", c.node, c.component, c.from, c.to)).collect();
    assert_eq!(
        changes,
        [
            "cp-1/kube-apiserver 1.34.1->1.35.0",
            "cp-1/kube-controller-manager 1.34.1->1.35.0",
            "cp-1/kube-scheduler 1.34.1->1.35.0",
            "cluster/kube-proxy 1.34.1->1.35.0",
            "cp-1/kubelet 1.34.1->1.35.0",
            "w-1/kubelet 1.34.1->1.35.0",
            "w-2/kubelet 1.34.1->1.35.0",
        ]
    );
    assert_eq!(plan.order, ["cp-1", "w-1", "w-2"], "w-3 runs the target: no turn");
    assert_eq!(
        (found.removed_apis[0].resource.as_str(), found.removed_apis[0].count, found.removed_apis.len()),
        ("flowschemas", 3, 1)
    );
    assert_eq!((found.removed_flags[0].node.as_str(), found.removed_flags[0].kind.as_str()), ("w-1", "flag"));
    let reasons: Vec<&str> = found.refusals.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons, ["RemovedApisInUse", "RemovedArgsInUse"]);
    // No Kubernetes upgrade recorded: the last Talos upgrade's turns, said so.
    assert_eq!(plan.history.as_deref(), Some("first"));
    let said = plan.assumed.join("\n");
    assert!(said.contains("no Kubernetes upgrade of this cluster is recorded"), "{said}");
    assert!(said.contains("w-2's configuration was not read (connection refused)"), "{said}");
    assert!(said.contains("1 machines already run Kubernetes 1.35.0"), "{said}");
    let status = status_patch(&c.operations[1], &Ok(plan), at(5));
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("7 component changes"), "{message}");
    assert!(message.contains("would be refused: RemovedApisInUse, RemovedArgsInUse"), "{message}");
    assert_eq!(status["plan"]["kubernetes"]["removedFlags"][0]["name"], "pod-infra-container-image");
}

/// Each of `machines` recorded a Kubernetes turn: applied at `at`, converged 20 s on.
fn kubernetes_turns(c: &mut Cluster, at_s: i64) {
    for (k, machine) in c.machines.iter_mut().enumerate() {
        let start = at_s + 22 * i64::try_from(k).unwrap();
        let step = |reason: &str, secs: i64| MachineStep {
            type_: KUBERNETES_UPGRADE.into(),
            status: "True".into(),
            reason: reason.into(),
            time: at(secs),
            bytes: None,
            seconds: None,
        };
        let history = &mut Arc::make_mut(machine).status.as_mut().unwrap().history;
        history.push(step(reason::APPLY_REQUESTED, start));
        history.push(step(reason::VERIFIED, start + 15));
        history.push(step(reason::CONVERGED, start + 20));
    }
}

#[test]
fn the_last_kubernetes_upgrade_times_it_when_there_is_one_and_an_unobserved_machine_is_refused() {
    let mut c = cluster();
    let mut read = kubernetes_dry_run(&mut c);
    let from_talos = plan_status(&dry_run(&c, ClusterFacts::default()), &read).unwrap();
    let mut earlier = (*operation("k8s-first", 1_600, Some(1_700), false)).clone();
    earlier.spec.kind = "kubernetes".into();
    c.operations.push(Arc::new(earlier));
    kubernetes_turns(&mut c, 1_610);
    let plan = plan_status(&dry_run(&c, ClusterFacts::default()), &read).unwrap();
    assert_eq!(plan.history.as_deref(), Some("k8s-first"));
    assert!(!plan.assumed.join("\n").contains("Talos upgrade"), "{:?}", plan.assumed);
    assert!(
        plan.p50_seconds < from_talos.p50_seconds / 2.0,
        "20 s turns, not 60-100 s ones: {} against {}",
        plan.p50_seconds,
        from_talos.p50_seconds
    );
    // A machine whose Node was not read is a refusal, never a guess.
    read.nodes.retain(|n| n.name != "w-2");
    let plan = plan_status(&dry_run(&c, ClusterFacts::default()), &read).unwrap();
    let refusals = &plan.kubernetes.unwrap().refusals;
    assert_eq!(refusals[0].reason, "KubernetesVersionNotObserved");
    assert!(refusals[0].message.contains("w-2"), "{refusals:?}");
}

#[test]
fn a_kubernetes_upgrade_is_calibrated_against_a_kubernetes_dry_run_only() {
    let mut c = cluster();
    let _ = kubernetes_dry_run(&mut c);
    let mut planned = (*c.operations[1]).clone();
    planned.status = Some(TalosOperationStatus {
        phase: Some("Completed".into()),
        plan: Some(PlanStatus { p10_seconds: 50.0, p50_seconds: 60.0, p90_seconds: 70.0, ..PlanStatus::default() }),
        ..TalosOperationStatus::default()
    });
    c.operations[1] = Arc::new(planned);
    let mut real = (*operation("k8s", 2_100, Some(2_166), false)).clone();
    real.spec.kind = "kubernetes".into();
    let calibration = calibration(&real, &c.operations).unwrap();
    assert_eq!((calibration.plan.as_str(), calibration.error_percent, calibration.within_band), ("plan", 10.0, true));
    let talos = operation("talos", 2_100, Some(2_166), false);
    assert_eq!(
        crate::dry_run::calibration(&talos, &c.operations),
        None,
        "a Kubernetes plan says nothing of a Talos upgrade"
    );
}
