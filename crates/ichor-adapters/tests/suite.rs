//! The integration tests of ichor-adapters, one module per file, in one test binary.

mod evacuation_properties;
mod invariants;
mod kube_api_server;
mod longhorn_api_server;
mod longhorn_requests;
mod manifests;
mod restart_property;
mod sim_etcd_snapshot;
mod sim_image_pull;
mod sim_preflight;
mod sim_removal;
mod sim_rollout;
mod snapshot_store;
mod talos_client;
mod talos_server;
