//! Alert gates (issue 56 item 2): the shell's half of an alert gate
//! ([`ichor_upgrade_core::gate::AlertSelector`]). [`read`] asks the gate's Alertmanager or
//! Prometheus for its alerts and keeps those that carry every matcher: the gate holds
//! while none fires but for those Ichor's own silence covers. [`hold_silences`] keeps a
//! silence for each machine in its turn, as a lease ([`ichor_upgrade_core::gate::silence_until`]).
//!
//! Authority. A silence is a write to the monitoring stack, made inside the pass, after
//! the pass wrote its status as the cluster lock's holder, through the same client as
//! every other write: a fencing wrapper refuses it on a replica that does not lead. Nothing
//! runs between passes: a silence that no pass renews lapses within its lease, which is
//! how a dead leader's silences end. The pass comes back before a renewal is due (the
//! outcome's `requeue_at`).
//!
//! A silence covers the alerts whose machine label names the machine's Node, and the
//! gate's extra matchers; its comment names the operation, the gate and the machine, which
//! is how a later pass (of any replica) finds it again. The earliest start among a
//! machine's silences for this operation and gate is the start its cap counts from, so a
//! silence that lapsed and is made again never outlives the cap.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::gate::{AlertSelector, AlertSilence, GateReading, GateSpec, silence_due, silence_renew_at};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use regex::Regex;

use crate::calls::{Executor, bounded};
use crate::cause::report;
use crate::kube_api::{Alert, KubeApi, Metadata, Silence, SilenceMatcher};

/// Who the engine's silences say made them.
pub const CREATED_BY: &str = "ichor";

/// A label matcher, as Alertmanager writes one: `name=value`, `name!=value`,
/// `name=~regex`, `name!~regex`. A label an alert lacks reads as empty.
#[derive(Debug, Clone)]
pub struct Matcher {
    name: String,
    value: String,
    equal: bool,
    regex: Option<Regex>,
}

impl Matcher {
    /// `text` read as a matcher (a quoted value is unquoted).
    ///
    /// # Errors
    /// No operator, an empty or malformed label name, or a regex that does not compile.
    pub fn parse(text: &str) -> Result<Self, String> {
        let at = text.find(['=', '!']).ok_or_else(|| format!("{text:?} has no =, !=, =~ or !~"))?;
        let name = text[..at].trim();
        let rest = &text[at..];
        let (equal, is_regex, value) = if let Some(v) = rest.strip_prefix("=~") {
            (true, true, v)
        } else if let Some(v) = rest.strip_prefix("!~") {
            (false, true, v)
        } else if let Some(v) = rest.strip_prefix("!=") {
            (false, false, v)
        } else if let Some(v) = rest.strip_prefix('=') {
            (true, false, v)
        } else {
            return Err(format!("{text:?} has no =, !=, =~ or !~"));
        };
        let valid_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(format!("{text:?}: {name:?} is not a label name"));
        }
        let value = value.trim();
        let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value).to_owned();
        let regex = is_regex
            .then(|| {
                Regex::new(&format!("^(?:{value})$")).map_err(|e| format!("{text:?}: the regex does not compile: {e}"))
            })
            .transpose()?;
        Ok(Self { name: name.to_owned(), value, equal, regex })
    }

    /// Whether `labels` match.
    #[must_use]
    pub fn matches(&self, labels: &Metadata) -> bool {
        let value = labels.get(&self.name).map_or("", String::as_str);
        let same = match &self.regex {
            Some(regex) => regex.is_match(value),
            None => value == self.value,
        };
        same == self.equal
    }

    /// As a silence's matcher.
    #[must_use]
    pub fn for_silence(&self) -> SilenceMatcher {
        SilenceMatcher {
            name: self.name.clone(),
            value: self.value.clone(),
            is_regex: self.regex.is_some(),
            is_equal: self.equal,
        }
    }
}

