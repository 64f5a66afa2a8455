//! A monitoring stack for alert gates (issue 56 item 2): Alertmanager's alerts and
//! silences, as the engine's [`KubeApi::alerts`](ichor_executor::kube_api::KubeApi::alerts)
//! and silences read and write them. `KubeNodeNotReady{node, severity="warning"}` fires
//! for every Node the API server shows NotReady (as kube-state-metrics' rule does), and a
//! test adds alerts of its own ([`SimAlerting::firing`]). A silence covers an alert when
//! it is in force and every matcher matches; each silence the engine writes is kept
//! ([`SimAlerting::writes`]) for the checks.

use ichor_executor::alert_gates::Matcher;
use ichor_executor::kube_api::{Alert, Metadata, Silence};
use ichor_upgrade_core::Timestamp;

use super::World;

/// An alert a test makes fire: its labels, from when, until when (`None`: for ever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimAlert {
    /// Its labels, `alertname` among them.
    pub labels: Metadata,
    /// When it starts firing.
    pub from: Timestamp,
    /// When it stops (`None`: never).
    pub until: Option<Timestamp>,
}

/// The simulated Alertmanager.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimAlerting {
    /// Alerts a test made fire.
    pub firing: Vec<SimAlert>,
    /// Every silence, expired ones included.
    pub silences: Vec<Silence>,
    /// Each silence write, at its time, as written (its ID the one given).
    pub writes: Vec<(Timestamp, Silence)>,
}

impl World {
    /// The alerts in force now, each with the silences that cover it.
    pub(crate) fn alerts_now(&self) -> Vec<Alert> {
        let now = self.now;
        let mut alerts: Vec<(Metadata, Timestamp)> = self
            .nodes
            .iter()
            .filter(|n| !n.view.ready)
            .map(|n| {
                let labels = [("alertname", "KubeNodeNotReady"), ("node", n.name.as_str()), ("severity", "warning")];
                (labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), now)
            })
            .collect();
        alerts.extend(
            self.alerting
                .firing
                .iter()
                .filter(|a| a.from <= now && a.until.is_none_or(|u| now < u))
                .map(|a| (a.labels.clone(), a.from)),
        );
        alerts
            .into_iter()
            .map(|(labels, from)| Alert {
                silenced_by: self
                    .alerting
                    .silences
                    .iter()
                    .filter(|s| s.starts_at <= now && now < s.ends_at && covers(s, &labels))
                    .filter_map(|s| s.id.clone())
                    .collect(),
                labels,
                since: from.rfc3339(),
            })
            .collect()
    }

    /// Every silence, each `active` as it stands now.
    pub(crate) fn silences_now(&self) -> Vec<Silence> {
        let now = self.now;
        self.alerting
            .silences
            .iter()
            .map(|s| Silence { active: s.starts_at <= now && now < s.ends_at, ..s.clone() })
            .collect()
    }

    /// Creates `silence`, or updates the one of its ID in force in place (as Alertmanager
    /// does when only its end changes): its ID.
    pub(crate) fn put_silence(&mut self, silence: &Silence) -> String {
        let now = self.now;
        self.alerting.writes.push((now, silence.clone()));
        let in_force = silence
            .id
            .as_ref()
            .and_then(|id| self.alerting.silences.iter_mut().find(|s| s.id.as_ref() == Some(id) && s.ends_at > now));
        if let Some(held) = in_force
            && held.matchers == silence.matchers
        {
            held.ends_at = silence.ends_at;
            return held.id.clone().unwrap_or_default();
        }
        let id = format!("silence-{}", self.alerting.silences.len() + 1);
        self.alerting.silences.push(Silence { id: Some(id.clone()), ..silence.clone() });
        id
    }
}

/// Whether every matcher of `silence` matches `labels`.
fn covers(silence: &Silence, labels: &Metadata) -> bool {
    silence.matchers.iter().all(|m| {
        let op = match (m.is_equal, m.is_regex) {
            (true, false) => "=",
            (false, false) => "!=",
            (true, true) => "=~",
            (false, true) => "!~",
        };
        Matcher::parse(&format!("{}{op}{}", m.name, m.value)).is_ok_and(|matcher| matcher.matches(labels))
    })
}
