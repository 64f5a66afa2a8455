use std::collections::BTreeMap;

use super::*;
use crate::conditions::ConditionUpdate;

const T0: Timestamp = Timestamp::from_unix_millis(1_000_000);

fn v(text: &str) -> KubernetesVersion {
    KubernetesVersion::parse(text).unwrap()
}

/// A machine's world: its configuration, pods, kubelet and conditions.
struct Machine {
    role: MachineRole,
    stage: KubernetesStage,
    config: BTreeMap<Component, String>,
    pods: BTreeMap<Component, StaticPodObservation>,
    kubelet: KubeletObservation,
    conditions: Conditions,
    /// The oldest kube-apiserver of the cluster.
    api_servers: Option<KubernetesVersion>,
    stopped: bool,
}

impl Machine {
    fn new(role: MachineRole, stage: KubernetesStage) -> Self {
        let mut config = BTreeMap::new();
        let mut pods = BTreeMap::new();
        for c in Component::ALL {
            config.insert(c, target_image(c, None, &v("1.34.2")));
            if Component::CONTROL_PLANE.contains(&c) && role == MachineRole::ControlPlane {
                pods.insert(c, StaticPodObservation { version: Some(v("1.34.2")), ready: true, crash_looping: false });
            }
        }
        let kubelet = KubeletObservation { version: Some(v("1.34.2")), ready: true };
        let api_servers = Some(v("1.35.0"));
        Self { role, stage, config, pods, kubelet, conditions: Conditions::new(), api_servers, stopped: false }
    }

    fn step_at(&self, now: Timestamp) -> KubernetesAction {
        let target = v("1.35.0");
        kubernetes_step(&KubernetesStepInput {
            stage: self.stage,
            role: self.role,
            kube_proxy: true,
            target: &target,
            conditions: &self.conditions,
            config: Some(&self.config),
            pods: &self.pods,
            kubelet: Some(&self.kubelet),
            api_servers: self.api_servers.as_ref(),
            stopped: self.stopped,
            timeouts: &KubernetesTimeouts::default(),
            now,
        })
    }

    fn step(&self) -> KubernetesAction {
        self.step_at(T0)
    }

    fn record(&mut self, status: ConditionStatus, reason: &str, message: &str, at: Timestamp) {
        self.conditions.upsert(ConditionUpdate::new(KUBERNETES_UPGRADE, status, reason, message), at);
    }

    fn intend(&mut self, component: Component) {
        self.record(ConditionStatus::Unknown, reason::APPLY_REQUESTED, &apply_message(component, &v("1.35.0")), T0);
    }

    fn acknowledge(&mut self, component: Component) {
        self.record(ConditionStatus::True, reason::APPLIED, &apply_message(component, &v("1.35.0")), T0);
    }

    fn configure(&mut self, component: Component) {
        self.config
            .insert(component, target_image(component, self.config.get(&component).map(String::as_str), &v("1.35.0")));
    }

    fn pod_on_target(&mut self, component: Component, ready: bool) {
        self.pods.insert(component, StaticPodObservation { version: Some(v("1.35.0")), ready, crash_looping: false });
    }
}

fn control_plane() -> Machine {
    Machine::new(MachineRole::ControlPlane, KubernetesStage::ControlPlane)
}

#[test]
fn a_control_plane_starts_with_its_api_server_in_the_repository_it_uses() {
    let mut m = control_plane();
    m.config.insert(Component::KubeApiserver, "mirror.local:5000/k8s/kube-apiserver:v1.34.2".into());
    assert_eq!(
        m.step(),
        KubernetesAction::Apply {
            component: Component::KubeApiserver,
            image: "mirror.local:5000/k8s/kube-apiserver:v1.35.0".into()
        }
    );
}

#[test]
fn an_intent_whose_call_never_landed_is_applied_again_and_one_that_landed_is_only_recorded() {
    let mut m = control_plane();
    m.intend(Component::KubeApiserver);
    assert!(matches!(m.step(), KubernetesAction::Apply { component: Component::KubeApiserver, .. }));
    m.configure(Component::KubeApiserver);
    assert_eq!(m.step(), KubernetesAction::RecordApplied { component: Component::KubeApiserver });
}

