//! The Ichor operator: the engine run as a Kubernetes controller.
//!
//! - [`controller`]: a kube-runtime `Controller` over `TalosOperation`s, one engine pass
//!   per trigger, requeued at the engine's `requeue_at`.
//! - [`leader`]: leader election between replicas on a Lease, fenced by a deadline.
//! - [`metrics`] and [`http`]: Prometheus `/metrics`, `/healthz`, `/readyz`.
//! - [`requests`] and [`rbac`]: every API request counted by RBAC verb and resource, the
//!   ClusterRole that allows exactly those, and the manifests in `deploy/`.
//! - `fleet` (feature `fleet`): a simulated Talos fleet on a real API server, to try it with
//!   no machines.
//! - [`dry_run`] and [`recorded`]: a dry run's plan from the machines' recorded history,
//!   and its calibration once the real upgrade completes.
//! - [`cli`]: the command line of the `ichor-operator` binary (and the `operator` example).
//! - [`trace`]: the trace of what the engine does and sees, in the simulator's records
//!   ([`ichor_adapters::trace`]), as JSON lines.
//! - [`run`]: all of it together, as the binary runs it.
//!
//! What it must not do: decide anything about a rollout (the engine does), or reconcile
//! while another replica leads.
#![deny(missing_docs)]

pub mod cli;
pub mod cluster_status;
pub mod controller;
pub mod discovery;
pub mod dry_run;
pub mod fence;
#[cfg(test)]
mod fixtures;
#[cfg(feature = "fleet")]
pub mod fleet;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod plugin;
pub mod rbac;
pub mod recorded;
pub mod requests;
pub mod trace;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use controller::{Health, OperatorConfig};
#[cfg(feature = "fleet")]
pub use fleet::{Fleet, FleetConfig};
pub use leader::{ElectionConfig, Leadership};
pub use metrics::Metrics;
pub use trace::{Recorder, TraceFile, TraceSink};

/// What a process runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The controller, with its election; `None` for a fleet-only process.
    pub operator: Option<(OperatorConfig, ElectionConfig)>,
    /// A simulated fleet.
    #[cfg(feature = "fleet")]
    pub fleet: Option<FleetConfig>,
    /// Where `/metrics`, `/healthz` and `/readyz` listen.
    pub listen: std::net::SocketAddr,
}

/// Why a process could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The HTTP endpoints could not listen.
    #[error("listening on {addr} for /metrics, /healthz and /readyz: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The fleet could not start.
    #[cfg(feature = "fleet")]
    #[error("the simulated fleet: {0}")]
    Fleet(#[from] fleet::FleetError),
}

/// How long a stopping process waits for the simulated fleet to delete its Nodes.
#[cfg(feature = "fleet")]
const FLEET_STOP: Duration = Duration::from_secs(60);

/// Runs `plan` with `client` (whose requests are counted into `metrics.requests`, see
/// [`requests::counted_client`]) until `shutdown` resolves; then lets the passes in flight
/// end, leaves the election (releasing the Lease when leading) and stops the fleet.
///
/// # Errors
/// A [`RunError`] when the endpoints cannot listen or the fleet cannot start.
pub async fn run(
    client: kube::Client,
    plan: Plan,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let listener = tokio::net::TcpListener::bind(plan.listen)
        .await
        .map_err(|source| RunError::Listen { addr: plan.listen, source })?;
    let addr = listener.local_addr().map_err(|source| RunError::Listen { addr: plan.listen, source })?;
    let health = Arc::new(Health::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            rx.wait_for(|s| *s).await.ok();
        }
    };
    let server = tokio::spawn(http::serve(listener, Arc::clone(&metrics), Arc::clone(&health), stopped()));
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");

    #[cfg(feature = "fleet")]
    let fleet = match plan.fleet {
        Some(config) => {
            let fleet = Fleet::new(config);
            metrics.register_collector(fleet.collector());
            Some(tokio::spawn(fleet.run(client.clone(), stopped())))
        }
        None => None,
    };
    let operator = match plan.operator {
        Some((config, election)) => {
            let leadership = Leadership::start(client.clone(), election);
            let controller = tokio::spawn(controller::run(
                client.clone(),
                config,
                leadership.subscribe(),
                Arc::clone(&metrics),
                Arc::clone(&health),
                stopped(),
            ));
            Some((leadership, controller))
        }
        None => {
            health.live.store(true, std::sync::atomic::Ordering::Relaxed);
            health.ready.store(true, std::sync::atomic::Ordering::Relaxed);
            None
        }
    };

    // A fleet that fails to start ends the process; otherwise run until told to stop.
    #[cfg(feature = "fleet")]
    let mut fleet = fleet;
    #[cfg(feature = "fleet")]
    let fleet_failed = async {
        match fleet.as_mut() {
            Some(handle) => match handle.await {
                Ok(Err(e)) => Err(RunError::from(e)),
                _ => Ok(()),
            },
            None => std::future::pending().await,
        }
    };
    #[cfg(not(feature = "fleet"))]
    let fleet_failed = std::future::pending::<Result<(), RunError>>();
    let result = tokio::select! {
        () = shutdown => Ok(()),
        r = fleet_failed => r,
    };
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    if let Some((leadership, controller)) = operator {
        controller.await.ok();
        leadership.step_down().await;
    }
    // The fleet deletes its Nodes on the same signal: waited for, within a bound (a
    // thousand deletions take seconds), so that a stopped fleet leaves none behind.
    #[cfg(feature = "fleet")]
    if let Some(handle) = fleet.filter(|h| !h.is_finished())
        && tokio::time::timeout(FLEET_STOP, handle).await.is_err()
    {
        tracing::warn!(bound = ?FLEET_STOP, "the simulated fleet did not delete its Nodes in time");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.abort();
    result
}

/// Logs to stderr as text, or as JSON lines with `json`; `RUST_LOG` filters (default
/// `info`).
pub fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}
