//! `/metrics`, `/healthz` and `/readyz`.
//!
//! `/healthz` is 200 while the controller loop runs (or, in a process with no controller, such as a fleet-only one, always);
//! `/readyz` is 200 once every watch has listed. Both answer 503 otherwise, with the
//! reason as text.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::controller::Health;
use crate::metrics::Metrics;

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

async fn metrics_text(State(shared): State<Shared>) -> impl IntoResponse {
    match shared.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            text,
        ),
        Err(_) => {
            (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], "encoding failed".to_owned())
        }
    }
}

async fn healthz(State(shared): State<Shared>) -> (StatusCode, &'static str) {
    if shared.health.live.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the controller is not running")
    }
}

async fn readyz(State(shared): State<Shared>) -> (StatusCode, &'static str) {
    if shared.health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the watches have not listed yet")
    }
}

/// Serves the endpoints on `listener` until `shutdown` resolves.
///
/// # Errors
/// The server's IO error.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Shared { metrics, health });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