#[test]
fn an_acknowledged_change_is_never_applied_a_second_time() {
    let mut m = control_plane();
    m.acknowledge(Component::KubeApiserver);
    // The configuration holds the old image again: someone changed the machine.
    let KubernetesAction::Fail(failure) = m.step() else { panic!("{:?}", m.step()) };
    assert_eq!(failure.reason(), "MachineConfigReverted");
    assert!(failure.to_string().contains("not applied again"), "{failure}");
}

#[test]
fn an_applied_component_is_waited_on_until_its_bound_then_fails_naming_what_was_seen() {
    let mut m = control_plane();
    m.configure(Component::KubeApiserver);
    m.acknowledge(Component::KubeApiserver);
    m.pod_on_target(Component::KubeApiserver, false);
    let deadline = T0.saturating_add(KubernetesTimeouts::default().component_ready);
    assert_eq!(
        m.step(),
        KubernetesAction::Wait {
            reason: KubernetesWait::ComponentNotReady { component: Component::KubeApiserver },
            recheck_at: Some(T0.saturating_add(KubernetesTimeouts::default().poll))
        },
        "looked at again at the poll, a mirror pod being no watch of the engine's"
    );
    let near = deadline.saturating_add(std::time::Duration::from_secs(0)).unix_millis() - 1_000;
    let KubernetesAction::Wait { recheck_at, .. } = m.step_at(Timestamp::from_unix_millis(near)) else { panic!() };
    assert_eq!(recheck_at, Some(deadline), "never past the bound");
    let KubernetesAction::Fail(failure) = m.step_at(deadline) else { panic!() };
    assert_eq!(failure.reason(), "ComponentNotReady");
    assert!(failure.to_string().contains("pod v1.35.0, not Ready"), "{failure}");
}

#[test]
fn a_component_crash_looping_on_the_target_fails_at_once() {
    let mut m = control_plane();
    m.configure(Component::KubeApiserver);
    m.acknowledge(Component::KubeApiserver);
    m.pods.insert(
        Component::KubeApiserver,
        StaticPodObservation { version: Some(v("1.35.0")), ready: false, crash_looping: true },
    );
    let KubernetesAction::Fail(failure) = m.step() else { panic!() };
    assert_eq!(failure.reason(), "ComponentCrashLoop");
    // The old version crash-looping is not the new one's failure: it is waited on.
    m.pods.get_mut(&Component::KubeApiserver).unwrap().version = Some(v("1.34.2"));
    assert!(matches!(m.step(), KubernetesAction::Wait { .. }));
}

#[test]
fn a_control_planes_components_go_in_order_and_its_record_ends_the_stage() {
    let mut m = control_plane();
    let target = v("1.35.0");
    for (i, component) in Component::CONTROL_PLANE.into_iter().enumerate() {
        assert!(matches!(m.step(), KubernetesAction::Apply { component: c, .. } if c == component), "step {i}");
        m.configure(component);
        m.acknowledge(component);
        assert!(past_apply(&m.conditions, &target, KubernetesStage::ControlPlane), "{component} in flight");
        m.pod_on_target(component, true);
        if i + 1 < Component::CONTROL_PLANE.len() {
            // Verified with another change to make: recorded, so that a hold, a pause or a
            // deletion stops the machine here, before its next change.
            assert_eq!(m.step(), KubernetesAction::RecordVerified { component }, "step {i}");
            m.record(ConditionStatus::True, reason::VERIFIED, &apply_message(component, &target), T0);
            assert_eq!(kubernetes_record(&m.conditions, &target), KubernetesRecord::Verified { component });
            assert!(!past_apply(&m.conditions, &target, KubernetesStage::ControlPlane), "nothing in flight");
            assert!(!control_plane_done(&m.conditions, &target));
        }
    }
    // The last change's verification is the stage's record itself.
    assert_eq!(m.step(), KubernetesAction::Converged { reason: reason::CONTROL_PLANE_CONVERGED });
    m.record(ConditionStatus::True, reason::CONTROL_PLANE_CONVERGED, "1.35.0", T0);
    assert!(control_plane_done(&m.conditions, &v("1.35.0")));
    assert!(!control_plane_done(&m.conditions, &v("1.36.0")), "a record is for its version only");
}

