//! Properties of a Kubernetes upgrade's plan over random clusters (1 to 5 control planes,
//! 0 to 40 workers, every component either on the cluster's version or already on the
//! target, as a resumed upgrade finds them):
//! - the order is Talos's: every control-plane component before kube-proxy, kube-proxy
//!   before every kubelet, control planes' kubelets before workers', each control plane's
//!   components together and in the order apiserver, controller manager, scheduler;
//! - what is on the target is never a step, and what is not always is;
//! - carrying the steps out, in any prefix, leaves a plan of exactly the rest (resumable),
//!   and the whole leaves nothing (done is done);
//! - a target two minors up is always refused, never planned.

use std::collections::BTreeMap;

use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::plan::{KubernetesPlanInput, KubernetesStep, NodeKubernetes, plan_kubernetes};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};
use proptest::prelude::*;

const FROM: &str = "1.34.2";
const TO: &str = "1.35.0";

fn k(text: &str) -> KubernetesVersion {
    KubernetesVersion::parse(text).unwrap()
}

/// A node whose components are each on the target when their bit is set.
fn node(name: String, role: MachineRole, done: u8) -> NodeKubernetes {
    let version = |bit: u8| k(if done & (1 << bit) != 0 { TO } else { FROM });
    let control_plane = if role == MachineRole::ControlPlane {
        Component::CONTROL_PLANE.iter().enumerate().map(|(i, c)| (*c, version(u8::try_from(i).unwrap()))).collect()
    } else {
        BTreeMap::new()
    };
    NodeKubernetes {
        name,
        role,
        talos: TalosVersion::parse("v1.14.3").unwrap(),
        kubelet: Some(version(3)),
        control_plane,
    }
}

fn cluster() -> impl Strategy<Value = (Vec<NodeKubernetes>, Option<bool>)> {
    (prop::collection::vec(0u8..16, 1..=5), prop::collection::vec(0u8..16, 0..=40), prop::option::of(any::<bool>()))
        .prop_map(|(cps, workers, proxy)| {
            let mut nodes: Vec<NodeKubernetes> = cps
                .into_iter()
                .enumerate()
                .map(|(i, done)| node(format!("cp-{i}"), MachineRole::ControlPlane, done))
                .collect();
            nodes.extend(
                workers.into_iter().enumerate().map(|(i, done)| node(format!("w-{i}"), MachineRole::Worker, done)),
            );
            (nodes, proxy)
        })
        // Nodes come in any order (a worker listed before a control plane).
        .prop_flat_map(|(nodes, proxy)| (Just(nodes).prop_shuffle(), Just(proxy)))
}

fn steps_of(nodes: &[NodeKubernetes], proxy: Option<&KubernetesVersion>) -> Vec<KubernetesStep> {
    let target = k(TO);
    let input = KubernetesPlanInput { target: &target, nodes, deprecated_apis: &[], kube_proxy: proxy, args: &[] };
    plan_kubernetes(&input).expect("one minor up from a supported version plans").steps()
}

/// `nodes` with `step` carried out.
fn carry_out(nodes: &mut [NodeKubernetes], proxy: &mut Option<KubernetesVersion>, step: &KubernetesStep) {
    match (&step.node, step.component) {
        (None, _) => *proxy = Some(k(TO)),
        (Some(name), component) => {
            let node = nodes.iter_mut().find(|n| &n.name == name).unwrap();
            if component == Component::Kubelet {
                node.kubelet = Some(k(TO));
            } else {
                node.control_plane.insert(component, k(TO));
            }
        }
    }
}

fn rank(step: &KubernetesStep, nodes: &[NodeKubernetes]) -> u8 {
    let role = step.node.as_ref().and_then(|n| nodes.iter().find(|x| &x.name == n)).map(|n| n.role);
    match (step.component, role) {
        (Component::Kubelet, Some(MachineRole::ControlPlane)) => 2,
        (Component::Kubelet, _) => 3,
        (Component::KubeProxy, _) => 1,
        _ => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_plan_keeps_talos_order_and_resumes_with_exactly_what_is_left(
        (nodes, proxy) in cluster(),
        cut in 0usize..200,
    ) {
        let proxy_version = proxy.map(|done| k(if done { TO } else { FROM }));
        let steps = steps_of(&nodes, proxy_version.as_ref());
        // Talos's order.
        let ranks: Vec<u8> = steps.iter().map(|s| rank(s, &nodes)).collect();
        prop_assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
        let components: Vec<&KubernetesStep> = steps.iter().filter(|s| rank(s, &nodes) == 0).collect();
        for pair in components.windows(2) {
            if pair[0].node == pair[1].node {
                prop_assert!(pair[0].component < pair[1].component, "{pair:?}");
            }
        }
        let mut seen = Vec::new();
        for step in &components {
            if seen.last() != Some(&step.node) {
                prop_assert!(!seen.contains(&step.node), "a control plane's components together: {steps:?}");
                seen.push(step.node.clone());
            }
        }
        // Exactly what is off the target.
        let off: usize = nodes.iter().map(|n| {
            n.control_plane.values().filter(|v| v.to_string() != TO).count()
                + usize::from(n.kubelet.as_ref().is_some_and(|v| v.to_string() != TO))
        }).sum::<usize>() + usize::from(proxy == Some(false));
        prop_assert_eq!(steps.len(), off);
        // Resumable: a prefix carried out leaves the rest, in the same order.
        let cut = cut.min(steps.len());
        let (mut after, mut proxy_after) = (nodes.clone(), proxy_version.clone());
        for step in &steps[..cut] {
            carry_out(&mut after, &mut proxy_after, step);
        }
        prop_assert_eq!(steps_of(&after, proxy_after.as_ref()), steps[cut..].to_vec());
        for step in &steps[cut..] {
            carry_out(&mut after, &mut proxy_after, step);
        }
        prop_assert!(steps_of(&after, proxy_after.as_ref()).is_empty(), "done is done");
    }

    #[test]
    fn a_target_two_minors_up_is_refused_whatever_the_cluster((nodes, _) in cluster()) {
        let target = k("1.36.0");
        let behind = nodes.iter().any(|n| n.control_plane.values().any(|v| v.to_string() == FROM));
        let input = KubernetesPlanInput { target: &target, nodes: &nodes, deprecated_apis: &[], kube_proxy: None, args: &[] };
        let planned = plan_kubernetes(&input);
        prop_assert_eq!(planned.is_err(), behind, "{:?}", planned);
    }
}
