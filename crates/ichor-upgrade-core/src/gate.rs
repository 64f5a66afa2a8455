//! Health gates as data (issue 56 item 1): a platform team's own check (an expression over
//! cluster objects, evaluated by the shell) that holds a rollout's next start, or its
//! completion, until it has held for a settle time. The core never evaluates an
//! expression: each pass the caller hands it what each gate read ([`GateReading`]), and
//! the core decides, purely, whether a start may go, how long the gate has held, and when
//! a wait has lasted past its timeout.
//!
//! | phase | checked |
//! | --- | --- |
//! | [`GatePhase::BeforeMachine`] | before each start of a machine in its scope |
//! | [`GatePhase::AfterMachine`] | after each machine in its scope converged: before the next start, and before the operation completes; its settle counts from the last convergence it saw |
//! | [`GatePhase::BeforeOperation`] | before the operation's first start |
//! | [`GatePhase::AfterOperation`] | before the operation completes |
//!
//! A gate that does not hold, or was not read, is a wait ([`GateBlock`]) naming the gate,
//! the object and its last value; one that waits past its timeout pauses the operation
//! until a person resumes it. Where it held, how long it held is kept in the operation's
//! status ([`GateState`]), so a restarted controller neither shortens a settle nor forgets
//! a timeout's start.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::machine::vocabulary::MachineRole;
use crate::time::Timestamp;

/// When a gate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GatePhase {
    /// Before each start of a machine in scope.
    BeforeMachine,
    /// After each machine in scope converged (before the next start, and the completion).
    AfterMachine,
    /// Before the operation's first start.
    BeforeOperation,
    /// Before the operation completes.
    AfterOperation,
}

/// A gate as a person writes it (`spec.gates[]`): what it reads (objects and a CEL
/// expression, or alerts), when it is checked, over which machines, and its times. The
/// expression and the alerts are the shell's to read; [`rules`] takes the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateSpec {
    /// Its name, unique among the gates in force.
    pub name: String,
    /// The objects it reads (with `expression`; not with `alerts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<GateObjects>,
    /// A CEL expression over `object` (each object read, as JSON) that must be `true` for
    /// every one, such as `object.status.robustness == "healthy"`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expression: String,
    /// An alert gate: it holds while no alert it selects fires (not with `objects`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<AlertSelector>,
    /// When it is checked.
    pub phase: GatePhase,
    /// Which machines it covers (every machine when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<GateScope>,
    /// How long the expression must hold, without a break, before the gate passes.
    #[serde(default)]
    pub settle_seconds: i64,
    /// How long a start waits on it before the operation pauses, naming it (never, when
    /// left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
}

/// The objects a gate reads: of one kind, in a namespace (every namespace when left out),
/// by name or by labels (every one of the kind when both are left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateObjects {
    /// The group/version, such as `longhorn.io/v1beta2` (`v1` for the core group).
    pub api_version: String,
    /// The kind, such as `Volume`.
    pub kind: String,
    /// The namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// One object's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Labels every object read carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<BTreeMap<String, String>>,
}

impl GateObjects {
    /// No objects (what an alert gate reads instead).
    #[must_use]
    pub fn none() -> Self {
        Self { api_version: String::new(), kind: String::new(), namespace: None, name: None, label_selector: None }
    }

    /// `Kind` with its group/version, for messages (`Volume.longhorn.io/v1beta2`).
    #[must_use]
    pub fn kind_name(&self) -> String {
        format!("{}.{}", self.kind, self.api_version)
    }
}

/// The alerts an alert gate reads: from one Alertmanager or one Prometheus, those that
/// carry every matcher. It holds while none of them fires, but for alerts that Ichor's own
/// silence covers (with Alertmanager: see [`AlertSilence`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertSelector {
    /// Alertmanager's base URL (`http://alertmanager.monitoring:9093`): its active
    /// alerts, silenced or inhibited ones included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alertmanager: Option<String>,
    /// Prometheus's base URL (`http://prometheus.monitoring:9090`): its firing alerts
    /// (pending ones are not yet firing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<String>,
    /// Label matchers, each `name=value`, `name!=value`, `name=~regex` or `name!~regex`
    /// (Alertmanager's; a regex matches the whole value). Every alert when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matchers: Vec<String>,
    /// Silence the alerts about each machine in its turn (Alertmanager only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence: Option<AlertSilence>,
}