#[test]
fn a_control_planes_kubelet_stage_sets_kube_proxy_first_then_waits_for_its_node() {
    let mut m = Machine::new(MachineRole::ControlPlane, KubernetesStage::Kubelets);
    m.record(ConditionStatus::True, reason::CONTROL_PLANE_CONVERGED, "1.35.0", T0);
    assert!(matches!(m.step(), KubernetesAction::Apply { component: Component::KubeProxy, .. }));
    m.configure(Component::KubeProxy);
    m.acknowledge(Component::KubeProxy);
    assert_eq!(m.step(), KubernetesAction::RecordVerified { component: Component::KubeProxy });
    m.record(ConditionStatus::True, reason::VERIFIED, "kube-proxy v1.35.0", T0);
    assert!(control_plane_done(&m.conditions, &v("1.35.0")), "a kubelet-stage record is past the first stage");
    assert!(!past_apply(&m.conditions, &v("1.35.0"), KubernetesStage::Kubelets));
    let KubernetesAction::Apply { component: Component::Kubelet, image } = m.step() else { panic!() };
    assert_eq!(image, "ghcr.io/siderolabs/kubelet:v1.35.0");
    m.configure(Component::Kubelet);
    m.acknowledge(Component::Kubelet);
    m.kubelet.ready = false;
    assert!(matches!(m.step(), KubernetesAction::Wait { reason: KubernetesWait::KubeletNotBack, .. }));
    m.kubelet = KubeletObservation { version: Some(v("1.35.0")), ready: true };
    assert_eq!(m.step(), KubernetesAction::Converged { reason: reason::CONVERGED });
}

#[test]
fn a_kubelet_not_back_within_its_bound_fails() {
    let mut m = Machine::new(MachineRole::Worker, KubernetesStage::Kubelets);
    m.configure(Component::Kubelet);
    m.acknowledge(Component::Kubelet);
    m.kubelet = KubeletObservation { version: Some(v("1.34.2")), ready: false };
    let later = T0.saturating_add(KubernetesTimeouts::default().kubelet_ready);
    let KubernetesAction::Fail(failure) = m.step_at(later) else { panic!() };
    assert_eq!(failure.reason(), "KubeletNotBack");
    assert!(failure.to_string().contains("kubelet v1.34.2, Node NotReady"), "{failure}");
}

#[test]
fn a_machine_already_on_the_target_is_recorded_with_no_call() {
    let mut m = Machine::new(MachineRole::Worker, KubernetesStage::Kubelets);
    m.configure(Component::Kubelet);
    m.kubelet = KubeletObservation { version: Some(v("1.35.0")), ready: true };
    assert_eq!(m.step(), KubernetesAction::Converged { reason: reason::CONVERGED });
}

#[test]
fn an_unreadable_configuration_is_waited_on_never_guessed() {
    let m = Machine::new(MachineRole::Worker, KubernetesStage::Kubelets);
    let target = v("1.35.0");
    let action = kubernetes_step(&KubernetesStepInput {
        stage: m.stage,
        role: m.role,
        kube_proxy: false,
        target: &target,
        conditions: &m.conditions,
        config: None,
        pods: &m.pods,
        kubelet: Some(&m.kubelet),
        api_servers: m.api_servers.as_ref(),
        stopped: false,
        timeouts: &KubernetesTimeouts::default(),
        now: T0,
    });
    assert!(matches!(action, KubernetesAction::Wait { reason: KubernetesWait::ConfigUnreadable, .. }));
}

#[test]
fn the_stage_is_the_control_planes_until_every_one_is_recorded() {
    let target = v("1.35.0");
    let mut done = Conditions::new();
    let message = "1.35.0";
    done.upsert(
        ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::True, reason::CONTROL_PLANE_CONVERGED, message),
        T0,
    );
    let none = Conditions::new();
    let cp = MachineRole::ControlPlane;
    let worker = MachineRole::Worker;
    assert_eq!(kubernetes_stage([(cp, &done), (cp, &none), (worker, &none)], &target), KubernetesStage::ControlPlane);
    assert_eq!(kubernetes_stage([(cp, &done), (worker, &none)], &target), KubernetesStage::Kubelets);
    assert!(stage_converged(&done, &target, KubernetesStage::ControlPlane));
    assert!(!stage_converged(&done, &target, KubernetesStage::Kubelets));
}

