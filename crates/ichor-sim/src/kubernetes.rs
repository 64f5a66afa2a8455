//! The simulated cluster's Kubernetes: each node's machine configuration (the images of its
//! Kubernetes components), its kubelet, and on a control plane its static pods, as a
//! Kubernetes upgrade sees and changes them.
//!
//! An apply (`ApplyConfiguration`, no reboot) that changes a component's image restarts
//! it: a static pod is not Ready for a drawn few seconds (the kubelet stops the old one
//! and starts the new), then runs the new version Ready; while a control plane's
//! kube-apiserver restarts, a Kubernetes call that is not served from the controller's
//! cache fails as refused with the chance of landing on it through the load balancer
//! (one in the number of API servers); a kubelet stops (the Node turns
//! NotReady after the node lifecycle controller's grace, if it is gone that long) and
//! comes back on the new version; kube-proxy's image changes in the configuration only:
//! a control plane renders its bootstrap manifests (kube-proxy's ServiceAccount and
//! DaemonSet) from it, and the DaemonSet the cluster runs changes when they are applied
//! server-side ([`SimBootstrap`]). The faults: `component-crashloop` (a control plane's
//! component crash-loops on the version it is changed to), `kubelet-not-back` (a node's
//! kubelet never comes back after its apply) and `removed-api-in-use` (the API servers
//! report requests to an API the next minor removes; the API's name is the simulator's
//! own), and `component-down` (a control plane's component not Ready for minutes on a
//! Ready Node, for reasons of its own, in a Talos upgrade as in a Kubernetes one).

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_talos_executor::kube_api::{ClusterKubernetesInfo, KubeError, NodeKubernetesInfo};
use ichor_talos_executor::machine_config::MachineConfig;
use ichor_talos_executor::talos_api::{ApplyConfigReply, ApplyConfigRequest, ApplyMode, TalosError};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::kubernetes_manifests::WorkloadRollout;
use ichor_upgrade_core::kubernetes_plan::{ApiUseSeenAs, Component, DeprecatedApiUse};
use ichor_upgrade_core::kubernetes_step::{StaticPodObservation, image_tag, target_image};
use ichor_upgrade_core::operation::MachineRole;
use ichor_upgrade_core::versions::{KubernetesVersion, check_kubernetes_pairing};

use super::config::{Fault, secs};
use super::trace::TraceKind;
use super::world::World;

/// The objects of Talos's bootstrap manifests as the cluster holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimBootstrap {
    /// Each object applied, by `Kind namespace/name`, as last applied, with its field
    /// manager. Before any apply the cluster runs what Talos created at bootstrap: the
    /// kube-proxy DaemonSet on the cluster's first version.
    pub objects: BTreeMap<String, (serde_json::Value, String)>,
    /// Server-side applies made (each under the admin kubeconfig).
    pub applies: usize,
    /// Sessions made under the admin kubeconfig.
    pub sessions: usize,
    /// A test knob: the operator's role lacks the Kubernetes-upgrade reads (a Talos-only
    /// install): the planning reads answer 403.
    pub reads_forbidden: bool,
    /// A test knob: the API server refuses the admin kubeconfig (its client certificate
    /// expired, or was revoked): a failure no retry fixes.
    pub admin_refused: bool,
    /// A test knob: the API server refuses every apply (as an admission webhook that says
    /// no would): a failure no retry fixes.
    pub refuse: bool,
    /// Each workload applied with a new spec (`Kind namespace/name`): when its rollout
    /// ends (its pods replaced one node at a time, 2 s each), `None` when it never does.
    pub rollouts: BTreeMap<String, (Timestamp, Option<Timestamp>)>,
    /// A test knob: a workload applied from now on never rolls out (its new image does
    /// not pull).
    pub stuck: bool,
    /// A test knob: the objects of the cluster's inline and extra manifests
    /// (`cluster.inlineManifests`, `cluster.extraManifests`), which Talos lists among its
    /// `Manifests` after its own (`99-<name>`).
    pub inline: Vec<serde_json::Value>,
}

/// How long a DaemonSet's pod takes to be replaced on one node.
const POD_REPLACED: Duration = Duration::from_secs(2);

/// The key of kube-proxy's DaemonSet in [`SimBootstrap::objects`].
pub const KUBE_PROXY_DAEMONSET: &str = "DaemonSet kube-system/kube-proxy";

/// A control plane's static pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimStaticPod {
    /// The version it runs.
    pub version: KubernetesVersion,
    /// Whether it is Ready.
    pub ready: bool,
    /// Whether it crash-loops.
    pub crash_looping: bool,
    /// Restarting: runs `.1` from `.0`.
    pub restart: Option<(Timestamp, KubernetesVersion)>,
}

/// A kubelet restarting after an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletRestart {
    /// When it is back (`None`: never, the kubelet-not-back fault).
    pub back_at: Option<Timestamp>,
    /// The version it comes back on.
    pub into: KubernetesVersion,
}