impl AlertSelector {
    /// Where it reads, for messages (`Alertmanager http://...`).
    #[must_use]
    pub fn source(&self) -> String {
        match (&self.alertmanager, &self.prometheus) {
            (Some(url), _) => format!("Alertmanager {url}"),
            (None, Some(url)) => format!("Prometheus {url}"),
            (None, None) => "no source".to_owned(),
        }
    }
}

/// Ichor's silence of the alerts about a machine in its turn, held as a lease: created
/// when the machine's turn is seen, renewed by the leader's passes for `leaseSeconds` at a
/// time, never past `maxSeconds` from its first start ([`silence_until`]), and left to
/// lapse when the turn ends or no leader renews it. The alert gate ignores only the alerts
/// these silences cover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertSilence {
    /// The alert label that names a machine's Node (`node`, as kube-state-metrics
    /// writes it).
    #[serde(default = "default_node_label")]
    pub node_label: String,
    /// More matchers the silence carries (such as `severity!=critical`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matchers: Vec<String>,
    /// How long each renewal holds it.
    #[serde(default = "default_lease_seconds")]
    pub lease_seconds: i64,
    /// The longest it lasts from its first start, renewals included.
    #[serde(default = "default_max_seconds")]
    pub max_seconds: i64,
}

fn default_node_label() -> String {
    "node".to_owned()
}

const fn default_lease_seconds() -> i64 {
    300
}

const fn default_max_seconds() -> i64 {
    3600
}

impl Default for AlertSilence {
    fn default() -> Self {
        Self {
            node_label: default_node_label(),
            matchers: Vec::new(),
            lease_seconds: default_lease_seconds(),
            max_seconds: default_max_seconds(),
        }
    }
}

/// Until when a machine's silence is held at `now`: a lease from now, never past `max`
/// after its first start (`first`, the earliest start of its silences so far; `None`: it
/// begins now). `None` once the cap is reached: it lapses.
#[must_use]
pub fn silence_until(lease: Duration, max: Duration, first: Option<Timestamp>, now: Timestamp) -> Option<Timestamp> {
    let cap = first.unwrap_or(now).saturating_add(max);
    let until = std::cmp::min(now.saturating_add(lease), cap);
    (until > now).then_some(until)
}

/// Whether a silence held until `ends` is renewed at `now`: once less than half its lease
/// is left (renewing at every pass would write at every pass). The pass comes back by
/// [`silence_renew_at`].
#[must_use]
pub fn silence_due(lease: Duration, ends: Timestamp, now: Timestamp) -> bool {
    now >= silence_renew_at(lease, ends)
}

/// When a silence held until `ends` is next renewed: half its lease before it ends.
#[must_use]
pub fn silence_renew_at(lease: Duration, ends: Timestamp) -> Timestamp {
    ends.saturating_sub(lease / 2)
}

/// The machines a gate covers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateScope {
    /// `controlPlane` or `worker` (both when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<GateRole>,
    /// The order wave (`ichor.dev/order`); every wave when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<i64>,
}

/// A role, as a gate's scope names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GateRole {
    /// Control planes.
    ControlPlane,
    /// Workers.
    Worker,
}

/// The rules of `specs`, or what keeps them from being read (naming the gate and the
/// field): an empty or repeated name, a negative time, a kind or version left empty.
/// The expressions are the shell's to compile.
///
/// # Errors
/// The first problem found.
pub fn rules(specs: &[GateSpec]) -> Result<Vec<GateRule>, String> {
    let mut seen = std::collections::BTreeSet::new();
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let at = format!("gates[{i}]");
            if spec.name.trim().is_empty() {
                return Err(format!("{at}.name is empty"));
            }
            if !seen.insert(spec.name.as_str()) {
                return Err(format!("{at}.name {:?} is taken by an earlier gate", spec.name));
            }
            let seconds = |field: &str, value: i64| {
                u64::try_from(value)
                    .map(Duration::from_secs)
                    .map_err(|_| format!("{at} ({}).{field} is negative: {value}", spec.name))
            };
            match (&spec.objects, &spec.alerts) {
                (Some(objects), None) => {
                    if objects.api_version.trim().is_empty() || objects.kind.trim().is_empty() {
                        return Err(format!("{at} ({}): objects need an apiVersion and a kind", spec.name));
                    }
                    if spec.expression.trim().is_empty() {
                        return Err(format!("{at} ({}): objects need an expression", spec.name));
                    }
                }
                (None, Some(alerts)) => check_alerts(alerts, &format!("{at} ({}).alerts", spec.name), &seconds)?,
                (Some(_), Some(_)) | (None, None) => {
                    return Err(format!("{at} ({}): a gate reads objects or alerts, one of the two", spec.name));
                }
            }
            let scope = spec.scope.clone().unwrap_or_default();
            Ok(GateRule {
                name: spec.name.clone(),
                phase: spec.phase,
                role: scope.role.map(|r| match r {
                    GateRole::ControlPlane => MachineRole::ControlPlane,
                    GateRole::Worker => MachineRole::Worker,
                }),
                wave: scope.wave,
                settle: seconds("settleSeconds", spec.settle_seconds)?,
                timeout: spec.timeout_seconds.map(|t| seconds("timeoutSeconds", t)).transpose()?,
            })
        })
        .collect()
}

