//! The operator, as `cargo run --example operator` runs it: the `ichor-operator` binary's
//! command line ([`ichor_operator::cli`]) with a simulated Talos fleet
//! ([`ichor_sim::fleet`]) built in, so that it can be tried on any API server.
//!
//! ```text
//! operator [the ichor-operator binary's arguments]
//!     [--simulate-fleet CP+W [--time-scale N] [--seed N] [--kwok] [--no-machines]
//!      [--fleet-admin-kubeconfig FILE] [--fleet-only]]
//! ```
//!
//! `--simulate-fleet 3+5` also runs a simulated fleet in the namespace: a `TalosCluster`
//! `demo` (Talos v1.14.3), its machines on v1.14.2, their Nodes and a Talos API, with
//! virtual durations divided by `--time-scale` (default 10), as the controller's pass
//! interval is. `--fleet-only` runs the fleet without the controller (to run operators in
//! other processes against it). With `--kwok`, kwok running on the API server is the
//! kubelet of the fleet's Nodes and of the pods a scheduler binds to them (the fleet drives
//! their Ready condition at reboots; see `scripts/kube-server/kwok-stages.yaml`); without,
//! the fleet acts as their kubelet itself. With no snapshot store named, the fleet's etcd
//! snapshots go to a new temporary directory: trying the operator needs no store. On stop,
//! the fleet deletes its Nodes. Exit 1 when the fleet cannot start.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ichor_adapters::snapshot_store::DirectoryStore;
use ichor_executor::SnapshotStore;
use ichor_operator::Companion;
use ichor_operator::cli::Extension;
use ichor_sim::fleet::{Fleet, FleetConfig, parse_shape};

/// A Talos version, as given: the text, once it parses.
fn parse_talos(text: &str) -> Result<String, String> {
    ichor_upgrade_core::versions::TalosVersion::parse(text).map(|_| text.to_owned()).map_err(|e| e.to_string())
}

/// How long a stopping process waits for the simulated fleet to delete its Nodes (a
/// thousand deletions take seconds).
const FLEET_STOP: Duration = Duration::from_secs(60);

/// The simulated fleet's arguments.
#[derive(Debug, clap::Args)]
struct FleetArgs {
    /// Also run a simulated fleet of CONTROL_PLANES+WORKERS machines, such as 3+5.
    #[arg(long, value_name = "CP+W", value_parser = parse_shape)]
    simulate_fleet: Option<(usize, usize)>,
    /// Virtual seconds of the simulated fleet per second.
    #[arg(long, default_value_t = 10.0, value_parser = parse_scale, requires = "simulate_fleet")]
    time_scale: f64,
    /// The simulated fleet's seed.
    #[arg(long, default_value_t = 1, requires = "simulate_fleet")]
    seed: u64,
    /// kwok is the kubelet of the simulated fleet's Nodes (labelled ichor.dev/kwok=true).
    #[arg(long, requires = "simulate_fleet")]
    kwok: bool,
    /// The simulated fleet publishes its Nodes and Talos API but no TalosMachines (a
    /// cluster whose machines the operator is not told about).
    #[arg(long, requires = "simulate_fleet")]
    no_machines: bool,
    /// The admin kubeconfig the simulated fleet's Talos API gives (`talosctl kubeconfig`),
    /// as a real cluster's control planes give theirs: a Kubernetes upgrade applies the
    /// bootstrap manifests under it. Read once at start and held in memory.
    #[arg(long, value_name = "FILE", requires = "simulate_fleet")]
    fleet_admin_kubeconfig: Option<PathBuf>,
    /// The Talos version the simulated fleet's machines run at start (its cluster's
    /// `talosVersion` is ichor_sim::fleet::TARGET).
    #[arg(long, value_name = "VERSION", default_value = ichor_sim::fleet::FROM, value_parser = parse_talos, requires = "simulate_fleet")]
    fleet_from: String,
    /// Run only the simulated fleet, no controller.
    #[arg(long, requires = "simulate_fleet", conflicts_with_all = ["pass_interval_ms", "trace"])]
    fleet_only: bool,
}

impl Extension for FleetArgs {
    fn controller(&self) -> bool {
        !self.fleet_only
    }

    fn time_scale(&self) -> f64 {
        if self.simulate_fleet.is_some() { self.time_scale } else { 1.0 }
    }

    fn default_snapshots(&self) -> Option<Arc<dyn SnapshotStore>> {
        // A simulated fleet's snapshots go to a new directory, as the rollout example's:
        // trying the operator needs no store, and its upgrades do not pause for one.
        self.simulate_fleet.is_some().then(|| {
            let dir = std::env::temp_dir().join(format!("ichor-operator-snapshots-{}", std::process::id()));
            tracing::info!(dir = %dir.display(), "etcd snapshots of the simulated fleet go to a new directory");
            Arc::new(DirectoryStore::new(dir)) as Arc<dyn SnapshotStore>
        })
    }

    fn companions(&self, home: &str) -> Result<Vec<Companion>, String> {
        let Some((control_planes, workers)) = self.simulate_fleet else { return Ok(Vec::new()) };
        let admin_kubeconfig = match &self.fleet_admin_kubeconfig {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("--fleet-admin-kubeconfig {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let config = FleetConfig {
            namespace: home.to_owned(),
            control_planes,
            workers,
            time_scale: self.time_scale,
            seed: self.seed,
            kwok: self.kwok,
            machines: !self.no_machines,
            admin_kubeconfig,
            from: self.fleet_from.clone(),
        };
        Ok(vec![Companion {
            name: "the simulated fleet",
            start: Box::new(move |client, metrics, stopped| {
                let fleet = Fleet::new(config);
                metrics.register_collector(fleet.collector());
                Box::pin(async move { fleet.run(client, stopped).await.map_err(|e| ichor_executor::report(&e)) })
            }),
            stop_bound: FLEET_STOP,
        }])
    }
}

fn parse_scale(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(scale) if scale.is_finite() && scale > 0.0 && scale <= 10_000.0 => Ok(scale),
        _ => Err(format!("the time scale must be a number above 0 and at most 10000, got {text:?}")),
    }
}

fn main() {
    ichor_operator::cli::main_with::<FleetArgs>();
}
