//! The operator's Prometheus metrics (`/metrics`, OpenMetrics text).
//!
//! | metric | what |
//! | --- | --- |
//! | `ichor_reconciles_total{outcome}` | passes, by `ok` / `error` / `skipped` (not the leader) |
//! | `ichor_reconcile_errors_total{error}` | failed passes, by what failed |
//! | `ichor_reconcile_duration_seconds` | how long a pass took |
//! | `ichor_leader` | 1 while this replica leads |
//! | `ichor_operation_machines{namespace,operation,state}` | machines by state (`total`, `converged`, `in_progress`, `failed`), from the operations' status |
//! | `ichor_operation_phase{namespace,operation,phase}` | 1 for each operation's phase |
//! | `ichor_kube_writes_total`, `ichor_kube_events_total`, `ichor_kube_reads_total` | the engine's writes, Events, and reads that bypassed the stores |
//! | `ichor_kube_requests_total{verb,group,resource,subresource}` | every request to the API server ([`crate::requests`]) |
//!
//! A simulated fleet adds `ichor_fleet_*` ([`crate::fleet`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use ichor_adapters::kubernetes::Counters;
use ichor_adapters::kubernetes::crd::TalosOperation;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::requests::RequestCounts;

/// A pass's outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// `ok`, `error` or `skipped`.
    pub outcome: String,
}

/// What failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorKind {
    /// A short name of the failure.
    pub error: String,
}

/// The operator's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Passes by outcome.
    pub reconciles: Family<Outcome, Counter>,
    /// Failed passes by what failed.
    pub errors: Family<ErrorKind, Counter>,
    /// Pass durations.
    pub duration: Histogram,
    /// 1 while leading.
    pub leader: Gauge,
    /// Every request to the API server.
    pub requests: RequestCounts,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh metrics, registered.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ichor");
        let reconciles = Family::<Outcome, Counter>::default();
        let errors = Family::<ErrorKind, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let leader = Gauge::default();
        let requests = RequestCounts::default();
        registry.register("reconciles", "Reconcile passes by outcome", reconciles.clone());
        registry.register("reconcile_errors", "Failed reconcile passes by what failed", errors.clone());
        registry.register("reconcile_duration_seconds", "How long a reconcile pass took", duration.clone());
        registry.register("leader", "1 while this replica leads", leader.clone());
        registry.register(
            "kube_requests",
            "Requests to the Kubernetes API server by RBAC verb and resource",
            requests.clone(),
        );
        Self { registry: Mutex::new(registry), reconciles, errors, duration, leader, requests }
    }

    /// Adds a collector read at every scrape.
    pub fn register_collector(&self, collector: impl Collector) {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner).register_collector(Box::new(collector));
    }

    /// Counts a pass.
    pub fn pass(&self, outcome: &str) {
        self.reconciles.get_or_create(&Outcome { outcome: outcome.to_owned() }).inc();
    }

    /// Counts a failure.
    pub fn error(&self, error: &str) {
        self.errors.get_or_create(&ErrorKind { error: error.to_owned() }).inc();
    }

    /// The text of `/metrics`.
    ///
    /// # Errors
    /// Formatting errors (none in practice: it writes to a `String`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(
            &mut text,
            &self.registry.lock().unwrap_or_else(PoisonError::into_inner),
        )?;
        Ok(text)
    }
}

/// The engine's call counters ([`Counters`]) as counters.
#[derive(Debug)]
pub struct EngineCalls(pub Arc<Counters>);

impl Collector for EngineCalls {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counters = [
            (
                "kube_writes",
                "Writes the engine made (status, conditions, Lease, cordon, evictions, deletions, finalizers)",
                &self.0.writes,
            ),
            ("kube_events", "Events the engine recorded", &self.0.events),
            ("kube_reads", "Reads the engine made past the watch caches", &self.0.reads),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value.load(Ordering::Relaxed));
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

/// Machines by state and phases, read from the operations' status in the store.
#[derive(Debug)]
pub struct Operations(pub Store<TalosOperation>);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MachineLabels {
    namespace: String,
    operation: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    namespace: String,
    operation: String,
    phase: String,
}

impl Collector for Operations {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let operations = self.0.state();
        {
            let mut family = encoder.encode_descriptor(
                "operation_machines",
                "Machines of each operation by state",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for op in &operations {
                let Some(counts) = op.status.as_ref().and_then(|s| s.machines.as_ref()) else { continue };
                let states = [
                    ("total", counts.total),
                    ("converged", counts.converged),
                    ("in_progress", counts.in_progress),
                    ("failed", counts.failed),
                ];
                for (state, value) in states {
                    let labels = MachineLabels {
                        namespace: op.namespace().unwrap_or_default(),
                        operation: op.name_any(),
                        state: state.to_owned(),
                    };
                    ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "operation_phase",
            "1 for each operation's phase",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for op in &operations {
            let Some(phase) = op.status.as_ref().and_then(|s| s.phase.clone()) else { continue };
            let labels = PhaseLabels { namespace: op.namespace().unwrap_or_default(), operation: op.name_any(), phase };
            ConstGauge::new(1_i64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Reads one sample from the text of `/metrics`: the value of the line that starts with
/// `series` (a name with its labels in the order they are written, `name{a="x",b="y"}`).
#[must_use]
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.split(' ').next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_and_engine_calls_show_in_the_text() {
        let metrics = Metrics::new();
        let counters = Arc::new(Counters::default());
        counters.writes.fetch_add(3, Ordering::Relaxed);
        metrics.register_collector(EngineCalls(Arc::clone(&counters)));
        metrics.pass("ok");
        metrics.pass("ok");
        metrics.error("write-lease");
        metrics.leader.set(1);
        let text = metrics.encode().unwrap();
        assert_eq!(sample(&text, "ichor_reconciles_total{outcome=\"ok\"}"), Some(2.0), "{text}");
        assert_eq!(sample(&text, "ichor_reconcile_errors_total{error=\"write-lease\"}"), Some(1.0), "{text}");
        assert_eq!(sample(&text, "ichor_kube_writes_total"), Some(3.0), "{text}");
        assert_eq!(sample(&text, "ichor_leader"), Some(1.0), "{text}");
    }
}