#[test]
fn image_tags_are_read_past_ports_and_digests() {
    assert_eq!(image_tag("registry.k8s.io/kube-apiserver:v1.35.0"), Some("v1.35.0"));
    assert_eq!(image_tag("mirror:5000/kube-apiserver"), None);
    assert_eq!(image_tag("mirror:5000/kube-apiserver:v1.34.1@sha256:abc"), Some("v1.34.1"));
    assert_eq!(
        target_image(Component::KubeScheduler, Some("mirror:5000/kube-scheduler:v1.34.1@sha256:abc"), &v("1.35.0")),
        "mirror:5000/kube-scheduler:v1.35.0"
    );
    assert_eq!(target_image(Component::KubeProxy, Some(""), &v("1.35.0")), "registry.k8s.io/kube-proxy:v1.35.0");
    assert!(image_on("ghcr.io/siderolabs/kubelet:v1.35.0", &v("1.35.0")));
    assert!(!image_on("ghcr.io/siderolabs/kubelet:v1.35.0-rc.1", &v("1.35.0")));
}

#[test]
fn nothing_is_applied_to_a_node_that_is_not_ready() {
    let mut m = control_plane();
    m.kubelet.ready = false;
    assert!(matches!(m.step(), KubernetesAction::Wait { reason: KubernetesWait::NodeNotReady, .. }));
    // Past its apply, the same NotReady is the restart being waited on.
    m.configure(Component::KubeApiserver);
    m.acknowledge(Component::KubeApiserver);
    assert!(matches!(m.step(), KubernetesAction::Wait { reason: KubernetesWait::ComponentNotReady { .. }, .. }));
}

#[test]
fn a_resume_closes_a_failed_attempt_keeping_a_control_planes_first_stage() {
    let target = v("1.35.0");
    // A control plane failed in its first stage: the attempt closes, nothing recorded.
    let mut m = control_plane();
    m.configure(Component::KubeApiserver);
    m.acknowledge(Component::KubeApiserver);
    let (status, why, _) = retry_record(MachineRole::ControlPlane, &m.conditions, &target).unwrap();
    assert_eq!((status, why), (ConditionStatus::False, reason::RETRY));
    m.record(status, why, "resumed", T0);
    assert_eq!(kubernetes_record(&m.conditions, &target), KubernetesRecord::None);
    assert!(!past_apply(&m.conditions, &target, KubernetesStage::ControlPlane));
    // Started again: the configuration holds the change, recorded with no call, a new clock.
    assert_eq!(m.step(), KubernetesAction::RecordApplied { component: Component::KubeApiserver });

    // A control plane failed in the kubelets' stage keeps its first stage's record.
    let mut m = Machine::new(MachineRole::ControlPlane, KubernetesStage::Kubelets);
    m.record(ConditionStatus::True, reason::APPLIED, "kubelet v1.35.0", T0);
    let (status, why, message) = retry_record(MachineRole::ControlPlane, &m.conditions, &target).unwrap();
    assert_eq!((status, why, message.as_str()), (ConditionStatus::True, reason::CONTROL_PLANE_CONVERGED, "1.35.0"));
    m.record(status, why, &message, T0);
    assert!(control_plane_done(&m.conditions, &target), "the upgrade stays in its kubelets' stage");

    // A worker's failed kubelet: closed. Nothing recorded, or converged: nothing to close.
    let mut w = Machine::new(MachineRole::Worker, KubernetesStage::Kubelets);
    assert_eq!(retry_record(MachineRole::Worker, &w.conditions, &target), None);
    w.record(ConditionStatus::True, reason::APPLIED, "kubelet v1.35.0", T0);
    assert_eq!(retry_record(MachineRole::Worker, &w.conditions, &target).map(|r| r.1), Some(reason::RETRY));
    w.record(ConditionStatus::True, reason::CONVERGED, "1.35.0", T0);
    assert_eq!(retry_record(MachineRole::Worker, &w.conditions, &target), None);
}

