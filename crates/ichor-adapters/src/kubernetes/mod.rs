//! The Kubernetes half of the engine: Ichor's custom resources ([`crd`]), the manifests
//! generated from them ([`manifests`]), and `KubeApi` on kube-rs.

pub mod crd;
pub mod manifests;
