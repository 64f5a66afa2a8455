//! The integration tests of ichor-adapters, one module per file, in one test binary.

mod kube_api_server;
mod longhorn_api_server;
mod longhorn_requests;
mod manifests;
mod snapshot_store;
mod talos_client;
