//! Maintenance windows as the engine decides on them (issue 56 item 3): a machine starts
//! only inside a window, and only if its calibrated p90 turn ends before that window does.
//! Every other tool of the field (tuppr, system-upgrade-controller, kured) checks only that
//! a window is open at the start, so a slow machine runs past its end; the engine knows how
//! long a machine takes and refuses the start that would.
//!
//! The windows as written ([`MaintenanceSpec`]: cron schedules, durations, IANA time zones
//! and blackout periods) are expanded by the shell (`ichor_executor::calendar`), where the
//! time-zone database lives, into a [`Calendar`]: the instants in which a start may be
//! made, as plain [`Timestamp`] spans, blackouts cut out and overlapping windows merged
//! (a union). The core decides on those spans alone ([`Calendar::admit`]), so the rule is
//! pure and property-tested, daylight-saving changes and all, in the shell's tests.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// The maintenance windows as written on a `TalosCluster` (or an operation, in its place):
/// a machine starts only inside one of `windows` (their union), never inside a blackout,
/// and only when its turn's p90 ends before the window it starts in does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceSpec {
    /// The windows; none: no window rule (a machine may start at any time).
    #[serde(default)]
    pub windows: Vec<WindowSpec>,
    /// Periods in which nothing starts and into which no turn may run, whatever the
    /// windows say.
    #[serde(default)]
    pub blackouts: Vec<BlackoutSpec>,
}

impl MaintenanceSpec {
    /// Whether it sets any rule: a spec with neither windows nor blackouts lets a machine
    /// start at any time.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.blackouts.is_empty()
    }
}

/// One window, recurring: it opens at each local time its cron schedule names in its time
/// zone, and stays open for its duration of elapsed time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowSpec {
    /// When it opens: a five-field cron schedule (minute, hour, day of month, month, day
    /// of week), such as `0 2 * * SAT,SUN`, read in `time_zone`. A local time that a
    /// daylight-saving change skips opens no window that day.
    pub schedule: String,
    /// How long it stays open, elapsed time, such as `4h` or `90m` (a window that opens
    /// before a daylight-saving change is open for the same hours as on any other day).
    pub duration: String,
    /// The IANA time zone the schedule is read in, such as `Europe/Berlin`; `UTC` if
    /// left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
}

/// A blackout: from `start` to `end` (RFC 3339 instants with their offsets, such as
/// `2026-12-24T00:00:00+01:00`), no machine starts and no turn may run into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlackoutSpec {
    /// When it begins.
    pub start: String,
    /// When it ends.
    pub end: String,
    /// Why, for people (shown nowhere else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A span of time, `start` included, `end` not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Span {
    /// Its first instant.
    pub start: Timestamp,
    /// The instant after its last.
    pub end: Timestamp,
}

impl Span {
    /// The span from `start` to `end`.
    #[must_use]
    pub const fn new(start: Timestamp, end: Timestamp) -> Self {
        Self { start, end }
    }

    /// Whether `at` is in it.
    #[must_use]
    pub fn contains(&self, at: Timestamp) -> bool {
        self.start <= at && at < self.end
    }
}

/// The instants in which a machine may start, from some instant up to a horizon: sorted,
/// disjoint spans (overlapping or touching windows merged, blackouts cut out). What lies
/// beyond the horizon is not known: a span that reaches it is taken to end there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calendar {
    spans: Vec<Span>,
    horizon: Timestamp,
}

impl Calendar {
    /// The calendar whose open time is the union of `windows` less the union of
    /// `blackouts`, up to `horizon`. Empty or inverted spans count for nothing.
    #[must_use]
    pub fn new(
        windows: impl IntoIterator<Item = Span>,
        blackouts: impl IntoIterator<Item = Span>,
        horizon: Timestamp,
    ) -> Self {
        let open = merged(windows.into_iter().map(|s| Span::new(s.start, s.end.min(horizon))));
        let closed = merged(blackouts);
        Self { spans: subtract(&open, &closed), horizon }
    }

    /// The open spans, in order.
    #[must_use]
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// How far it is known.
    #[must_use]
    pub fn horizon(&self) -> Timestamp {
        self.horizon
    }

    /// The open span `at` is in, if any.
    #[must_use]
    pub fn span_at(&self, at: Timestamp) -> Option<Span> {
        let i = self.spans.partition_point(|s| s.end <= at);
        self.spans.get(i).copied().filter(|s| s.contains(at))
    }

    /// The earliest instant at or after `from` at which a turn of `turn` could start: in
    /// an open span, with the turn ending by that span's end. `None`: none before the
    /// horizon.
    #[must_use]
    pub fn next_fit(&self, from: Timestamp, turn: Duration) -> Option<Timestamp> {
        let first = self.spans.partition_point(|s| s.end <= from);
        self.spans[first..].iter().find_map(|s| {
            let at = s.start.max(from);
            (at.saturating_add(turn) <= s.end).then_some(at)
        })
    }

