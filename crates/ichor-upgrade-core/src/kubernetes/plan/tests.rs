use super::*;

fn k(text: &str) -> KubernetesVersion {
    KubernetesVersion::parse(text).unwrap()
}

fn control_plane(name: &str, version: &str) -> NodeKubernetes {
    NodeKubernetes {
        name: name.into(),
        role: MachineRole::ControlPlane,
        talos: TalosVersion::parse("v1.14.3").unwrap(),
        kubelet: Some(k(version)),
        control_plane: Component::CONTROL_PLANE.iter().map(|c| (*c, k(version))).collect(),
    }
}

fn worker(name: &str, version: &str) -> NodeKubernetes {
    NodeKubernetes {
        name: name.into(),
        role: MachineRole::Worker,
        talos: TalosVersion::parse("v1.14.3").unwrap(),
        kubelet: Some(k(version)),
        control_plane: BTreeMap::new(),
    }
}

fn plan(
    target: &str,
    nodes: &[NodeKubernetes],
    proxy: Option<&str>,
) -> Result<KubernetesPlan, Vec<KubernetesPlanProblem>> {
    let target = k(target);
    let proxy = proxy.map(k);
    plan_kubernetes(&KubernetesPlanInput {
        target: &target,
        nodes,
        deprecated_apis: &[],
        kube_proxy: proxy.as_ref(),
        args: &[],
    })
}

fn reasons(problems: &[KubernetesPlanProblem]) -> Vec<&'static str> {
    problems.iter().map(KubernetesPlanProblem::reason).collect()
}

#[test]
fn the_steps_follow_talos_order_control_planes_one_by_one_then_kube_proxy_then_kubelets() {
    let nodes = [worker("w-1", "1.34.1"), control_plane("cp-1", "1.34.1"), control_plane("cp-2", "1.34.1")];
    let planned = plan("1.35.0", &nodes, Some("1.34.1")).unwrap();
    let steps: Vec<String> = planned.steps().iter().map(ToString::to_string).collect();
    assert_eq!(
        steps,
        [
            "cp-1/kube-apiserver",
            "cp-1/kube-controller-manager",
            "cp-1/kube-scheduler",
            "cp-2/kube-apiserver",
            "cp-2/kube-controller-manager",
            "cp-2/kube-scheduler",
            "kube-proxy",
            "cp-1/kubelet",
            "cp-2/kubelet",
            "w-1/kubelet",
        ]
    );
}

#[test]
fn what_is_on_the_target_already_is_not_a_step_and_a_finished_upgrade_plans_nothing() {
    let mut half = control_plane("cp-1", "1.34.1");
    half.control_plane.insert(Component::KubeApiserver, k("1.35.0"));
    let nodes = [half, control_plane("cp-2", "1.35.0"), worker("w-1", "1.35.0")];
    let planned = plan("1.35.0", &nodes, Some("1.35.0")).unwrap();
    let steps: Vec<String> = planned.steps().iter().map(ToString::to_string).collect();
    assert_eq!(steps, ["cp-1/kube-controller-manager", "cp-1/kube-scheduler", "cp-1/kubelet"]);
    let done = [control_plane("cp-1", "1.35.0"), worker("w-1", "1.35.0")];
    assert!(plan("1.35.0", &done, None).unwrap().is_empty());
}

#[test]
fn a_skipped_minor_and_a_downgrade_are_refused_naming_node_component_and_version() {
    let nodes = [control_plane("cp-1", "1.33.4"), worker("w-1", "1.33.4")];
    let problems = plan("1.35.0", &nodes, None).unwrap_err();
    assert_eq!(reasons(&problems), ["KubernetesSkipsMinor"], "one problem per version skipped from: {problems:?}");
    let text = problems[0].to_string();
    assert!(
        text.contains("cp-1/kube-apiserver, cp-1/kube-controller-manager, cp-1/kube-scheduler run 1.33.4")
            && text.contains("1.34.x first"),
        "{text}"
    );
    let mut mixed = control_plane("cp-2", "1.34.1");
    mixed.control_plane.insert(Component::KubeScheduler, k("1.33.4"));
    let problems = plan("1.36.0", &[mixed], Some("1.34.1")).unwrap_err();
    let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(reasons(&problems), ["KubernetesSkipsMinor"; 2], "{texts:?}");
    assert!(texts[0].contains("cp-2/kube-scheduler run 1.33.4; upgrade to 1.34.x first"), "{texts:?}");
    assert!(texts[1].contains("cluster/kube-proxy run 1.34.1; upgrade to 1.35.x first"), "{texts:?}");

    // Issue 55 (papercuts): a downgrade was a sentence per component per node; it is one
    // per version, the components that share their nodes named together.
    let problems = plan("1.34.0", &[control_plane("cp-1", "1.34.2")], None).unwrap_err();
    assert_eq!(reasons(&problems), ["KubernetesDowngrade"], "{problems:?}");
    assert_eq!(
        problems[0].to_string(),
        "Kubernetes 1.34.0 would downgrade kube-apiserver, kube-controller-manager, kube-scheduler, kubelet on cp-1 \
         from 1.34.2; downgrades are not supported"
    );
    let mut nodes: Vec<NodeKubernetes> = (1..=3).map(|n| control_plane(&format!("cp-{n}"), "1.34.2")).collect();
    nodes.extend((1..=10).map(|n| worker(&format!("worker-{n}"), "1.34.2")));
    let problems = plan("1.34.0", &nodes, Some("1.34.2")).unwrap_err();
    assert_eq!(reasons(&problems), ["KubernetesDowngrade"], "{problems:?}");
    let text = problems[0].to_string();
    assert!(text.contains("kube-apiserver, kube-controller-manager, kube-scheduler on cp-1, cp-2, cp-3;"), "{text}");
    assert!(
        text.contains(
            "kubelet on 13 nodes (cp-1, cp-2, cp-3, worker-1, worker-2, worker-3, worker-4, worker-5 and 5 more)"
        ),
        "{text}"
    );
    assert!(text.contains("; kube-proxy from 1.34.2"), "{text}");
    assert_eq!(text.matches("downgrades are not supported").count(), 1, "{text}");
    let problems = plan("1.35.0-rc.1", &[control_plane("cp-1", "1.35.0")], None).unwrap_err();
    assert_eq!(reasons(&problems)[0], "KubernetesDowngrade", "a release down to its own pre-release");
}

