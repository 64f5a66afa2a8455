//! The operator's Prometheus metrics (`/metrics`, OpenMetrics text).
//!
//! | metric | what |
//! | --- | --- |
//! | `ichor_reconciles_total{outcome}` | passes, by `ok` / `error` / `skipped` (not the leader) |
//! | `ichor_reconcile_errors_total{error}` | failed passes, by what failed |
//! | `ichor_reconcile_duration_seconds` | how long a pass took |
//! | `ichor_leader` | 1 while this replica leads |
//! | `ichor_build_info{version}` | 1, with the operator's version |
//! | `ichor_operation_machines{namespace,operation,state}` | machines by state (`total`, `converged`, `in_progress`, `failed`), from the operations' status; the leader's only |
//! | `ichor_operation_phase{namespace,operation,phase,reason}` | 1 for each operation's phase, with the phase's reason (`status.reason`: `GateNotPassing`, `MachineFailed`, ...); the leader's only |
//! | `ichor_machine_step_duration_seconds{step}` | how long each step of a machine took, from its recorded history, observed by the leader when the machine converges: `evacuation`, `upgrade` (the Upgrade call to converged: install, reboot, Ready and verification), `install` and `reboot` (the lifecycle executor's, the reboot to converged) |
//! | `ichor_kube_writes_total`, `ichor_kube_events_total`, `ichor_kube_reads_total` | the engine's writes, Events, and reads that bypassed the stores |
//! | `ichor_kube_requests_total{verb,group,resource,subresource}` | every request to the API server ([`crate::requests`]) |
//!
//! Every replica has `/metrics`; the per-operation gauges are the leader's alone, so that
//! a dashboard summing over replicas counts each operation once. A simulated fleet adds
//! `ichor_fleet_*` (`ichor_sim::fleet`, in the `operator` example).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use ichor_adapters::kubernetes::Counters;
use ichor_adapters::kubernetes::crd::{TalosMachine, TalosOperation, step_durations};
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
    /// How long each step of a machine took.
    pub steps: Family<StepLabels, Histogram>,
    /// The machines (and their convergence times) already observed into `steps`.
    observed: Mutex<std::collections::HashSet<(String, String, i64)>>,
}

/// A machine's step.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// `evacuation`, `upgrade`, `install` or `reboot`.
    pub step: String,
}

