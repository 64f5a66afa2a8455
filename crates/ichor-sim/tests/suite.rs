//! The integration tests of ichor-sim, one module per file, in one test binary: the
//! scenarios and property suites on the simulated cluster, and the real Talos client and
//! talosctl against the Talos API server in front of it.

mod evacuation_properties;
mod invariants;
mod restart_property;
mod sim_alerts;
mod sim_audit;
mod sim_etcd_snapshot;
mod sim_gates;
mod sim_image_pull;
mod sim_kubernetes;
mod sim_preflight;
mod sim_removal;
mod sim_rollout;
mod sim_windows;
mod talos_server;
mod talosctl;

/// How many cases a property runs: the environment variable `var` if set (a soak run, for
/// instance `RESTART_CASES=40000`), else `default`.
pub(crate) fn cases(var: &str, default: u32) -> u32 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