#[test]
fn a_target_some_node_s_talos_does_not_support_is_refused_naming_the_nodes_and_the_range() {
    let mut old = worker("w-old", "1.34.1");
    old.talos = TalosVersion::parse("v1.10.7").unwrap();
    let nodes = [control_plane("cp-1", "1.34.1"), old];
    let problems = plan("1.35.0", &nodes, None).unwrap_err();
    assert_eq!(reasons(&problems), ["KubernetesUnsupportedByTalos"]);
    let text = problems[0].to_string();
    assert!(text.starts_with("w-old: ") && text.contains("1.28.0 to 1.33.x"), "{text}");
}

#[test]
fn removed_apis_in_use_are_refused_by_resource_and_count_and_others_left_be() {
    let nodes = [control_plane("cp-1", "1.34.1")];
    let target = k("1.35.0");
    let api = |resource: &str, removed: &str, count: u64| DeprecatedApiUse {
        group: "flowcontrol.apiserver.k8s.io".into(),
        version: "v1beta3".into(),
        resource: resource.into(),
        removed_release: removed.into(),
        count,
        seen_as: ApiUseSeenAs::Requests,
    };
    let stored = DeprecatedApiUse {
        group: "resource.k8s.io".into(),
        version: "v1beta2,v1beta1".into(),
        resource: "resourceslices".into(),
        removed_release: "1.35".into(),
        count: 4,
        seen_as: ApiUseSeenAs::StoredObjects,
    };
    let uses = [
        api("flowschemas", "1.35", 12),
        api("prioritylevelconfigurations", "1.36", 3),
        api("other", "1.35", 0),
        stored,
    ];
    let input =
        KubernetesPlanInput { target: &target, nodes: &nodes, deprecated_apis: &uses, kube_proxy: None, args: &[] };
    let problems = plan_kubernetes(&input).unwrap_err();
    assert_eq!(reasons(&problems), ["RemovedApisInUse"]);
    let text = problems[0].to_string();
    assert!(text.contains("flowschemas.flowcontrol.apiserver.k8s.io/v1beta3 (12 uses, removed in 1.35)"), "{text}");
    assert!(
        text.contains(
            "resourceslices.resource.k8s.io/v1beta2,v1beta1 (4 stored objects, served by no version from 1.35 on)"
        ),
        "{text}"
    );
    assert!(!text.contains("prioritylevelconfigurations"), "removed later: not this target's concern: {text}");
    assert!(!text.contains("other"), "no use, no problem: {text}");
    assert!(api("x", "garbage", 1).removed_by(&target), "an unreadable release is never guessed safe");
}

#[test]
fn a_version_not_observed_is_refused_never_guessed() {
    let mut blind = control_plane("cp-1", "1.34.1");
    blind.control_plane.remove(&Component::KubeScheduler);
    let mut no_node = worker("w-1", "1.34.1");
    no_node.kubelet = None;
    let problems = plan("1.35.0", &[blind, no_node], None).unwrap_err();
    assert_eq!(reasons(&problems), ["KubernetesVersionNotObserved"; 2]);
    assert!(problems[0].to_string().contains("cp-1's kube-scheduler"));
    assert!(problems[1].to_string().contains("w-1's kubelet"));
}

#[test]
fn a_kubelet_the_target_would_leave_more_than_three_minors_behind_is_refused() {
    let nodes = [control_plane("cp-1", "1.34.1"), worker("w-ok", "1.32.0"), worker("w-old", "1.31.9")];
    let problems = plan("1.35.0", &nodes, None).unwrap_err();
    assert_eq!(reasons(&problems), ["KubeletTooOld"]);
    assert!(problems[0].to_string().contains("w-old (1.31.9)") && !problems[0].to_string().contains("w-ok"));
}
