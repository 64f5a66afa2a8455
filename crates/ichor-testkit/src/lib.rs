//! Test peers for Ichor's adapters and examples, shared by their tests.
//!
//! - [`pki`]: certificates and talosconfigs exactly as Talos writes them (Ed25519 with
//!   Talos's own key label, or ECDSA);
//! - [`apid`]: a Talos API stand-in over mutual TLS on loopback;
//! - [`net`]: peers that stall, and ports that refuse;
//! - [`kube`]: tests against a real Kubernetes API server (`ICHOR_TEST_KUBECONFIG`), each
//!   in a namespace of its own;
//! - [`example_binary`]: the path of an example binary, to run it as a user does.
//!
//! # What this crate must not do
//! It is for tests: it is never a dependency of a library crate, and every peer it starts
//! listens on loopback only.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod apid;
pub mod kube;
pub mod net;
pub mod pki;

use std::path::PathBuf;

/// The path of example `name` built beside the running test (`cargo test` builds a
/// package's examples before it runs its tests).
///
/// # Panics
/// When the binary is not there, naming the command that builds it.
#[must_use]
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let profile = exe.parent().and_then(std::path::Path::parent).expect("target/<profile>");
    let path = profile.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} is missing: run `cargo build --examples` (cargo test builds it)", path.display());
    path
}
