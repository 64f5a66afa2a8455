//! The Kubernetes half of the engine: Ichor's custom resources ([`crd`]), the manifests
//! generated from them ([`manifests`]), `KubeApi` on kube-rs ([`client()`]) and the mapping
//! of kube-rs errors ([`errors`]); a Kubernetes upgrade's reads ([`versions`]) and
//! server-side applies ([`bootstrap`]).

pub mod alerts;
pub mod bootstrap;
pub mod client;
pub mod counters;
pub mod crd;
pub mod crds;
pub mod errors;
pub mod gate_objects;
pub mod manifests;
mod preflight;
pub mod versions;
pub mod watches;
pub mod workloads;

pub use client::{
    KubeCluster, ListedStore, Stores, WatchStreams, engine_watcher, watch, watch_backoff, watch_observing,
    without_errors,
};
pub use counters::Counters;
pub use workloads::WorkloadStores;

/// A client for the engine: kube-rs's own retry of 429, 503 and 504 is off. The engine
/// decides what a refusal means (a 429 from the Eviction API is a PodDisruptionBudget
/// saying no, a wait the engine reports), and every call has its own bound; a client that
/// retries for minutes behind the engine's back would hide both.
///
/// # Errors
/// The kube-rs error when no client can be built from `config`.
pub fn client(mut config: ::kube::Config) -> Result<::kube::Client, ::kube::Error> {
    config.default_retry = false;
    ::kube::Client::try_from(config)
}