    /// Whether a machine whose turn's p90 is `turn` may start at `now`.
    #[must_use]
    pub fn admit(&self, now: Timestamp, turn: Duration) -> WindowVerdict {
        match self.span_at(now) {
            Some(span) if now.saturating_add(turn) <= span.end => WindowVerdict::Open { closes: span.end },
            Some(span) => WindowVerdict::WouldOverrun { closes: span.end, next_start: self.next_fit(now, turn) },
            None => WindowVerdict::Outside { next_start: self.next_fit(now, turn) },
        }
    }

    /// How a rollout would go through these windows from `from`: the control planes'
    /// turns one after another, then the workers' `slots` at a time, each started only
    /// when the calendar admits its role's p90 (`p90`) and taking its own time (`turns`,
    /// such as a plan's median run). `None`: it does not fit before the horizon.
    #[must_use]
    pub fn fit(&self, from: Timestamp, turns: &Turns<'_>, p90: TurnP90, slots: usize) -> Option<Fitted> {
        let mut opened: BTreeSet<Span> = BTreeSet::new();
        // The engine starts machines in its order: none before the one ahead of it.
        let mut last = from;
        let mut start = |at: Timestamp, turn: Duration| -> Option<Timestamp> {
            let at = self.next_fit(at.max(last), turn)?;
            opened.extend(self.span_at(at));
            last = at;
            Some(at)
        };
        let mut at = from;
        for turn in turns.control_planes {
            at = start(at, p90.control_plane)?.saturating_add(*turn);
        }
        let mut free = vec![at; slots.max(1)];
        let mut finish = at;
        for turn in turns.workers {
            let slot = free.iter_mut().min()?;
            let began = start(*slot, p90.worker)?;
            *slot = began.saturating_add(*turn);
            finish = finish.max(*slot);
        }
        Some(Fitted { windows: opened.len(), finish })
    }
}

/// A rollout's turns, in the engine's order, for [`Calendar::fit`].
#[derive(Debug, Clone, Copy)]
pub struct Turns<'a> {
    /// The control planes', one after another.
    pub control_planes: &'a [Duration],
    /// The workers'.
    pub workers: &'a [Duration],
}

/// How a rollout fits a calendar ([`Calendar::fit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fitted {
    /// How many of the calendar's open spans its starts fall in: the windows it needs.
    pub windows: usize,
    /// When its last turn would end.
    pub finish: Timestamp,
}

/// The p90 of one machine's turn, by role: what a start is admitted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnP90 {
    /// A control plane's.
    pub control_plane: Duration,
    /// A worker's.
    pub worker: Duration,
}

/// What [`Calendar::admit`] says of a start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowVerdict {
    /// Inside a window that the turn's p90 ends before: it may start.
    Open {
        /// When that window closes.
        closes: Timestamp,
    },
    /// Outside every window (or in a blackout).
    Outside {
        /// When the next window that can take the turn opens (`None`: none before the
        /// calendar's horizon).
        next_start: Option<Timestamp>,
    },
    /// Inside a window, but the turn's p90 would run past its end.
    WouldOverrun {
        /// When the window closes.
        closes: Timestamp,
        /// When the next window that can take the turn opens.
        next_start: Option<Timestamp>,
    },
}

/// The windows the engine decides on for one pass: a calendar expanded at the pass's
/// instant with the turns' p90, or why the spec could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Windows {
    /// The calendar, from the pass's instant.
    Calendar {
        /// The open spans.
        calendar: Calendar,
        /// What a start of each role is admitted on.
        p90: TurnP90,
    },
    /// The spec is wrong (refused at planning, touching nothing): what is wrong, naming
    /// the field.
    Invalid(String),
}

/// `spans` sorted and merged where they overlap or touch, empty ones dropped.
fn merged(spans: impl IntoIterator<Item = Span>) -> Vec<Span> {
    let mut spans: Vec<Span> = spans.into_iter().filter(|s| s.start < s.end).collect();
    spans.sort_unstable();
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(last) if s.start <= last.end => last.end = last.end.max(s.end),
            _ => out.push(s),
        }
    }
    out
}

/// `open` less `closed`, both sorted and disjoint.
fn subtract(open: &[Span], closed: &[Span]) -> Vec<Span> {
    let mut out = Vec::with_capacity(open.len());
    for s in open {
        let mut from = s.start;
        for c in closed.iter().filter(|c| c.end > s.start && c.start < s.end) {
            if c.start > from {
                out.push(Span::new(from, c.start));
            }
            from = from.max(c.end);
        }
        if from < s.end {
            out.push(Span::new(from, s.end));
        }
    }
    out
}

#[cfg(test)]
mod tests;
