//! The Ichor operator: the engine run as a Kubernetes controller.
//!
//! - [`controller`]: a kube-runtime `Controller` over `TalosOperation`s, one engine pass
//!   per trigger, requeued at the engine's `requeue_at`.
//! - [`leader`]: leader election between replicas on a Lease, fenced by a deadline.
//! - [`metrics`] and [`http`]: Prometheus `/metrics`, `/healthz`, `/readyz`.
//! - [`requests`] and [`rbac`]: every API request counted by RBAC verb and resource, the
//!   ClusterRole that allows exactly those, and the manifests in `deploy/`.
//! - [`dry_run`] and [`recorded`]: a dry run's plan from the machines' recorded history,
//!   and its calibration once the real upgrade completes.
//! - [`cli`]: the command line of the `ichor-operator` binary, which the `operator` example
//!   extends with a simulated fleet ([`cli::Extension`], [`Companion`]).
//! - [`trace`]: the trace of what the engine does and sees, in the simulator's records
//!   ([`ichor_timeline::trace`]), as JSON lines.
//! - [`run`]: all of it together, as the binary runs it.
//!
//! What it must not do: decide anything about a rollout (the engine does), or reconcile
//! while another replica leads.
#![deny(missing_docs)]

pub mod chart;
pub mod cli;
pub mod cluster_status;
pub mod controller;
pub mod desired;
pub mod discovery;
pub mod dry_run;
pub mod fence;
#[cfg(test)]
mod fixtures;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod notices;
pub mod notify;
pub mod plugin;
pub mod rbac;
pub mod recorded;
pub mod requests;
pub mod trace;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use controller::{Health, OperatorConfig};
pub use leader::{ElectionConfig, Leadership};
pub use metrics::Metrics;
pub use trace::{Recorder, TraceFile, TraceSink};

/// What a process runs.
#[derive(Debug)]
pub struct Plan {
    /// The controller, with its election; `None` for a process that runs only its
    /// companions.
    pub operator: Option<(OperatorConfig, ElectionConfig)>,
    /// What runs beside the controller (the operator example's simulated fleet).
    pub companions: Vec<Companion>,
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
    /// A companion failed.
    #[error("{name}: {message}")]
    Companion {
        /// The companion's name.
        name: &'static str,
        /// What it said.
        message: String,
    },
}

/// A future that resolves when the process stops.
pub type Stopped = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a companion runs until stopped: `Err` with a message when it fails.
pub type CompanionTask = std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Starts a companion: the process's client and metrics, and a future that resolves when
/// the process stops.
pub type CompanionStart = Box<dyn FnOnce(kube::Client, &Metrics, Stopped) -> CompanionTask + Send>;

/// Work a process runs beside the controller and stops with it: the operator example's
/// simulated fleet. It gets the process's client and metrics (to register collectors on)
/// and a future that resolves at shutdown; when it fails the process ends, with exit 1.
pub struct Companion {
    /// Its name, in the logs and in the error when it fails.
    pub name: &'static str,
    /// Started once the endpoints listen.
    pub start: CompanionStart,
    /// How long a stopping process waits for it to end (the fleet deletes its Nodes).
    pub stop_bound: Duration,
}

impl std::fmt::Debug for Companion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Companion")
            .field("name", &self.name)
            .field("stop_bound", &self.stop_bound)
            .finish_non_exhaustive()
    }
}

/// A companion's task, running.
type Running = tokio::task::JoinHandle<Result<(), String>>;

/// Runs `plan` with `client` (whose requests are counted into `metrics.requests`, see
/// [`requests::counted_client`]) until `shutdown` resolves; then lets the passes in flight
/// end, leaves the election (releasing the Lease when leading) and stops the companions.
///
/// # Errors
/// A [`RunError`] when the endpoints cannot listen or a companion fails.
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

    let mut companions: Vec<(&'static str, Duration, Running)> = plan
        .companions
        .into_iter()
        .map(|c| (c.name, c.stop_bound, tokio::spawn((c.start)(client.clone(), &metrics, Box::pin(stopped())))))
        .collect();
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

    // A companion that fails ends the process; otherwise run until told to stop.
    let companion_failed = async {
        if companions.is_empty() {
            return std::future::pending().await;
        }
        let handles = companions.iter_mut().map(|(name, _, handle)| async move { (*name, handle.await) });
        let ((name, ended), _, _) = futures::future::select_all(handles.map(Box::pin)).await;
        match ended {
            Ok(Err(message)) => Err(RunError::Companion { name, message }),
            _ => Ok(()),
        }
    };
    let result = tokio::select! {
        () = shutdown => Ok(()),
        r = companion_failed => r,
    };
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    if let Some((leadership, controller)) = operator {
        controller.await.ok();
        leadership.step_down().await;
    }
    // Companions stop on the same signal (a fleet deletes its Nodes): waited for, each
    // within its bound, so that a stopped fleet leaves none behind.
    for (name, bound, handle) in companions.into_iter().filter(|(_, _, h)| !h.is_finished()) {
        if tokio::time::timeout(bound, handle).await.is_err() {
            tracing::warn!(companion = name, ?bound, "a companion did not stop in time");
        }
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
