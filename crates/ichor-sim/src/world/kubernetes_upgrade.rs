//! The simulated cluster's Kubernetes as the world carries it out (the types are
//! [`crate::kubernetes`]'s): its faults placed, a component's apply and restart, a
//! kubelet's, the bootstrap manifests applied server-side and their workloads rolled out,
//! and what the API servers report.

use ichor_executor::kube_api::{ClusterKubernetesInfo, KubeError, NodeKubernetesInfo};
use ichor_executor::machine_config::MachineConfig;
use ichor_executor::talos_api::{ApplyConfigReply, ApplyConfigRequest, ApplyMode, TalosError};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::manifests::WorkloadRollout;
use ichor_upgrade_core::kubernetes::plan::{ApiUseSeenAs, DeprecatedApiUse};
use ichor_upgrade_core::machine::kubernetes::{StaticPodObservation, image_tag, target_image};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::versions::{KubernetesVersion, check_kubernetes_pairing};

use super::World;
use crate::config::{Fault, secs};
use crate::kubernetes::{KUBE_PROXY_DAEMONSET, KubeletRestart, POD_REPLACED};
use crate::trace::TraceKind;

fn answered(code: &str, message: String) -> TalosError {
    TalosError::Answered { code: code.to_owned(), message }
}

impl World {
    /// Places the Kubernetes faults.
    pub(crate) fn place_kubernetes_faults(&mut self) {
        let cps = self.indices(MachineRole::ControlPlane);
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        if self.config.has(Fault::ComponentCrashloop)
            && let Some(i) = self.pick(&cps)
        {
            let component = Component::CONTROL_PLANE[self.rng.in_range(0..=2) as usize];
            self.nodes[i].kube.crash_loops = Some(component);
        }
        if self.config.has(Fault::KubeletNotBack)
            && let Some(i) = self.pick(&all)
        {
            self.nodes[i].kube.kubelet_stays_down = true;
        }
        if self.config.has(Fault::ComponentDown)
            && let Some(i) = self.pick(&cps)
        {
            let component = Component::CONTROL_PLANE[self.rng.in_range(0..=2) as usize];
            let from = self.now.saturating_add(secs(self.rng.in_range(60..=1200)));
            let until = from.saturating_add(secs(self.rng.in_range(60..=240)));
            self.nodes[i].kube.down = Some((from, until, component));
        }
    }

    /// `ApplyConfiguration` on node `i`.
    pub(crate) fn apply_configuration(
        &mut self,
        i: usize,
        request: &ApplyConfigRequest,
    ) -> Result<ApplyConfigReply, TalosError> {
        match request.mode {
            // Talos 1.14 refuses REBOOT outside maintenance; the simulator does on every version.
            ApplyMode::Reboot => {
                return Err(answered("Unimplemented", "apply configuration with reboot is not supported".into()));
            }
            ApplyMode::Staged | ApplyMode::Try => {
                return Err(answered("Unimplemented", "the simulator applies with no reboot only".into()));
            }
            ApplyMode::Auto | ApplyMode::NoReboot => {}
        }
        let config = MachineConfig::parse(&request.data)
            .map_err(|e| answered("InvalidArgument", format!("failed to parse config: {e}")))?;
        let node_version = self.nodes[i].version.clone();
        let role = self.nodes[i].role;
        let mut changed = Vec::new();
        for (component, image) in config.images() {
            let Some(version) = image_tag(&image).and_then(|t| KubernetesVersion::parse(t).ok()) else {
                return Err(answered("InvalidArgument", format!("{component} image {image:?} has no version tag")));
            };
            // Talos validates Kubernetes images against its own version's window.
            if component != Component::KubeProxy
                && let Err(refusal) = check_kubernetes_pairing(&node_version, &version)
            {
                return Err(answered("InvalidArgument", format!("{component} image {image}: {refusal}")));
            }
            if role == MachineRole::Worker && component != Component::Kubelet {
                continue;
            }
            if self.nodes[i].kube.config.get(&component) != Some(&image) {
                changed.push((component, image, version));
            }
        }
        let details = if changed.is_empty() {
            "No changes.".to_owned()
        } else {
            changed.iter().map(|(c, image, _)| format!("{c}: image {image}")).collect::<Vec<_>>().join("\n")
        };
        // A node that says the change needs a reboot (a test's knob: an older Talos asked
        // in AUTO, or a change outside what applies live) answers so to a dry run.
        let mode = if self.nodes[i].kube.needs_reboot { ApplyMode::Reboot } else { ApplyMode::NoReboot };
        let reply = ApplyConfigReply { mode, mode_details: details, warnings: Vec::new() };
        if request.dry_run {
            return Ok(reply);
        }
        if self.nodes[i].kube.needs_reboot {
            return Err(answered("InvalidArgument", "the configuration can't be applied without a reboot".into()));
        }
        // The call-lost fault (the node's first apply), or the knob (every apply): the
        // stream breaks before the request reaches the node.
        if self.nodes[i].loses_next_call || self.nodes[i].kube.loses_applies {
            self.nodes[i].loses_next_call = false;
            self.record(i, TraceKind::CallLost);
            return Err(TalosError::transport("stream reset before the request was delivered"));
        }
        for (component, image, version) in changed {
            self.nodes[i].kube.config.insert(component, image);
            self.nodes[i].kube.applies.push(component);
            self.record_component(i, TraceKind::ConfigApply, component, format!("{component} to v{version}"));
            self.restart_component(i, component, version);
        }
        self.changed(i);
        Ok(reply)
    }