#[test]
fn an_intent_that_never_reached_the_node_is_closed_when_the_machine_is_stopped() {
    // Issue 53 item 3: a deletion (or a pause, a hold) of an operation whose intent's apply
    // never landed waited for an apply it would never authorise, for ever.
    let mut m = control_plane();
    m.intend(Component::KubeApiserver);
    m.stopped = true;
    assert_eq!(m.step(), KubernetesAction::CloseIntent { component: Component::KubeApiserver });
    // Its Node not Ready changes nothing: the machine changed nothing either way.
    m.kubelet.ready = false;
    assert_eq!(m.step(), KubernetesAction::CloseIntent { component: Component::KubeApiserver });
    // One that landed is seen to its verification, stopped or not.
    m.kubelet.ready = true;
    m.configure(Component::KubeApiserver);
    assert_eq!(m.step(), KubernetesAction::RecordApplied { component: Component::KubeApiserver });
    // The closed record is no record: a later run starts from the configuration.
    let mut closed = control_plane();
    closed.record(
        ConditionStatus::False,
        reason::NOT_APPLIED,
        &apply_message(Component::KubeApiserver, &v("1.35.0")),
        T0,
    );
    assert_eq!(kubernetes_record(&closed.conditions, &v("1.35.0")), KubernetesRecord::None);
    assert!(!past_apply(&closed.conditions, &v("1.35.0"), KubernetesStage::ControlPlane));
}

#[test]
fn a_stopped_machine_with_no_intent_is_not_closed_and_an_acknowledged_change_still_fails_if_reverted() {
    let mut m = control_plane();
    m.stopped = true;
    // Nothing recorded: the decision does not advance it; the step's answer is the apply
    // the authority then refuses.
    assert!(matches!(m.step(), KubernetesAction::Apply { .. }));
    m.acknowledge(Component::KubeApiserver);
    assert!(matches!(m.step(), KubernetesAction::Fail(KubernetesFailure::ConfigReverted { .. })));
}

#[test]
fn a_control_plane_component_more_than_one_minor_behind_the_target_is_never_applied() {
    // Issue 53 item 1: a target edited from 1.35.0 to 1.36.0 under way took a 1.34 API
    // server to 1.36. The step checks what runs now, whatever planning saw.
    let mut m = control_plane();
    m.pods.insert(
        Component::KubeApiserver,
        StaticPodObservation { version: Some(v("1.33.4")), ready: true, crash_looping: false },
    );
    let KubernetesAction::Fail(failure) = m.step() else { panic!("{:?}", m.step()) };
    assert_eq!(failure.reason(), "VersionSkew");
    assert!(failure.to_string().contains("from v1.33.4"), "{failure}");
    assert!(failure.to_string().contains("one minor at a time"), "{failure}");
    // A downgrade is refused too.
    m.pods.insert(
        Component::KubeApiserver,
        StaticPodObservation { version: Some(v("1.35.2")), ready: true, crash_looping: false },
    );
    let KubernetesAction::Fail(failure) = m.step() else { panic!("{:?}", m.step()) };
    assert!(failure.to_string().contains("never downgraded"), "{failure}");
    // A version not observed is waited on, never guessed.
    m.pods.remove(&Component::KubeApiserver);
    assert_eq!(
        m.step(),
        KubernetesAction::Wait {
            reason: KubernetesWait::VersionUnobserved { component: Component::KubeApiserver },
            recheck_at: Some(T0.saturating_add(KubernetesTimeouts::default().poll)),
        }
    );
    // One minor up from what runs: applied.
    m.pods.insert(
        Component::KubeApiserver,
        StaticPodObservation { version: Some(v("1.34.9")), ready: true, crash_looping: false },
    );
    assert!(matches!(m.step(), KubernetesAction::Apply { component: Component::KubeApiserver, .. }));
}

#[test]
fn a_kubelet_is_never_made_newer_than_the_oldest_api_server() {
    let mut m = Machine::new(MachineRole::Worker, KubernetesStage::Kubelets);
    m.api_servers = Some(v("1.34.2"));
    let KubernetesAction::Fail(failure) = m.step() else { panic!("{:?}", m.step()) };
    assert_eq!(failure.reason(), "VersionSkew");
    assert!(failure.to_string().contains("oldest kube-apiserver"), "{failure}");
    m.api_servers = None;
    assert!(matches!(
        m.step(),
        KubernetesAction::Wait { reason: KubernetesWait::VersionUnobserved { component: Component::Kubelet }, .. }
    ));
    m.api_servers = Some(v("1.35.0"));
    assert!(matches!(m.step(), KubernetesAction::Apply { component: Component::Kubelet, .. }));
}