/// What keeps an alert gate's `alerts` (at `at`) from reading: no source or two, an
/// expression beside it, a silence without Alertmanager, a lease that is not positive or
/// a cap below it.
fn check_alerts(
    alerts: &AlertSelector,
    at: &str,
    seconds: &dyn Fn(&str, i64) -> Result<Duration, String>,
) -> Result<(), String> {
    if alerts.alertmanager.is_some() == alerts.prometheus.is_some() {
        return Err(format!("{at}: name one source, alertmanager or prometheus"));
    }
    for url in alerts.alertmanager.iter().chain(&alerts.prometheus) {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("{at}: {url:?} is not an http:// or https:// URL"));
        }
    }
    if let Some(silence) = &alerts.silence {
        if alerts.alertmanager.is_none() {
            return Err(format!("{at}.silence needs alertmanager: Prometheus holds no silences"));
        }
        if silence.node_label.trim().is_empty() {
            return Err(format!("{at}.silence.nodeLabel is empty"));
        }
        let lease = seconds("alerts.silence.leaseSeconds", silence.lease_seconds)?;
        let max = seconds("alerts.silence.maxSeconds", silence.max_seconds)?;
        if lease < Duration::from_secs(10) {
            return Err(format!("{at}.silence.leaseSeconds is {}: at least 10", silence.lease_seconds));
        }
        if max < lease {
            return Err(format!(
                "{at}.silence.maxSeconds ({}) is below leaseSeconds ({})",
                silence.max_seconds, silence.lease_seconds
            ));
        }
    }
    Ok(())
}

/// A gate as the core judges it: its name, when it is checked, over which machines, and
/// its times. What it reads and its expression are the shell's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRule {
    /// Its name, unique among the operation's gates.
    pub name: String,
    /// When it is checked.
    pub phase: GatePhase,
    /// The role of the machines it covers (`None`: every machine).
    pub role: Option<MachineRole>,
    /// The order wave (`ichor.dev/order`) of the machines it covers (`None`: every wave).
    pub wave: Option<i64>,
    /// How long it must have held, without a break, before it passes.
    pub settle: Duration,
    /// How long a start (or the completion) waits on it before the operation pauses
    /// (`None`: for ever).
    pub timeout: Option<Duration>,
}

impl GateRule {
    /// Whether it covers a machine of `role` in wave `order` (its order label).
    #[must_use]
    pub fn covers(&self, role: MachineRole, order: Option<&str>) -> bool {
        self.role.is_none_or(|r| r == role)
            && self.wave.is_none_or(|w| order.and_then(|o| o.trim().parse::<i64>().ok()) == Some(w))
    }
}

/// What a gate read in this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateReading {
    /// Its expression held on every object it covers.
    Holds,
    /// It did not hold: the first object it failed on, and the value it read there.
    Fails {
        /// The object (`Kind namespace/name`).
        object: String,
        /// The expression's value there, or why it could not be evaluated.
        value: String,
    },
    /// Its objects could not be read: never a pass from a guess.
    NotRead {
        /// Why.
        why: String,
    },
}

