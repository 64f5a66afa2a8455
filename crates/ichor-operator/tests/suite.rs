//! The integration tests of ichor-operator, one module per file, in one test binary.

mod binary;
mod chart;
mod collection_api_server;
mod deploy_api_server;
mod krew;
mod leader_api_server;
mod manifests;
mod monitoring;