    /// A component of node `i` restarts onto `version`.
    fn restart_component(&mut self, i: usize, component: Component, version: KubernetesVersion) {
        match component {
            Component::KubeProxy => {}
            Component::Kubelet => {
                let back_at = (!self.nodes[i].kube.kubelet_stays_down)
                    .then(|| self.now.saturating_add(secs(self.rng.in_range(5..=20))));
                self.nodes[i].kube.kubelet_restart = Some(KubeletRestart { back_at, into: version });
                if self.nodes[i].ready {
                    self.nodes[i].ready = false;
                    self.record(i, TraceKind::NotReady);
                    self.kubelet_lost_now(i);
                }
            }
            _ => {
                let back = self.now.saturating_add(secs(self.rng.in_range(5..=30)));
                if let Some(pod) = self.nodes[i].kube.pods.get_mut(&component) {
                    pod.ready = false;
                    pod.crash_looping = false;
                    pod.restart = Some((back, version));
                }
            }
        }
    }

    /// Node `i`'s Kubernetes changes due now.
    pub(crate) fn apply_kubernetes(&mut self, i: usize, now: Timestamp) {
        let due: Vec<Component> = self.nodes[i]
            .kube
            .pods
            .iter()
            .filter(|(_, p)| p.restart.as_ref().is_some_and(|(t, _)| *t <= now))
            .map(|(c, _)| *c)
            .collect();
        for component in due {
            let crash = self.nodes[i].kube.crash_loops == Some(component);
            let Some(pod) = self.nodes[i].kube.pods.get_mut(&component) else { continue };
            let Some((_, version)) = pod.restart.take() else { continue };
            pod.version = version.clone();
            pod.ready = !crash;
            pod.crash_looping = crash;
            let kind = if crash { TraceKind::ComponentCrashLoop } else { TraceKind::ComponentReady };
            self.record_component(i, kind, component, format!("{component} v{version}"));
            // Its mirror pod changed: the controller watches them (kube-system, `k8s-app`).
            self.watch_event();
        }
        if let Some((from, until, component)) = self.nodes[i].kube.down {
            let down = from <= now && now < until;
            if down != self.nodes[i].kube.down_now {
                self.nodes[i].kube.down_now = down;
                if !down {
                    self.nodes[i].kube.down = None;
                }
                let kind = if down { TraceKind::ComponentDown } else { TraceKind::ComponentUp };
                self.record_component(i, kind, component, format!("{component} (a fault of its own)"));
                // Its mirror pod's status changed: the controller watches them.
                self.watch_event();
            }
        }
        let back = self.nodes[i].kube.kubelet_restart.as_ref().is_some_and(|r| r.back_at.is_some_and(|t| t <= now));
        if back && let Some(restart) = self.nodes[i].kube.kubelet_restart.take() {
            self.nodes[i].kube.kubelet = restart.into.clone();
            let message = format!("kubelet v{}", restart.into);
            self.record_component(i, TraceKind::ComponentReady, Component::Kubelet, message);
            // The kubelet's status update (its new kubeletVersion) is a watch event on the Node.
            self.watch_event();
            if self.nodes[i].not_ready_until.is_none() && self.nodes[i].reachable() && !self.nodes[i].upgrading() {
                self.nodes[i].ready = true;
                self.record(i, TraceKind::Ready);
                self.kubelet_ready_now(i);
            }
        }
    }

