//! The notices an operation owes its cluster's receivers (`spec.notifications`), and its
//! outbox's transitions (decision 0019): pure, with no IO and no clock (the time is an
//! argument). [`crate::notify`] reads, sends and writes.
//!
//! A notice is derived from the operation's status, never emitted: the same operation
//! gives the same notices, each with an id stable across passes and replicas, so that a
//! new leader owes exactly what the old one did and finds in the outbox
//! (`status.notifications`) what was sent already:
//!
//! | event | owed when | id |
//! |---|---|---|
//! | `Started` | it started a machine (its started target is recorded) | `<uid>/started` |
//! | `MachineFailed` | a pause names a failed machine | `<uid>/failed/<machine>/<pause>` |
//! | `Paused` | it is Paused (a failure's or a person's), with the command that resumes it | `<uid>/paused/<pause>` |
//! | `Waiting` | it has been Waiting for one reason `waitingAfterSeconds` | `<uid>/waiting/<reason>/<since>` |
//! | `Completed` | it completed, with its makespan against the plan when a dry run made one | `<uid>/completed` |
//!
//! `<pause>` and `<since>` are Unix seconds: the Paused condition's transition, and the
//! wait's beginning as the outbox recorded it.

use std::sync::Arc;

use ichor_adapters::kubernetes::crd::{
    NotificationRecord, NotificationsSpec, NotificationsStatus, TalosOperation, WaitingSince,
};
use ichor_upgrade_core::status::{OperationStatus, PauseReason, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

/// A record waiting for its next attempt.
pub const PENDING: &str = "Pending";
/// A record whose attempt was made and whose answer is not recorded yet.
pub const SENDING: &str = "Sending";
/// A record the receiver answered 2xx.
pub const DELIVERED: &str = "Delivered";
/// A record retried for `giveUpAfterSeconds` in vain.
pub const GAVE_UP: &str = "GaveUp";

/// How long an operation waits before a notice says so, by default.
pub const DEFAULT_WAITING_AFTER_SECONDS: i64 = 600;
/// How long a notice is retried, by default.
pub const DEFAULT_GIVE_UP_AFTER_SECONDS: i64 = 21_600;
/// The first retry's delay; each next one doubles, up to [`LONGEST_BACKOFF`].
pub const FIRST_BACKOFF: SignedDuration = SignedDuration::from_secs(2);
/// The longest delay between two attempts.
pub const LONGEST_BACKOFF: SignedDuration = SignedDuration::from_secs(60);

/// A notice an operation owes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Its id: the same whoever derives it.
    pub id: String,
    /// `Started`, `MachineFailed`, `Paused`, `Waiting` or `Completed`.
    pub event: &'static str,
    /// What it says.
    pub message: String,
}

/// The engine's status of `op` (`status.engine`), if it has one that reads.
fn engine(op: &TalosOperation) -> Option<OperationStatus> {
    let value = op.status.as_ref()?.engine.clone()?;
    serde_json::from_value(value).ok()
}

/// When `op`'s condition `type_` last turned True, Unix seconds.
fn turned_true(op: &TalosOperation, type_: &str) -> Option<i64> {
    op.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| c.last_transition_time.0.as_second())
}

/// `namespace/name`, and how to name its kind of upgrade in a sentence.
fn described(op: &TalosOperation) -> String {
    format!(
        "{}/{} ({} upgrade of {} to {})",
        op.namespace().unwrap_or_default(),
        op.name_any(),
        op.spec.kind,
        op.spec.cluster,
        op.spec.target_version
    )
}

/// The wait `op` is in now and since when: the outbox's `waiting`, carried over while its
/// reason stays, begun at `now` when it changes, gone when `op` no longer waits.
#[must_use]
pub fn waiting(op: &TalosOperation, previous: Option<&WaitingSince>, now: Timestamp) -> Option<WaitingSince> {
    let status = op.status.as_ref()?;
    if status.phase.as_deref() != Some("Waiting") {
        return None;
    }
    let reason = status.reason.clone().unwrap_or_default();
    match previous {
        Some(kept) if kept.reason == reason => Some(kept.clone()),
        _ => Some(WaitingSince { reason, since: Time(now) }),
    }
}