/// What the operation's status keeps of a gate between passes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateState {
    /// Since when it has held without a break, as passes saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding_since: Option<Timestamp>,
    /// How many machines in its scope had converged when `holding_since` began (an
    /// `afterMachine` gate's settle starts again after each convergence).
    #[serde(default)]
    pub after_converged: usize,
    /// Since when a start (or the completion) has waited on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<Timestamp>,
    /// What it last failed on (`object: value`), for the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    /// It waited past its timeout: the operation is paused on it until a resume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// The gates of an operation, as the caller hands them to [`crate::rollout::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gates {
    /// The rules, and what each read in this pass (a rule with no reading counts as not
    /// read).
    Rules {
        /// The rules.
        rules: Vec<GateRule>,
        /// By gate name.
        readings: BTreeMap<String, GateReading>,
    },
    /// The gates do not read (a bad expression, an unknown kind, two of one name): the
    /// upgrade is refused, touching nothing.
    Invalid(String),
}

/// A gate that keeps a start, or the completion, waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateBlock {
    /// The gate.
    pub gate: String,
    /// The object it last failed on (empty while it only settles).
    pub object: String,
    /// Its value there, or what keeps it from passing.
    pub value: String,
    /// When it passes if it keeps holding (`None`: it does not hold).
    pub settles_at: Option<Timestamp>,
}

/// The gates' states after this pass's readings, from `previous` (the status's): a gate
/// that holds keeps (or begins) its `holding_since`, one that does not loses it; an
/// `afterMachine` gate whose scope saw a machine converge since begins again. A gate's
/// wait and timeout are carried over; [`block`] and [`waited`] move them.
/// `converged(rule)`: how many machines in the rule's scope have converged.
#[must_use]
pub fn track(
    rules: &[GateRule],
    readings: &BTreeMap<String, GateReading>,
    previous: &BTreeMap<String, GateState>,
    converged: impl Fn(&GateRule) -> usize,
    now: Timestamp,
) -> BTreeMap<String, GateState> {
    rules
        .iter()
        .map(|rule| {
            let mut state = previous.get(&rule.name).cloned().unwrap_or_default();
            let converged = converged(rule);
            match readings.get(&rule.name) {
                Some(GateReading::Holds) => {
                    let after_a_machine = rule.phase == GatePhase::AfterMachine && converged > state.after_converged;
                    if state.holding_since.is_none() || after_a_machine {
                        state.holding_since = Some(now);
                        state.after_converged = converged;
                    }
                }
                Some(GateReading::Fails { object, value }) => {
                    state.holding_since = None;
                    state.last = Some(format!("{object}: {value}"));
                }
                Some(GateReading::NotRead { why }) => {
                    state.holding_since = None;
                    state.last = Some(format!("not read: {why}"));
                }
                None => {
                    state.holding_since = None;
                    state.last = Some("not read in this pass".to_owned());
                }
            }
            (rule.name.clone(), state)
        })
        .collect()
}

/// Whether `rule`, in `state`, passes at `now`: it holds and has held for its settle;
/// else what keeps it.
#[must_use]
pub fn block(rule: &GateRule, state: &GateState, reading: Option<&GateReading>, now: Timestamp) -> Option<GateBlock> {
    let blocked = |object: &str, value: String, settles_at| GateBlock {
        gate: rule.name.clone(),
        object: object.to_owned(),
        value,
        settles_at,
    };
    match (reading, state.holding_since) {
        (Some(GateReading::Holds), Some(since)) => {
            let settles_at = since.saturating_add(rule.settle);
            (now < settles_at).then(|| {
                let value = format!("holds; settles for {} s", rule.settle.as_secs());
                blocked("", value, Some(settles_at))
            })
        }
        (Some(GateReading::Fails { object, value }), _) => Some(blocked(object, value.clone(), None)),
        (Some(GateReading::NotRead { why }), _) => Some(blocked("", format!("not read: {why}"), None)),
        (Some(GateReading::Holds), None) | (None, _) => Some(blocked("", "not read in this pass".to_owned(), None)),
    }
}

/// A wait on `rule` that goes on at `now`: its state with the wait's start, and whether
/// the wait has now lasted past the rule's timeout.
#[must_use]
pub fn waited(rule: &GateRule, state: &mut GateState, now: Timestamp) -> bool {
    let since = *state.waiting_since.get_or_insert(now);
    let timed_out = rule.timeout.is_some_and(|t| now.saturating_since(since) >= t);
    state.timed_out |= timed_out;
    state.timed_out
}

#[cfg(test)]
mod tests;
