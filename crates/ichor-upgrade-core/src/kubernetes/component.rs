//! The Kubernetes components an upgrade changes, in the order Talos changes them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A Kubernetes component a Kubernetes upgrade changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    /// The API server, a static pod of each control plane.
    KubeApiserver,
    /// The controller manager, a static pod of each control plane.
    KubeControllerManager,
    /// The scheduler, a static pod of each control plane.
    KubeScheduler,
    /// kube-proxy, a DaemonSet Talos manages (unless the cluster disables it).
    KubeProxy,
    /// The kubelet of each node.
    Kubelet,
}

impl Component {
    /// The control plane's static pods, in the order they change on a node.
    pub const CONTROL_PLANE: [Self; 3] = [Self::KubeApiserver, Self::KubeControllerManager, Self::KubeScheduler];

    /// Every component, in the order a Kubernetes upgrade changes them.
    pub const ALL: [Self; 5] =
        [Self::KubeApiserver, Self::KubeControllerManager, Self::KubeScheduler, Self::KubeProxy, Self::Kubelet];

    /// The name the trace, the conditions and people use: `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`, `kube-proxy`, `kubelet`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KubeApiserver => "kube-apiserver",
            Self::KubeControllerManager => "kube-controller-manager",
            Self::KubeScheduler => "kube-scheduler",
            Self::KubeProxy => "kube-proxy",
            Self::Kubelet => "kubelet",
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