/// One node's Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimKube {
    /// The images its machine configuration holds, by component.
    pub config: BTreeMap<Component, String>,
    /// The kubelet's version.
    pub kubelet: KubernetesVersion,
    /// The kubelet restarting, if it is.
    pub kubelet_restart: Option<KubeletRestart>,
    /// On a control plane, its static pods.
    pub pods: BTreeMap<Component, SimStaticPod>,
    /// The component whose change crash-loops here (the component-crashloop fault).
    pub crash_loops: Option<Component>,
    /// Its kubelet never comes back after an apply (the kubelet-not-back fault).
    pub kubelet_stays_down: bool,
    /// Every apply it took, with the component it changed: what a test checks for a
    /// second apply of the same change.
    pub applies: Vec<Component>,
    /// Its dry runs say a change needs a reboot, and it refuses to apply one without
    /// (a test's knob).
    pub needs_reboot: bool,
    /// The component-down fault: this component is not Ready (its container restarting)
    /// from `.0` until `.1`, whatever its version, its Node Ready.
    pub down: Option<(Timestamp, Timestamp, Component)>,
    /// Whether that outage is under way.
    pub down_now: bool,
    /// Every apply to it breaks off on the wire before it reaches the node (a test's
    /// knob): the engine is left with intents whose applies never landed.
    pub loses_applies: bool,
    /// The extra arguments its configuration sets (`extraArgs`), by component (a test's
    /// knob): written into the configuration the node returns, never read by the simulated
    /// components.
    pub extra_args: BTreeMap<Component, Vec<(String, String)>>,
}

impl SimKube {
    /// A node of `role` on Kubernetes `version`, with Talos's default images.
    #[must_use]
    pub fn new(role: MachineRole, version: &KubernetesVersion) -> Self {
        let components: &[Component] = match role {
            MachineRole::ControlPlane => &Component::ALL,
            MachineRole::Worker => &[Component::Kubelet],
        };
        let config = components.iter().map(|c| (*c, target_image(*c, None, version))).collect();
        let pods = match role {
            MachineRole::ControlPlane => Component::CONTROL_PLANE
                .into_iter()
                .map(|c| {
                    let pod =
                        SimStaticPod { version: version.clone(), ready: true, crash_looping: false, restart: None };
                    (c, pod)
                })
                .collect(),
            MachineRole::Worker => BTreeMap::new(),
        };
        Self {
            config,
            kubelet: version.clone(),
            kubelet_restart: None,
            pods,
            crash_loops: None,
            kubelet_stays_down: false,
            applies: Vec::new(),
            needs_reboot: false,
            down: None,
            down_now: false,
            loses_applies: false,
            extra_args: BTreeMap::new(),
        }
    }

    /// Its next change.
    #[must_use]
    pub fn next_change(&self) -> Option<Timestamp> {
        let pods = self.pods.values().filter_map(|p| p.restart.as_ref().map(|(t, _)| *t));
        let kubelet = self.kubelet_restart.as_ref().and_then(|r| r.back_at);
        let down = self.down.map(|(from, until, _)| if self.down_now { until } else { from });
        pods.chain(kubelet).chain(down).min()
    }

    /// The machine configuration, as YAML in the shape `talosctl gen config` writes.
    #[must_use]
    pub fn config_yaml(&self, role: MachineRole) -> String {
        let image = |c: Component| self.config.get(&c).cloned().unwrap_or_default();
        let machine_type = match role {
            MachineRole::ControlPlane => "controlplane",
            MachineRole::Worker => "worker",
        };
        let args = |c: Component| match self.extra_args.get(&c) {
            Some(args) if !args.is_empty() => {
                let lines: String = args.iter().map(|(n, v)| format!("      {n}: {v:?}\n")).collect();
                format!("    extraArgs:\n{lines}")
            }
            Some(_) | None => String::new(),
        };
        let mut yaml = format!(
            "version: v1alpha1\ndebug: false\npersist: true\nmachine:\n  type: {machine_type}\n  kubelet:\n    image: {}\n{}",
            image(Component::Kubelet),
            args(Component::Kubelet)
        );
        yaml.push_str("cluster:\n  clusterName: sim\n");
        if role == MachineRole::ControlPlane {
            for (section, component) in [
                ("apiServer", Component::KubeApiserver),
                ("controllerManager", Component::KubeControllerManager),
                ("proxy", Component::KubeProxy),
                ("scheduler", Component::KubeScheduler),
            ] {
                yaml.push_str(&format!("  {section}:\n    image: {}\n{}", image(component), args(component)));
            }
        }
        yaml
    }
}

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
    pub(crate) fn control_plane_pods(&self) -> ichor_talos_executor::kube_api::ControlPlanePods {
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
        let key = ichor_talos_executor::kubernetes::object_name(object);
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

/// How long a component takes to restart, at most (for tests' bounds).
pub const RESTART_AT_MOST: Duration = Duration::from_secs(30);