    /// Node `name`'s Kubernetes, as its Node and mirror pods show it.
    pub(crate) fn node_kubernetes(&self, name: &str) -> Option<NodeKubernetesInfo> {
        let n = self.node(name).filter(|n| !n.removed)?;
        let static_pods = n
            .kube
            .pods
            .iter()
            .map(|(c, p)| {
                let down = n.kube.down_now && n.kube.down.is_some_and(|(_, _, d)| d == *c);
                let seen = StaticPodObservation {
                    version: Some(p.version.clone()),
                    ready: p.ready && !down,
                    crash_looping: p.crash_looping,
                };
                (*c, seen)
            })
            .collect();
        Some(NodeKubernetesInfo { kubelet_version: format!("v{}", n.kube.kubelet), ready: n.view.ready, static_pods })
    }

    /// Every control plane's static pods, by node (one read of `kube-system`'s mirror pods).
    pub(crate) fn control_plane_pods(&self) -> ichor_executor::kube_api::ControlPlanePods {
        self.nodes
            .iter()
            .filter(|n| !n.removed && !n.kube.pods.is_empty())
            .filter_map(|n| Some((n.name.clone(), self.node_kubernetes(&n.name)?.static_pods)))
            .collect()
    }

    /// The cluster's Kubernetes as planning reads it.
    pub(crate) fn cluster_kubernetes(&self) -> ClusterKubernetesInfo {
        let mut deprecated_apis = Vec::new();
        if self.config.has(Fault::RemovedApiInUse) {
            let next = KubernetesVersion::parse(&self.config.kubernetes)
                .map(|v| format!("{}.{}", v.minor_line().major, v.minor_line().minor + 1))
                .unwrap_or_else(|_| "1.0".to_owned());
            deprecated_apis.push(DeprecatedApiUse {
                group: "widgets.sim.ichor.dev".to_owned(),
                version: "v1beta1".to_owned(),
                resource: "widgets".to_owned(),
                removed_release: next,
                count: 3,
                seen_as: ApiUseSeenAs::Requests,
            });
        }
        let kube_proxy = Some(self.kube_proxy_version().to_string());
        ClusterKubernetesInfo { deprecated_apis, kube_proxy }
    }

    /// The version kube-proxy's DaemonSet runs: its image's, as last applied, or the
    /// cluster's first version.
    #[must_use]
    pub fn kube_proxy_version(&self) -> KubernetesVersion {
        self.bootstrap
            .objects
            .get(KUBE_PROXY_DAEMONSET)
            .and_then(|(object, _)| object.pointer("/spec/template/spec/containers/0/image"))
            .and_then(serde_json::Value::as_str)
            .and_then(|image| image_tag(image).and_then(|t| KubernetesVersion::parse(t).ok()))
            .or_else(|| KubernetesVersion::parse(&self.config.kubernetes).ok())
            .unwrap_or_else(|| KubernetesVersion::parse("1.0.0").expect("a version"))
    }