/// The notices `op` owes now: `waiting` is its outbox's wait ([`waiting`]) and
/// `operations` its namespace's operations (for the dry run its makespan is set against).
/// A dry run owes none.
#[must_use]
pub fn owed(
    op: &TalosOperation,
    operations: &[Arc<TalosOperation>],
    waiting: Option<&WaitingSince>,
    waiting_after_seconds: i64,
    now: Timestamp,
) -> Vec<Notice> {
    let (Some(engine), Some(uid)) = (engine(op), op.uid()) else { return Vec::new() };
    if op.spec.dry_run {
        return Vec::new();
    }
    let name = op.name_any();
    let namespace = op.namespace().unwrap_or_default();
    let what = described(op);
    let mut notices = Vec::new();
    if engine.started_target.is_some() {
        let machines = op.status.as_ref().and_then(|s| s.machines.as_ref()).map_or(0, |m| m.total);
        notices.push(Notice {
            id: format!("{uid}/started"),
            event: "Started",
            message: format!("{what} started: {machines} machines"),
        });
    }
    if let Phase::Paused(reason) = &engine.phase {
        let since = turned_true(op, "Paused").unwrap_or_default();
        if let PauseReason::MachineFailed { machines } = reason {
            for failed in machines {
                notices.push(Notice {
                    id: format!("{uid}/failed/{}/{since}", failed.name),
                    event: "MachineFailed",
                    message: format!("{what}: machine {} failed: {}", failed.name, failed.reason),
                });
            }
        }
        notices.push(Notice {
            id: format!("{uid}/paused/{since}"),
            event: "Paused",
            message: format!(
                "{what} paused: {}; to resume once the cause is fixed: kubectl ichor resume {name} -n {namespace}",
                engine.phase
            ),
        });
    }
    if let Some(wait) = waiting {
        let lasted = now.as_second() - wait.since.0.as_second();
        if lasted >= waiting_after_seconds {
            let on = op.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
            notices.push(Notice {
                id: format!("{uid}/waiting/{}/{}", wait.reason, wait.since.0.as_second()),
                event: "Waiting",
                message: format!("{what} has waited {lasted} s: {on}"),
            });
        }
    }
    if let Some(end) = crate::dry_run::completed_at(op) {
        notices.push(Notice {
            id: format!("{uid}/completed"),
            event: "Completed",
            message: completed(op, operations, end),
        });
    }
    notices
}

/// A completed operation's message: its makespan (from its creation to its completion),
/// against the plan of the dry run before it when there was one.
fn completed(op: &TalosOperation, operations: &[Arc<TalosOperation>], end_ms: i64) -> String {
    let what = described(op);
    let calibration =
        op.status.as_ref().and_then(|s| s.calibration.clone()).or_else(|| crate::dry_run::calibration(op, operations));
    match calibration {
        Some(c) => format!(
            "{what} completed in {:.0} s; the plan {} said p50 {:.0} s (p10 {:.0}, p90 {:.0}): {:+.1} %{}",
            c.actual_seconds,
            c.plan,
            c.p50_seconds,
            c.p10_seconds,
            c.p90_seconds,
            c.error_percent,
            if c.within_band { ", within its band" } else { ", outside its band" }
        ),
        None => {
            let start = op.creation_timestamp().map_or(end_ms, |t| t.0.as_millisecond());
            #[allow(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
            let seconds = (end_ms - start) as f64 / 1000.0;
            format!("{what} completed in {seconds:.0} s; no dry run planned it")
        }
    }
}

