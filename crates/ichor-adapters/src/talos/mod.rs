//! The Talos machine API: Ichor's own wire-compatible proto subset (`proto/talos/`),
//! compiled at build time through protox, and [`TalosClient`], `TalosApi` over it.

pub mod client;
pub mod connect;
pub mod kubeconfig;
pub mod manifests;
pub mod server;

pub use client::{ClientError, ClientOptions, Snapshot, SnapshotError, TalosClient};
pub use connect::{ConnectError, TlsMaterialError};

/// Generated from `proto/talos/*.proto`.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic, clippy::use_self)]
pub mod proto {
    /// `common`: metadata and streamed data.
    pub mod common {
        tonic::include_proto!("common");
    }
    /// `machine`: the MachineService subset.
    pub mod machine {
        tonic::include_proto!("machine");
    }
    /// `cosi.resource`: the resource API's Get and List, and the specs Ichor reads.
    pub mod resource {
        tonic::include_proto!("cosi.resource");
    }
}

#[cfg(test)]
mod wire_tests;