    /// The bootstrap manifests node `i` renders: on a control plane, the kubelets'
    /// bootstrap token (a Secret) and kube-proxy's ServiceAccount and DaemonSet, with the
    /// image its configuration holds; none on a worker.
    pub(crate) fn bootstrap_manifests(&self, i: usize) -> Vec<serde_json::Value> {
        let n = &self.nodes[i];
        if n.role != MachineRole::ControlPlane {
            return Vec::new();
        }
        let first = KubernetesVersion::parse(&self.config.kubernetes).ok();
        let image = n.kube.config.get(&Component::KubeProxy).cloned().unwrap_or_else(|| {
            first.as_ref().map_or_else(String::new, |v| target_image(Component::KubeProxy, None, v))
        });
        let labels = serde_json::json!({"k8s-app": "kube-proxy", "tier": "node"});
        vec![
            // The kubelets' bootstrap token (Talos's `00-kubelet-bootstrapping-token`).
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "bootstrap-token-sim000", "namespace": "kube-system"},
                "type": "bootstrap.kubernetes.io/token",
                "stringData": {"token-id": "sim000", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"},
            }),
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            }),
            serde_json::json!({
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": labels},
                "spec": {
                    "selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [{
                                "name": "kube-proxy",
                                "image": image,
                                "command": ["/usr/local/bin/kube-proxy", "--hostname-override=$(NODE_NAME)"],
                            }],
                            "hostNetwork": true,
                            "serviceAccountName": "kube-proxy",
                            "tolerations": [{"operator": "Exists"}],
                        },
                    },
                },
            }),
        ]
        .into_iter()
        .chain(self.bootstrap.inline.iter().cloned())
        .collect()
    }

    /// A server-side apply of `object` under `manager`.
    pub(crate) fn apply_manifest(&mut self, object: &serde_json::Value, manager: &str) -> Result<(), KubeError> {
        let text = |pointer: &str| object.pointer(pointer).and_then(serde_json::Value::as_str).unwrap_or_default();
        let key = ichor_executor::machine::kubernetes::object_name(object);
        if self.bootstrap.refuse {
            return Err(KubeError::Refused(format!(
                "apply {key}: admission webhook \"policy.sim.ichor.dev\" denied the request"
            )));
        }
        self.bootstrap.applies += 1;
        let changed =
            self.bootstrap.objects.get(&key).is_none_or(|(before, _)| before.get("spec") != object.get("spec"));
        if changed && matches!(text("/kind"), "DaemonSet" | "Deployment") {
            let nodes = u32::try_from(self.nodes.iter().filter(|n| !n.removed).count()).unwrap_or(u32::MAX);
            let ends = (!self.bootstrap.stuck).then(|| self.now.saturating_add(POD_REPLACED * nodes));
            self.bootstrap.rollouts.insert(key.clone(), (self.now, ends));
        }
        self.bootstrap.objects.insert(key, (object.clone(), manager.to_owned()));
        Ok(())
    }

    /// The rollout of `workload`, as a controller's status would say: its pods replaced
    /// one node at a time since its apply.
    pub(crate) fn workload_rollout(&self, workload: &str) -> WorkloadRollout {
        let nodes = self.nodes.iter().filter(|n| !n.removed).count();
        let (done, updated) = match self.bootstrap.rollouts.get(workload) {
            // Never applied with a new spec: as it was made at bootstrap.
            None if self.bootstrap.objects.contains_key(workload) || workload == KUBE_PROXY_DAEMONSET => (true, nodes),
            None => (false, 0),
            Some((_, Some(ends))) if *ends <= self.now => (true, nodes),
            Some((since, ends)) => {
                let elapsed = self.now.saturating_since(*since).as_millis();
                let replaced = usize::try_from(elapsed / POD_REPLACED.as_millis()).unwrap_or(usize::MAX);
                // A stuck rollout replaces its first pod, which never becomes available.
                (false, if ends.is_none() { 1.min(nodes) } else { replaced.min(nodes) })
            }
        };
        let available = if done { nodes } else { updated.saturating_sub(1) };
        WorkloadRollout {
            workload: workload.to_owned(),
            done,
            detail: format!("updated {updated}/{nodes}, available {available}/{nodes}"),
            progress: u64::try_from(updated + available).unwrap_or(u64::MAX),
        }
    }

    /// The control plane whose kube-apiserver restarts now, if one does: a call through
    /// the load balancer that lands on it is refused.
    #[must_use]
    pub fn api_server_restarting(&self) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| n.kube.pods.get(&Component::KubeApiserver).is_some_and(|p| p.restart.is_some()))
            .map(|n| n.name.clone())
    }

    /// How many API servers the load balancer spreads calls over.
    #[must_use]
    pub fn api_servers(&self) -> usize {
        self.nodes.iter().filter(|n| n.kube.pods.contains_key(&Component::KubeApiserver) && !n.removed).count()
    }

    /// Whether a kubelet of the cluster restarts (for the runner's idle check).
    #[must_use]
    pub fn kubelets_restarting(&self) -> usize {
        self.nodes.iter().filter(|n| n.kube.kubelet_restart.is_some()).count()
    }
}