/// The version labels of `ichor_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
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
        let build = Family::<BuildLabels, Gauge>::default();
        build.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION").to_owned() }).set(1);
        registry.register("build_info", "The operator's version", build);
        // 10 s to about 23 hours.
        let steps = Family::<StepLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(10.0, 2.0, 14))
        });
        registry.register(
            "machine_step_duration_seconds",
            "How long each step of a machine's upgrade took, observed when it converges",
            steps.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            reconciles,
            errors,
            duration,
            leader,
            requests,
            steps,
            observed: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Observes the steps of `machine` into `ichor_machine_step_duration_seconds` once it
    /// has converged (its history's last `TalosUpgrade` or `TalosLifecycle` step is
    /// `Converged`), once per convergence, and only while this replica leads.
    pub fn machine_seen(&self, machine: &TalosMachine) {
        if self.leader.get() != 1 {
            return;
        }
        let history = machine.status.as_ref().map(|s| s.history.as_slice()).unwrap_or_default();
        let converged = history
            .iter()
            .rev()
            .find(|s| s.type_ == "TalosUpgrade" || s.type_ == "TalosLifecycle")
            .filter(|s| s.reason == "Converged");
        let Some(converged) = converged else { return };
        let key = (machine.namespace().unwrap_or_default(), machine.name_any(), converged.time.0.as_second());
        if !self.observed.lock().unwrap_or_else(PoisonError::into_inner).insert(key) {
            return;
        }
        for (step, seconds) in step_durations(history) {
            self.steps.get_or_create(&StepLabels { step: step.to_owned() }).observe(seconds);
        }
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

/// Machines by state and phases, read from the operations' status in the store; encoded
/// only while the gauge (the leader's) is 1.
#[derive(Debug)]
pub struct Operations(pub Store<TalosOperation>, pub Gauge);

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
    reason: String,
}

impl Collector for Operations {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // A follower's store is as full as the leader's: both exporting it double-counts.
        if self.1.get() != 1 {
            return Ok(());
        }
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
            let reason = op.status.as_ref().and_then(|s| s.reason.clone()).unwrap_or_default();
            let labels =
                PhaseLabels { namespace: op.namespace().unwrap_or_default(), operation: op.name_any(), phase, reason };
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
    use ichor_adapters::kubernetes::crd::MachineStep;

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

    fn step(type_: &str, reason: &str, secs: i64) -> MachineStep {
        MachineStep {
            type_: type_.into(),
            status: "True".into(),
            reason: reason.into(),
            time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_767_225_600 + secs).unwrap(),
            ),
            bytes: None,
            seconds: None,
        }
    }

    #[test]
    fn the_build_is_named() {
        let text = Metrics::new().encode().unwrap();
        let series = format!("ichor_build_info{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
        assert_eq!(sample(&text, &series), Some(1.0), "{text}");
    }

    #[test]
    fn only_the_leader_exports_the_operations_gauges() {
        use ichor_adapters::kubernetes::crd::MachineCounts;
        let (store, mut writer) = kube::runtime::reflector::store::<TalosOperation>();
        let mut op = crate::fixtures::operation("upgrade", "Progressing", "Progressing");
        if let Some(status) = op.status.as_mut() {
            status.machines = Some(MachineCounts { total: 8, converged: 3, in_progress: 1, failed: 0 });
        }
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(op));
        let metrics = Metrics::new();
        metrics.register_collector(Operations(store, metrics.leader.clone()));
        let series = "ichor_operation_machines{namespace=\"ops\",operation=\"upgrade\",state=\"converged\"}";
        let text = metrics.encode().unwrap();
        assert_eq!(sample(&text, series), None, "a follower exports none: {text}");
        assert!(!text.contains("ichor_operation_phase{"), "{text}");
        metrics.leader.set(1);
        let text = metrics.encode().unwrap();
        assert_eq!(sample(&text, series), Some(3.0), "{text}");
        let phase = "ichor_operation_phase{namespace=\"ops\",operation=\"upgrade\",phase=\"Progressing\",reason=\"Progressing\"}";
        assert_eq!(sample(&text, phase), Some(1.0), "{text}");
    }

    #[test]
    fn a_converged_machines_steps_are_observed_once_by_the_leader() {
        use ichor_adapters::kubernetes::crd::{Role, TalosMachineSpec, TalosMachineStatus};
        let history = vec![
            step("TalosUpgrade", "Converged", 0),
            step("StorageEvacuation", "Evacuating", 100),
            step("StorageEvacuation", "Ended", 400),
            step("TalosUpgrade", "UpgradeIntent", 410),
            step("TalosUpgrade", "UpgradeRequested", 412),
            step("TalosUpgrade", "Converged", 652),
        ];
        assert_eq!(step_durations(&history), [("evacuation", 300.0), ("upgrade", 240.0)]);
        let mut machine = TalosMachine::new(
            "w-1",
            TalosMachineSpec { cluster: "prod".into(), role: Role::Worker, address: "10.5.0.2".into(), hostname: None },
        );
        machine.status = Some(TalosMachineStatus { history, ..TalosMachineStatus::default() });
        let metrics = Metrics::new();
        metrics.machine_seen(&machine);
        let count = "ichor_machine_step_duration_seconds_count{step=\"upgrade\"}";
        assert_eq!(sample(&metrics.encode().unwrap(), count), None, "a follower observes nothing");
        metrics.leader.set(1);
        metrics.machine_seen(&machine);
        metrics.machine_seen(&machine);
        let text = metrics.encode().unwrap();
        assert_eq!(sample(&text, count), Some(1.0), "once per convergence: {text}");
        let sum = "ichor_machine_step_duration_seconds_sum{step=\"evacuation\"}";
        assert_eq!(sample(&text, sum), Some(300.0), "{text}");

        // Not converged (an upgrade under way): nothing.
        let mut busy = machine.clone();
        busy.metadata.name = Some("w-2".into());
        busy.status.as_mut().unwrap().history.push(step("TalosUpgrade", "UpgradeIntent", 900));
        metrics.machine_seen(&busy);
        assert_eq!(sample(&metrics.encode().unwrap(), count), Some(1.0));
    }
}