/// `outbox` with a `Pending` record for each notice of `owed` and sink of `spec` it has
/// no record of (in `owed`'s order, after those it has), and `waiting` as its wait.
#[must_use]
pub fn merged(
    outbox: &NotificationsStatus,
    owed: &[Notice],
    spec: &NotificationsSpec,
    waiting: Option<WaitingSince>,
    now: Timestamp,
) -> NotificationsStatus {
    let mut next = NotificationsStatus { waiting, records: outbox.records.clone() };
    for notice in owed {
        for sink in &spec.sinks {
            if next.records.iter().any(|r| r.id == notice.id && r.sink == sink.name) {
                continue;
            }
            next.records.push(NotificationRecord {
                id: notice.id.clone(),
                sink: sink.name.clone(),
                event: notice.event.to_owned(),
                message: notice.message.clone(),
                state: PENDING.to_owned(),
                attempts: 0,
                owed: Time(now),
                next_attempt: None,
                last_error: None,
            });
        }
    }
    next
}

/// The record of `outbox` to send to `sink` now, if any: its first one not Delivered nor
/// given up (notices go in order), when it is due: `Sending` (an attempt whose answer was
/// never recorded: the leader that made it died) or `Pending` past its `nextAttempt`.
#[must_use]
pub fn due(outbox: &NotificationsStatus, sink: &str, now: Timestamp) -> Option<usize> {
    let (index, record) = outbox
        .records
        .iter()
        .enumerate()
        .find(|(_, r)| r.sink == sink && r.state != DELIVERED && r.state != GAVE_UP)?;
    let ready = record.state == SENDING || record.next_attempt.as_ref().is_none_or(|at| at.0 <= now);
    ready.then_some(index)
}

/// `record` as an attempt begins: `Sending`, one more attempt.
#[must_use]
pub fn sending(record: &NotificationRecord) -> NotificationRecord {
    NotificationRecord { state: SENDING.to_owned(), attempts: record.attempts + 1, ..record.clone() }
}

/// `record` after its attempt's answer: `Delivered`; or, for an error, `Pending` again
/// after a backoff (2 s doubling to 60 s), or `GaveUp` once `give_up_after_seconds` have
/// passed since it was owed.
#[must_use]
pub fn answered(
    record: &NotificationRecord,
    answer: Result<(), String>,
    give_up_after_seconds: i64,
    now: Timestamp,
) -> NotificationRecord {
    match answer {
        Ok(()) => {
            NotificationRecord { state: DELIVERED.to_owned(), next_attempt: None, last_error: None, ..record.clone() }
        }
        Err(error) => {
            let owed_for = now.as_second() - record.owed.0.as_second();
            if owed_for >= give_up_after_seconds {
                return NotificationRecord {
                    state: GAVE_UP.to_owned(),
                    next_attempt: None,
                    last_error: Some(error),
                    ..record.clone()
                };
            }
            let doublings = u32::try_from(record.attempts.saturating_sub(1).clamp(0, 10)).unwrap_or(10);
            let backoff = (FIRST_BACKOFF * 2_i32.pow(doublings)).min(LONGEST_BACKOFF);
            NotificationRecord {
                state: PENDING.to_owned(),
                next_attempt: Some(Time(now + backoff)),
                last_error: Some(error),
                ..record.clone()
            }
        }
    }
}

/// The body a receiver of `kind` gets for `record` of `op`: for a webhook, the notice as
/// JSON; for Slack, `{"text": ...}`.
#[must_use]
pub fn body(
    kind: ichor_adapters::kubernetes::crd::SinkType,
    record: &NotificationRecord,
    op: &TalosOperation,
) -> serde_json::Value {
    match kind {
        ichor_adapters::kubernetes::crd::SinkType::Slack => {
            serde_json::json!({ "text": format!("[ichor] {}: {}", record.event, record.message) })
        }
        ichor_adapters::kubernetes::crd::SinkType::Webhook => serde_json::json!({
            "id": record.id,
            "event": record.event,
            "namespace": op.namespace(),
            "operation": op.name_any(),
            "cluster": op.spec.cluster,
            "kind": op.spec.kind,
            "targetVersion": op.spec.target_version,
            "message": record.message,
            "owed": record.owed,
        }),
    }
}

#[cfg(test)]
mod tests;