/// An alert gate's matchers and its silence's, parsed.
#[derive(Debug, Clone)]
pub struct AlertGate {
    /// The alerts it reads and where.
    pub selector: AlertSelector,
    /// The alerts it waits on carry all of these.
    pub matchers: Vec<Matcher>,
    /// Its silence's own extra matchers (beside the machine's).
    pub silence_matchers: Vec<Matcher>,
}

/// `selector` parsed, or what keeps it from reading, naming the gate (`at`) and the
/// matcher.
///
/// # Errors
/// A matcher that does not parse.
pub fn compile(selector: &AlertSelector, at: &str) -> Result<AlertGate, String> {
    let parse = |field: &str, list: &[String]| {
        list.iter()
            .enumerate()
            .map(|(i, m)| Matcher::parse(m).map_err(|e| format!("{at}.{field}[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()
    };
    let matchers = parse("alerts.matchers", &selector.matchers)?;
    let silence_matchers = match &selector.silence {
        Some(silence) => parse("alerts.silence.matchers", &silence.matchers)?,
        None => Vec::new(),
    };
    Ok(AlertGate { selector: selector.clone(), matchers, silence_matchers })
}

/// The comment that names a machine's silence for an operation (`identity`) and a gate;
/// [`ours`] reads it back.
#[must_use]
pub fn comment(identity: &str, gate: &str, machine: &str) -> String {
    format!("{} machine {machine}", comment_prefix(identity, gate))
}

fn comment_prefix(identity: &str, gate: &str) -> String {
    format!("ichor: the turn of a machine in operation {identity}, alert gate {gate};")
}

/// Whether `silence` is the engine's, for the operation `identity` and `gate`.
#[must_use]
pub fn ours(silence: &Silence, identity: &str, gate: &str) -> bool {
    silence.created_by == CREATED_BY && silence.comment.starts_with(&comment_prefix(identity, gate))
}

/// What an alert gate reads now through `kube` (each call within `bound`): the alerts of its source that carry every matcher, but
/// those the engine's own silences for this operation and gate cover. The first left, in
/// name and label order, is the one the wait names.
pub async fn read(kube: &dyn KubeApi, bound: Duration, gate: &AlertGate, identity: &str, name: &str) -> GateReading {
    let selector = &gate.selector;
    let read = bounded("read a gate's alerts", bound, kube.alerts(selector)).await;
    let alerts = match read {
        Ok(Ok(alerts)) => alerts,
        Ok(Err(e)) => return GateReading::NotRead { why: format!("{}: {}", selector.source(), report(&e)) },
        Err(e) => return GateReading::NotRead { why: format!("{}: {e}", selector.source()) },
    };
    let own: Vec<String> = match (&selector.alertmanager, &selector.silence) {
        (Some(alertmanager), Some(_)) => {
            let read = bounded("read silences", bound, kube.silences(alertmanager)).await;
            match read {
                Ok(Ok(silences)) => {
                    silences.into_iter().filter(|s| ours(s, identity, name)).filter_map(|s| s.id).collect()
                }
                Ok(Err(e)) => return GateReading::NotRead { why: format!("{}: {}", selector.source(), report(&e)) },
                Err(e) => return GateReading::NotRead { why: format!("{}: {e}", selector.source()) },
            }
        }
        _ => Vec::new(),
    };
    let mut firing: Vec<&Alert> = alerts
        .iter()
        .filter(|a| gate.matchers.iter().all(|m| m.matches(&a.labels)))
        .filter(|a| !a.silenced_by.iter().any(|id| own.contains(id)))
        .collect();
    firing.sort_by(|a, b| a.labels.cmp(&b.labels));
    match firing.first() {
        None => GateReading::Holds,
        Some(alert) => {
            let more = match firing.len() - 1 {
                0 => String::new(),
                n => format!(" (and {n} more)"),
            };
            GateReading::Fails { object: describe(alert), value: format!("firing since {}{more}", alert.since) }
        }
    }
}

/// `alert` for people: `alert NAME{label="value", ...}`, its name first.
#[must_use]
pub fn describe(alert: &Alert) -> String {
    let name = alert.labels.get("alertname").map_or("?", String::as_str);
    let labels: Vec<String> =
        alert.labels.iter().filter(|(k, _)| *k != "alertname").map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("alert {name}{{{}}}", labels.join(", "))
}

/// A machine in its turn, as the silences see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InTurn {
    /// The machine.
    pub machine: String,
    /// Its Node's name.
    pub node: String,
    /// Its role.
    pub role: MachineRole,
    /// Its order label.
    pub order: Option<String>,
}

/// Holds a silence for each machine in its turn that an alert gate with a silence covers
/// (`gates`: the specs in force, with `compiled` their parsed matchers by gate name):
/// creates one where none is in force, renews one less than half of whose lease is left,
/// never past its cap; a machine whose turn ended is not renewed, and its silence lapses.
/// When the pass should come back to renew (`None`: nothing held). A failed write is
/// logged and tried again at the next pass; the gate meanwhile sees the machine's alerts,
/// and waits.
pub async fn hold_silences(
    ex: &Executor<'_>,
    identity: &str,
    gates: &[(GateSpec, AlertGate)],
    in_turn: &[InTurn],
    now: Timestamp,
) -> Option<Timestamp> {
    let mut renew_at: Option<Timestamp> = None;
    let mut listed: BTreeMap<String, Result<Vec<Silence>, String>> = BTreeMap::new();
    for (spec, gate) in gates {
        let (Some(alertmanager), Some(silence)) = (&gate.selector.alertmanager, &gate.selector.silence) else {
            continue;
        };
        let Ok(rules) = ichor_upgrade_core::gate::rules(std::slice::from_ref(spec)) else { continue };
        let covered: Vec<&InTurn> = in_turn.iter().filter(|m| rules[0].covers(m.role, m.order.as_deref())).collect();
        if covered.is_empty() {
            continue;
        }
        if !listed.contains_key(alertmanager) {
            let read = bounded("read silences", ex.config.call_timeout, ex.kube.silences(alertmanager)).await;
            let read = match read {
                Ok(Ok(list)) => Ok(list),
                Ok(Err(e)) => Err(report(&e)),
                Err(e) => Err(e.to_string()),
            };
            listed.insert(alertmanager.clone(), read);
        }
        let silences = match &listed[alertmanager] {
            Ok(list) => list,
            Err(why) => {
                tracing::warn!(gate = %spec.name, %alertmanager, error = %why, "could not read the silences");
                renew_at = Timestamp::min_opt(renew_at, Some(now.saturating_add(RETRY)));
                continue;
            }
        };
        for machine in covered {
            let held = hold_one(ex, identity, spec, gate, silence, alertmanager, silences, machine, now).await;
            renew_at = Timestamp::min_opt(renew_at, held);
        }
    }
    renew_at
}

/// How soon a silence that could not be read or written is tried again.
const RETRY: Duration = Duration::from_secs(10);

#[allow(clippy::too_many_arguments, reason = "one machine's silence: each argument is its own fact")]
async fn hold_one(
    ex: &Executor<'_>,
    identity: &str,
    spec: &GateSpec,
    gate: &AlertGate,
    silence: &AlertSilence,
    alertmanager: &str,
    silences: &[Silence],
    machine: &InTurn,
    now: Timestamp,
) -> Option<Timestamp> {
    let comment = comment(identity, &spec.name, &machine.machine);
    let mine: Vec<&Silence> = silences.iter().filter(|s| s.created_by == CREATED_BY && s.comment == comment).collect();
    let first = mine.iter().map(|s| s.starts_at).min();
    let in_force = mine.iter().find(|s| s.active && s.ends_at > now);
    let lease = Duration::from_secs(u64::try_from(silence.lease_seconds).unwrap_or(0));
    let max = Duration::from_secs(u64::try_from(silence.max_seconds).unwrap_or(0));
    let until = ichor_upgrade_core::gate::silence_until(lease, max, first, now)?;
    if let Some(held) = in_force
        && !silence_due(lease, held.ends_at, now)
    {
        return Some(silence_renew_at(lease, held.ends_at).min(until));
    }
    let mut matchers = vec![SilenceMatcher {
        name: silence.node_label.clone(),
        value: machine.node.clone(),
        is_regex: false,
        is_equal: true,
    }];
    matchers.extend(gate.silence_matchers.iter().map(Matcher::for_silence));
    let write = Silence {
        id: in_force.and_then(|s| s.id.clone()),
        matchers,
        starts_at: in_force.map_or(now, |s| s.starts_at),
        ends_at: until,
        created_by: CREATED_BY.to_owned(),
        comment,
        active: true,
    };
    let put = bounded("write a silence", ex.config.call_timeout, ex.kube.put_silence(alertmanager, &write)).await;
    match put {
        Ok(Ok(id)) => {
            tracing::info!(gate = %spec.name, machine = %machine.machine, %id, until = %until.rfc3339(), "silence held");
            Some(silence_renew_at(lease, until))
        }
        Ok(Err(e)) => {
            tracing::warn!(gate = %spec.name, machine = %machine.machine, error = %report(&e), "could not write a silence");
            Some(now.saturating_add(RETRY))
        }
        Err(e) => {
            tracing::warn!(gate = %spec.name, machine = %machine.machine, error = %e, "could not write a silence");
            Some(now.saturating_add(RETRY))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Metadata {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn matchers_read_and_match_as_alertmanagers_do() {
        let alert = labels(&[("alertname", "KubeNodeNotReady"), ("node", "w-3"), ("severity", "critical")]);
        let yes =
            ["severity=critical", "severity=\"critical\"", "node!=w-1", "node=~w-.*", "alertname!~Watchdog|Info.*"];
        for m in yes {
            assert!(Matcher::parse(m).unwrap().matches(&alert), "{m}");
        }
        let no = ["severity=warning", "node!=w-3", "node=~w", "team=~.+", "alertname!~Kube.*"];
        for m in no {
            assert!(!Matcher::parse(m).unwrap().matches(&alert), "{m}");
        }
        // A label the alert lacks reads as empty.
        assert!(Matcher::parse("team=").unwrap().matches(&alert));
        assert!(Matcher::parse("severity").unwrap_err().contains("has no =, !=, =~ or !~"));
        assert!(Matcher::parse("1x=y").unwrap_err().contains("is not a label name"));
        assert!(Matcher::parse("node=~(").unwrap_err().contains("the regex does not compile"));
    }

    #[test]
    fn a_bad_matcher_is_refused_naming_the_gate_and_field() {
        let selector = AlertSelector {
            alertmanager: Some("http://am:9093".into()),
            matchers: vec!["severity=critical".into(), "node=~(".into()],
            ..AlertSelector::default()
        };
        let problem = compile(&selector, "gates[0] (alerts)").unwrap_err();
        assert!(problem.starts_with("gates[0] (alerts).alerts.matchers[1]: \"node=~(\""), "{problem}");
    }

    #[test]
    fn the_engines_silences_are_told_apart_by_operation_and_gate() {
        let mine = Silence {
            id: Some("a".into()),
            matchers: Vec::new(),
            starts_at: Timestamp::from_unix_secs(0),
            ends_at: Timestamp::from_unix_secs(300),
            created_by: CREATED_BY.into(),
            comment: comment("ops/upgrade/uid-1", "alerts", "w-1"),
            active: true,
        };
        assert!(ours(&mine, "ops/upgrade/uid-1", "alerts"));
        assert!(!ours(&mine, "ops/upgrade/uid-2", "alerts"));
        assert!(!ours(&mine, "ops/upgrade/uid-1", "other"));
        assert!(!ours(&Silence { created_by: "alice".into(), ..mine.clone() }, "ops/upgrade/uid-1", "alerts"));
        let alert = Alert { labels: labels(&[("alertname", "X"), ("node", "w-1")]), ..Alert::default() };
        assert_eq!(describe(&alert), "alert X{node=\"w-1\"}");
    }
}
