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

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::machine::kubernetes::target_image;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::versions::KubernetesVersion;

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
pub(crate) const POD_REPLACED: Duration = Duration::from_secs(2);

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

/// How long a component takes to restart, at most (for tests' bounds).
pub const RESTART_AT_MOST: Duration = Duration::from_secs(30);
