use std::collections::BTreeMap;

use super::*;
use crate::kubernetes::args::ComponentArgs;
use crate::kubernetes::plan::{ApiUseSeenAs, NodeKubernetes};
use crate::versions::TalosVersion;

fn k(text: &str) -> KubernetesVersion {
    KubernetesVersion::parse(text).unwrap()
}

fn node(name: &str, role: MachineRole, version: &str) -> NodeKubernetes {
    let control_plane = match role {
        MachineRole::ControlPlane => Component::CONTROL_PLANE.iter().map(|c| (*c, k(version))).collect(),
        MachineRole::Worker => BTreeMap::new(),
    };
    NodeKubernetes {
        name: name.into(),
        role,
        talos: TalosVersion::parse("v1.14.3").unwrap(),
        kubelet: Some(k(version)),
        control_plane,
    }
}

fn api(resource: &str, removed: &str, count: u64) -> DeprecatedApiUse {
    DeprecatedApiUse {
        group: "flowcontrol.apiserver.k8s.io".into(),
        version: "v1beta3".into(),
        resource: resource.into(),
        removed_release: removed.into(),
        count,
        seen_as: ApiUseSeenAs::Requests,
    }
}

fn found(
    target: &str,
    nodes: &[NodeKubernetes],
    proxy: Option<&str>,
    apis: &[DeprecatedApiUse],
    args: &[ComponentArgs],
) -> KubernetesFindings {
    let (target, proxy) = (k(target), proxy.map(k));
    findings(&KubernetesPlanInput { target: &target, nodes, deprecated_apis: apis, kube_proxy: proxy.as_ref(), args })
}

fn shown(changes: &[ComponentChange]) -> Vec<String> {
    changes
        .iter()
        .map(|c| format!("{}/{} {}->{}", c.node.as_deref().unwrap_or("cluster"), c.component, c.from, c.to))
        .collect()
}

#[test]
fn each_change_is_named_on_its_node_from_its_version_in_the_order_the_upgrade_takes_them() {
    let mut half = node("cp-2", MachineRole::ControlPlane, "1.34.1");
    half.control_plane.insert(Component::KubeApiserver, k("1.35.0"));
    let nodes = [
        node("worker-1", MachineRole::Worker, "1.34.1"),
        node("cp-1", MachineRole::ControlPlane, "1.34.1"),
        half,
        node("worker-2", MachineRole::Worker, "1.35.0"),
    ];
    let found = found("1.35.0", &nodes, Some("1.34.0"), &[], &[]);
    assert_eq!(
        shown(&found.changes),
        [
            "cp-1/kube-apiserver 1.34.1->1.35.0",
            "cp-1/kube-controller-manager 1.34.1->1.35.0",
            "cp-1/kube-scheduler 1.34.1->1.35.0",
            "cp-2/kube-controller-manager 1.34.1->1.35.0",
            "cp-2/kube-scheduler 1.34.1->1.35.0",
            "cluster/kube-proxy 1.34.0->1.35.0",
            "cp-1/kubelet 1.34.1->1.35.0",
            "cp-2/kubelet 1.34.1->1.35.0",
            "worker-1/kubelet 1.34.1->1.35.0",
        ]
    );
    assert!(found.refusals.is_empty() && found.removed_apis.is_empty() && found.removed_args.is_empty());
    assert_eq!(found.nodes_changing(), ["cp-1", "cp-2", "worker-1"], "worker-2 is on the target: left be");
    // The same steps the engine's plan takes, in the same order.
    let (target, proxy) = (k("1.35.0"), k("1.34.0"));
    let input = KubernetesPlanInput {
        target: &target,
        nodes: &nodes,
        deprecated_apis: &[],
        kube_proxy: Some(&proxy),
        args: &[],
    };
    let steps: Vec<(Option<String>, Component)> =
        plan_kubernetes(&input).unwrap().steps().into_iter().map(|s| (s.node, s.component)).collect();
    let changes: Vec<(Option<String>, Component)> =
        found.changes.iter().map(|c| (c.node.clone(), c.component)).collect();
    assert_eq!(changes, steps);
}

#[test]
fn removed_apis_and_flags_are_listed_and_refused_with_everything_else_found() {
    let nodes = [node("cp-1", MachineRole::ControlPlane, "1.34.1"), node("worker-1", MachineRole::Worker, "1.34.1")];
    let apis = [
        api("prioritylevelconfigurations", "1.35", 4),
        api("flowschemas", "1.35", 12),
        api("unused", "1.35", 0),
        api("later", "1.36", 7),
    ];
    let args = [ComponentArgs {
        node: "worker-1".into(),
        component: Component::Kubelet,
        args: vec![("pod-infra-container-image".into(), "registry.k8s.io/pause:3.10".into())],
    }];
    let found = found("1.35.0", &nodes, None, &apis, &args);
    let resources: Vec<&str> = found.removed_apis.iter().map(|a| a.resource.as_str()).collect();
    assert_eq!(resources, ["flowschemas", "prioritylevelconfigurations"], "used and removed by the target, sorted");
    assert_eq!(found.removed_args.len(), 1);
    assert_eq!(
        (found.removed_args[0].node.as_str(), found.removed_args[0].name.as_str()),
        ("worker-1", "pod-infra-container-image")
    );
    let reasons: Vec<&str> = found.refusals.iter().map(KubernetesPlanProblem::reason).collect();
    assert_eq!(reasons, ["RemovedApisInUse", "RemovedArgsInUse"]);
    // A report, not a refusal only: what would change is still listed.
    assert_eq!(found.changes.len(), 5, "{:?}", shown(&found.changes));
}

#[test]
fn what_is_not_observed_or_above_the_target_is_no_change_but_a_refusal() {
    let mut blind = node("cp-1", MachineRole::ControlPlane, "1.34.1");
    blind.control_plane.remove(&Component::KubeScheduler);
    let newer = node("worker-1", MachineRole::Worker, "1.36.0");
    let found = found("1.35.0", &[blind, newer], None, &[], &[]);
    assert_eq!(
        shown(&found.changes),
        [
            "cp-1/kube-apiserver 1.34.1->1.35.0",
            "cp-1/kube-controller-manager 1.34.1->1.35.0",
            "cp-1/kubelet 1.34.1->1.35.0"
        ]
    );
    let reasons: Vec<&str> = found.refusals.iter().map(KubernetesPlanProblem::reason).collect();
    assert_eq!(reasons, ["KubernetesDowngrade", "KubernetesVersionNotObserved"]);
}
