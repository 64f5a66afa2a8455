//! From trace records to what a timeline shows: each machine's phases as bars in time, and
//! the events that concern the whole rollout as markers.
//!
//! A machine's phase is a function of the events seen about it so far, moved forward only:
//! a `not-ready` of a machine that has not started, or of one that converged, is not a
//! reboot. Phases that happen before a machine's turn (an image pre-pull, the preflight
//! gate holding it back) end with their own closing event; the phases of its turn last
//! until the next one begins; `converged`, `removed` and `failed` last to the end.

use std::collections::HashMap;

use crate::trace::{CONTROL_PLANE, TraceRecord};

/// A phase of one machine, as drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The installer image is being pulled (ahead of the machine's turn, or in it).
    Pulling,
    /// The preflight gate holds the machine back.
    Held,
    /// Storage replicas are moving off the node.
    Evacuating,
    /// The upgrade call (Talos's own drain, install and reboot request in it) or the
    /// lifecycle install.
    Installing,
    /// The engine's cordon and drain (the lifecycle executor's, a removal's).
    Draining,
    /// The node is rebooting.
    Rebooting,
    /// The node is being reset (a removal): it leaves etcd, wipes its disks, powers off.
    Resetting,
    /// Booted; the Node is not Ready yet.
    WaitingReady,
    /// Ready; the engine verifies the version, the etcd member, the uncordon.
    Verifying,
    /// A Kubernetes upgrade's change: a machine configuration applied with no reboot, the
    /// component restarting (`config-apply` until its `component-ready`).
    Applying,
    /// Recorded converged.
    Converged,
    /// Removed from the cluster (a removal).
    Removed,
    /// Recorded failed.
    Failed,
}

impl Phase {
    /// Every phase, in the legend's order.
    pub const ALL: [Self; 13] = [
        Self::Pulling,
        Self::Held,
        Self::Evacuating,
        Self::Installing,
        Self::Draining,
        Self::Rebooting,
        Self::Resetting,
        Self::WaitingReady,
        Self::Verifying,
        Self::Applying,
        Self::Converged,
        Self::Removed,
        Self::Failed,
    ];

    /// The phase's name in the legend.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Pulling => "pulling image",
            Self::Held => "held by preflight",
            Self::Evacuating => "evacuating",
            Self::Installing => "upgrade call / install",
            Self::Draining => "cordon / drain",
            Self::Rebooting => "rebooting",
            Self::Resetting => "resetting (removal)",
            Self::WaitingReady => "waiting for Ready",
            Self::Verifying => "verifying",
            Self::Applying => "config apply (Kubernetes)",
            Self::Converged => "converged",
            Self::Removed => "removed",
            Self::Failed => "failed",
        }
    }

    /// The phase's name in the SVG's `data-phase` attributes, such as `waiting-ready`.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            Self::Pulling => "pulling",
            Self::Held => "held",
            Self::Evacuating => "evacuating",
            Self::Installing => "installing",
            Self::Draining => "draining",
            Self::Rebooting => "rebooting",
            Self::Resetting => "resetting",
            Self::WaitingReady => "waiting-ready",
            Self::Verifying => "verifying",
            Self::Applying => "applying",
            Self::Converged => "converged",
            Self::Removed => "removed",
            Self::Failed => "failed",
        }
    }

    /// Whether the phase is part of the machine's own turn (it is unavailable or about to be).
    #[must_use]
    pub fn in_turn(self) -> bool {
        matches!(
            self,
            Self::Evacuating
                | Self::Installing
                | Self::Draining
                | Self::Rebooting
                | Self::Resetting
                | Self::WaitingReady
                | Self::Verifying
                | Self::Applying
        )
    }

    /// Whether the phase ends the machine's turn and lasts to the end of the chart.
    #[must_use]
    pub fn is_final(self) -> bool {
        matches!(self, Self::Converged | Self::Removed | Self::Failed)
    }

    /// The phase that `event` moves a machine in `current` to, if any; `called`: its turn
    /// has made a legacy Upgrade call, whose drain is Talos's own, inside the call.
    fn next(current: Option<Self>, event: &str, called: bool) -> Option<Self> {
        let started = current.is_some_and(|p| p.in_turn());
        let restartable = current.is_none_or(|p| matches!(p, Self::Pulling | Self::Held | Self::Failed));
        match event {
            "image-pull-start" if started => (current < Some(Self::Installing)).then_some(Self::Installing),
            "image-pull-start" if current.is_none() => Some(Self::Pulling),
            "preflight-blocked" if current.is_none() || current == Some(Self::Pulling) => Some(Self::Held),
            "evacuation-start" if restartable => Some(Self::Evacuating),
            "upgrade-call" | "install-start" | "installed" | "call-lost"
                if restartable || current == Some(Self::Evacuating) =>
            {
                Some(Self::Installing)
            }
            "cordon" | "drain" if current == Some(Self::Installing) && called => None,
            "cordon" | "drain" if restartable || matches!(current, Some(Self::Evacuating | Self::Installing)) => {
                Some(Self::Draining)
            }
            "reset-call" if restartable || matches!(current, Some(Self::Evacuating | Self::Draining)) => {
                Some(Self::Resetting)
            }
            "reboot-call" | "reboot-start" | "not-ready" | "shown-not-ready"
                if matches!(current, Some(Self::Installing | Self::Draining)) =>
            {
                Some(Self::Rebooting)
            }
            "reboot-end" if matches!(current, Some(Self::Installing | Self::Draining | Self::Rebooting)) => {
                Some(Self::WaitingReady)
            }
            "ready" if matches!(current, Some(Self::Rebooting | Self::WaitingReady)) => Some(Self::Verifying),
            // A Kubernetes upgrade: each component's apply, then its restart verified.
            "config-apply" if restartable || matches!(current, Some(Self::Applying | Self::Verifying)) => {
                Some(Self::Applying)
            }
            "component-ready" if current == Some(Self::Applying) => Some(Self::Verifying),
            "converged" => Some(Self::Converged),
            "removed" => Some(Self::Removed),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }

    /// Whether `event` ends `current` without another phase beginning.
    fn ends(current: Self, event: &str) -> bool {
        matches!((current, event), (Self::Pulling, "image-pulled") | (Self::Held, "preflight-clear"))
    }
}

/// One phase of one machine, in seconds from the start; `end` is `None` while it lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    /// The phase.
    pub phase: Phase,
    /// When it began.
    pub start: f64,
    /// When it ended, if it has.
    pub end: Option<f64>,
}

/// One machine's phases so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// The node.
    pub node: String,
    /// `control-plane` or `worker`.
    pub role: String,
    /// Its phases, in time order; only the last may still last.
    pub bars: Vec<Bar>,
    /// When its turn began (its first phase of [`Phase::in_turn`]), if it has.
    pub started: Option<f64>,
    /// When its turn ended (converged, removed or failed), if it has.
    pub finished: Option<f64>,
    /// The bytes its latest evacuation moved off it, as its `evacuation-start` said.
    pub evacuated_bytes: Option<u64>,
    /// Its turn has made a legacy Upgrade call.
    called: bool,
}

impl Machine {
    fn new(node: &str, role: &str) -> Self {
        Self {
            node: node.to_owned(),
            role: role.to_owned(),
            bars: Vec::new(),
            started: None,
            finished: None,
            evacuated_bytes: None,
            called: false,
        }
    }

    /// The phase the machine is in, if any.
    #[must_use]
    pub fn phase(&self) -> Option<Phase> {
        self.bars.last().filter(|b| b.end.is_none()).map(|b| b.phase)
    }

    /// Whether the machine is a control plane.
    #[must_use]
    pub fn is_control_plane(&self) -> bool {
        self.role == CONTROL_PLANE
    }

    fn observe(&mut self, t: f64, event: &str) {
        let current = self.phase();
        if let Some(next) = Phase::next(current, event, self.called) {
            if current == Some(next) {
                return;
            }
            self.close(t);
            self.bars.push(Bar { phase: next, start: t, end: None });
            if next.in_turn() && (self.started.is_none() || current == Some(Phase::Failed)) {
                self.started = Some(t);
                self.finished = None;
                self.called = false;
            }
            if event == "upgrade-call" {
                self.called = true;
            }
            if next.is_final() {
                self.finished = Some(t);
            }
        } else if current.is_some_and(|p| Phase::ends(p, event)) {
            self.close(t);
        }
    }

    fn close(&mut self, t: f64) {
        if let Some(bar) = self.bars.last_mut().filter(|b| b.end.is_none()) {
            bar.end = Some(t.max(bar.start));
        }
    }
}

/// What a marker marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    /// A machine booted its old version back (reason `AbFallback`).
    AbFallback,
    /// A machine failed for another reason.
    Failure,
    /// The controller was restarted.
    ControllerRestart,
    /// An etcd snapshot was taken (from the marker's node).
    EtcdSnapshot,
    /// The operation waited on the etcd gate (a reason from `Etcd...`).
    EtcdGate,
    /// A control plane's etcd member is a voter again: the gate opens for the next one.
    EtcdMemberBack,
    /// The operation was refused.
    Refused,
}

impl MarkerKind {
    /// The marker's name in the legend and in `data-kind`.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            Self::AbFallback => "ab-fallback",
            Self::Failure => "failure",
            Self::ControllerRestart => "controller-restart",
            Self::EtcdSnapshot => "etcd-snapshot",
            Self::EtcdGate => "etcd-gate",
            Self::EtcdMemberBack => "etcd-member-back",
            Self::Refused => "refused",
        }
    }
}

/// A point in time worth marking.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// What it marks.
    pub kind: MarkerKind,
    /// When.
    pub t: f64,
    /// The machine it concerns, if one does.
    pub node: Option<String>,
    /// What it says, for the tooltip.
    pub text: String,
}

/// What a span of time across the whole chart is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// The cluster's APIs refused every call.
    ApiOutage,
    /// The operation was paused.
    Paused,
}

impl SpanKind {
    /// The span's name in the legend and in `data-kind`.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            Self::ApiOutage => "api-outage",
            Self::Paused => "paused",
        }
    }
}

/// A span of time across the whole chart; `end` is `None` while it lasts.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// What it is.
    pub kind: SpanKind,
    /// When it began.
    pub start: f64,
    /// When it ended, if it has.
    pub end: Option<f64>,
    /// What it says, for the tooltip.
    pub text: String,
}

/// Follows a trace record by record: each machine's phase now, and the bars, markers and
/// spans so far. The live view counts machines per phase from it; a [`Timeline`] is one
/// that has seen the whole trace.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    machines: Vec<Machine>,
    index: HashMap<String, usize>,
    markers: Vec<Marker>,
    spans: Vec<Span>,
    last_t: f64,
}

impl Tracker {
    /// A tracker that has seen nothing.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes in the next record (records come in time order; an earlier one counts as now).
    pub fn observe(&mut self, record: &TraceRecord) {
        let t = record.t.max(self.last_t);
        self.last_t = t;
        let message = || match (&record.reason, &record.message) {
            (Some(reason), Some(message)) => format!("{reason}: {message}"),
            (Some(reason), None) => reason.clone(),
            (None, Some(message)) => message.clone(),
            (None, None) => record.event.clone(),
        };
        if record.is_machine() {
            let i = match self.index.get(&record.node) {
                Some(&i) => i,
                None => {
                    self.machines.push(Machine::new(&record.node, &record.role));
                    self.index.insert(record.node.clone(), self.machines.len() - 1);
                    self.machines.len() - 1
                }
            };
            self.machines[i].observe(t, &record.event);
            if record.event == "evacuation-start" {
                self.machines[i].evacuated_bytes = record.bytes;
            }
            let kind = match (record.event.as_str(), record.reason.as_deref()) {
                ("failed", Some("AbFallback")) => Some(MarkerKind::AbFallback),
                ("failed", _) => Some(MarkerKind::Failure),
                ("etcd-snapshot", _) => Some(MarkerKind::EtcdSnapshot),
                ("etcd-member-back", _) => Some(MarkerKind::EtcdMemberBack),
                _ => None,
            };
            if let Some(kind) = kind {
                self.markers.push(Marker { kind, t, node: Some(record.node.clone()), text: message() });
            }
            // A pause is the operation's, whichever row it is written on (the simulator and
            // the operator put it on the failed machine's).
            match record.event.as_str() {
                "paused" => self.open_span(SpanKind::Paused, t, message()),
                "resumed" => self.close_span(SpanKind::Paused, t),
                _ => {}
            }
            return;
        }
        match (record.event.as_str(), record.reason.as_deref()) {
            ("controller-restart", _) => {
                self.markers.push(Marker { kind: MarkerKind::ControllerRestart, t, node: None, text: message() });
            }
            ("waiting", Some(reason)) if reason.starts_with("Etcd") => {
                self.markers.push(Marker { kind: MarkerKind::EtcdGate, t, node: None, text: message() });
            }
            ("refused", _) => self.markers.push(Marker { kind: MarkerKind::Refused, t, node: None, text: message() }),
            ("api-outage", _) => self.open_span(SpanKind::ApiOutage, t, message()),
            ("api-back", _) => self.close_span(SpanKind::ApiOutage, t),
            ("paused", _) => self.open_span(SpanKind::Paused, t, message()),
            ("resumed", _) => self.close_span(SpanKind::Paused, t),
            _ => {}
        }
    }

    fn open_span(&mut self, kind: SpanKind, t: f64, text: String) {
        if !self.spans.iter().any(|s| s.kind == kind && s.end.is_none()) {
            self.spans.push(Span { kind, start: t, end: None, text });
        }
    }

    fn close_span(&mut self, kind: SpanKind, t: f64) {
        if let Some(span) = self.spans.iter_mut().find(|s| s.kind == kind && s.end.is_none()) {
            span.end = Some(t);
        }
    }

    /// The machines seen so far, in the order they first appeared.
    #[must_use]
    pub fn machines(&self) -> &[Machine] {
        &self.machines
    }

    /// The machine `node`, if seen.
    #[must_use]
    pub fn machine(&self, node: &str) -> Option<&Machine> {
        self.index.get(node).map(|i| &self.machines[*i])
    }

    /// How many machines are in each phase now (phases with none are left out), in the
    /// legend's order, and how many are in none (not started, or between phases).
    #[must_use]
    pub fn counts(&self) -> (Vec<(Phase, usize)>, usize) {
        let mut counts: Vec<(Phase, usize)> = Phase::ALL.iter().map(|p| (*p, 0)).collect();
        let mut idle = 0;
        for machine in &self.machines {
            match machine.phase() {
                Some(phase) => counts[Phase::ALL.iter().position(|p| *p == phase).unwrap_or(0)].1 += 1,
                None => idle += 1,
            }
        }
        counts.retain(|(_, n)| *n > 0);
        (counts, idle)
    }

    /// The timeline of what was seen, ending at the last record's time.
    #[must_use]
    pub fn into_timeline(self) -> Timeline {
        Timeline::from_tracker(self)
    }
}

/// A group of rows: the control planes, or one wave of workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Its label, such as `control planes` or `wave 3`.
    pub label: String,
    /// The index of its first row.
    pub first: usize,
    /// How many rows it has.
    pub len: usize,
}

/// A whole trace, ready to draw: one row per machine, control planes first then the
/// workers by wave, every bar closed at the latest at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// The machines, in row order; each bar has an end.
    pub rows: Vec<Machine>,
    /// The groups of rows, in order, covering every row.
    pub groups: Vec<Group>,
    /// Marked points in time.
    pub markers: Vec<Marker>,
    /// Spans of time across the chart, each with an end.
    pub spans: Vec<Span>,
    /// The last record's time: where the chart ends.
    pub end: f64,
    /// The most workers in their turn at once: the waves' size.
    pub wave_size: usize,
}

impl Timeline {
    /// The timeline of a whole trace (as [`crate::read_trace`] returns it).
    #[must_use]
    pub fn from_records(records: &[TraceRecord]) -> Self {
        let mut tracker = Tracker::new();
        for record in records {
            tracker.observe(record);
        }
        Self::from_tracker(tracker)
    }

    fn from_tracker(tracker: Tracker) -> Self {
        let end = tracker.last_t;
        let mut machines = tracker.machines;
        for machine in &mut machines {
            machine.close(end);
        }
        let mut spans = tracker.spans;
        for span in &mut spans {
            span.end.get_or_insert(end);
        }
        // Started machines by when they started, then the others by name.
        let order = |a: &Machine, b: &Machine| match (a.started, b.started) {
            (Some(x), Some(y)) => x.total_cmp(&y).then_with(|| a.node.cmp(&b.node)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => natural(&a.node, &b.node),
        };
        let (mut control_planes, mut workers): (Vec<Machine>, Vec<Machine>) =
            machines.into_iter().partition(Machine::is_control_plane);
        control_planes.sort_by(order);
        workers.sort_by(order);
        let wave_size = most_in_turn(&workers).max(1);
        let mut groups = Vec::new();
        if !control_planes.is_empty() {
            groups.push(Group { label: "control planes".to_owned(), first: 0, len: control_planes.len() });
        }
        let started = workers.iter().filter(|m| m.started.is_some()).count();
        let mut first = control_planes.len();
        for (wave, chunk) in (0..started).collect::<Vec<_>>().chunks(wave_size).enumerate() {
            groups.push(Group { label: format!("wave {}", wave + 1), first, len: chunk.len() });
            first += chunk.len();
        }
        if workers.len() > started {
            groups.push(Group { label: "not started".to_owned(), first, len: workers.len() - started });
        }
        let mut rows = control_planes;
        rows.extend(workers);
        Self { rows, groups, markers: tracker.markers, spans, end, wave_size }
    }
}

/// The most machines in their turn (started, not finished) at one time.
fn most_in_turn(machines: &[Machine]) -> usize {
    let mut edges: Vec<(f64, i32)> = Vec::new();
    for machine in machines {
        if let Some(start) = machine.started {
            edges.push((start, 1));
            if let Some(end) = machine.finished {
                edges.push((end, -1));
            }
        }
    }
    // Ends before starts at the same time: one replacing another is not two at once.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Orders names with numbers by the numbers: `worker-2` before `worker-10`.
fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let digits = s.len() - s.bytes().rev().take_while(u8::is_ascii_digit).count();
        (s[..digits].to_owned(), s[digits..].parse::<u64>().ok())
    };
    split(a).cmp(&split(b)).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy(node: &str, role: &str, t0: f64) -> Vec<TraceRecord> {
        [
            (0.0, "image-pull-start"),
            (2.0, "image-pulled"),
            (3.0, "upgrade-call"),
            (60.0, "reboot-start"),
            (61.0, "not-ready"),
            (180.0, "reboot-end"),
            (200.0, "ready"),
            (205.0, "converged"),
        ]
        .iter()
        .map(|(dt, event)| TraceRecord::new(t0 + dt, node, role, event))
        .collect()
    }

    /// `node`'s events (a worker's) at their times.
    fn events(node: &str, at: &[(f64, &str)]) -> Vec<TraceRecord> {
        at.iter().map(|(t, e)| TraceRecord::new(*t, node, "worker", e)).collect()
    }

    fn phases(machine: &Machine) -> Vec<(Phase, f64, Option<f64>)> {
        machine.bars.iter().map(|b| (b.phase, b.start, b.end)).collect()
    }

    /// The bars of one machine's row, drawn from its events alone.
    fn bars_of(node: &str, at: &[(f64, &str)]) -> Vec<(Phase, f64, Option<f64>)> {
        phases(&Timeline::from_records(&events(node, at)).rows[0])
    }

    #[test]
    fn a_kubernetes_upgrade_draws_each_apply_and_its_verification_and_a_kubelet_restart_is_no_reboot() {
        let bars = bars_of(
            "w-1",
            &[
                (1.0, "config-apply"),
                (1.0, "not-ready"),
                (9.0, "component-ready"),
                (9.0, "ready"),
                (12.0, "config-apply"),
                (20.0, "component-ready"),
                (21.0, "converged"),
            ],
        );
        assert_eq!(
            bars,
            vec![
                (Phase::Applying, 1.0, Some(9.0)),
                (Phase::Verifying, 9.0, Some(12.0)),
                (Phase::Applying, 12.0, Some(20.0)),
                (Phase::Verifying, 20.0, Some(21.0)),
                // A final phase lasts to the trace's end.
                (Phase::Converged, 21.0, Some(21.0)),
            ]
        );
        let crashed = bars_of("w-1", &[(1.0, "config-apply"), (8.0, "component-crash-loop"), (300.0, "failed")]);
        assert_eq!(crashed, vec![(Phase::Applying, 1.0, Some(300.0)), (Phase::Failed, 300.0, Some(300.0))]);
    }

    #[test]
    fn a_legacy_upgrade_goes_through_its_phases_in_order() {
        let timeline = Timeline::from_records(&legacy("cp-1", "control-plane", 10.0));
        assert_eq!(timeline.rows.len(), 1);
        assert_eq!(
            phases(&timeline.rows[0]),
            vec![
                (Phase::Pulling, 10.0, Some(12.0)),
                (Phase::Installing, 13.0, Some(70.0)),
                (Phase::Rebooting, 70.0, Some(190.0)),
                (Phase::WaitingReady, 190.0, Some(210.0)),
                (Phase::Verifying, 210.0, Some(215.0)),
                (Phase::Converged, 215.0, Some(215.0)),
            ]
        );
        assert_eq!(timeline.rows[0].started, Some(13.0));
        assert_eq!(timeline.rows[0].finished, Some(215.0));
    }

    #[test]
    fn the_engines_drain_is_its_own_phase_but_talos_drain_in_an_upgrade_call_is_not() {
        let lifecycle = [
            (1.0, "install-start"),
            (50.0, "installed"),
            (51.0, "cordon"),
            (52.0, "drain"),
            (80.0, "reboot-call"),
            (200.0, "reboot-end"),
        ];
        assert_eq!(
            bars_of("w-1", &lifecycle),
            vec![
                (Phase::Installing, 1.0, Some(51.0)),
                (Phase::Draining, 51.0, Some(80.0)),
                (Phase::Rebooting, 80.0, Some(200.0)),
                (Phase::WaitingReady, 200.0, Some(200.0)),
            ]
        );
        let legacy = bars_of("w-1", &[(1.0, "upgrade-call"), (1.0, "drain"), (60.0, "reboot-start")]);
        let got: Vec<Phase> = legacy.iter().map(|b| b.0).collect();
        assert_eq!(got, [Phase::Installing, Phase::Rebooting]);
    }

    #[test]
    fn a_removals_reset_is_its_own_phase_not_a_reboot() {
        let removal = [
            (0.1, "evacuation-start"),
            (62.0, "evacuated"),
            (62.5, "cordon"),
            (62.7, "drain"),
            (107.0, "reset-call"),
            (108.0, "not-ready"),
            (168.0, "removed"),
        ];
        assert_eq!(
            bars_of("w-2", &removal),
            vec![
                (Phase::Evacuating, 0.1, Some(62.5)),
                (Phase::Draining, 62.5, Some(107.0)),
                (Phase::Resetting, 107.0, Some(168.0)),
                (Phase::Removed, 168.0, Some(168.0)),
            ]
        );
    }

    #[test]
    fn a_not_ready_outside_the_turn_is_not_a_reboot() {
        let records = vec![
            TraceRecord::new(1.0, "w-1", "worker", "not-ready"),
            TraceRecord::new(2.0, "w-1", "worker", "converged"),
            TraceRecord::new(3.0, "w-1", "worker", "not-ready"),
        ];
        let timeline = Timeline::from_records(&records);
        assert_eq!(phases(&timeline.rows[0]), vec![(Phase::Converged, 2.0, Some(3.0))]);
    }

    #[test]
    fn the_operators_trace_without_reboot_start_still_shows_the_reboot() {
        let records: Vec<TraceRecord> =
            events("w-1", &[(1.0, "upgrade-call"), (40.0, "shown-not-ready"), (90.0, "reboot-end")]);
        let timeline = Timeline::from_records(&records);
        let got: Vec<Phase> = timeline.rows[0].bars.iter().map(|b| b.phase).collect();
        assert_eq!(got, vec![Phase::Installing, Phase::Rebooting, Phase::WaitingReady]);
        assert_eq!(timeline.rows[0].bars[2].end, Some(90.0), "the last bar ends where the trace does");
    }

    #[test]
    fn a_failed_machine_that_is_retried_starts_again() {
        let records: Vec<TraceRecord> = events("w-1", &[(1.0, "upgrade-call"), (5.0, "failed"), (9.0, "upgrade-call")]);
        let timeline = Timeline::from_records(&records);
        let got: Vec<Phase> = timeline.rows[0].bars.iter().map(|b| b.phase).collect();
        assert_eq!(got, vec![Phase::Installing, Phase::Failed, Phase::Installing]);
        assert_eq!(timeline.rows[0].started, Some(9.0));
    }

    #[test]
    fn control_planes_come_first_then_workers_in_waves_of_the_observed_concurrency() {
        let mut records = Vec::new();
        for (i, t0) in [0.0, 0.0, 300.0, 300.0, 600.0].iter().enumerate() {
            records.extend(legacy(&format!("worker-{}", i + 1), "worker", *t0));
        }
        records.extend(legacy("cp-1", "control-plane", 900.0));
        records.push(TraceRecord::new(0.5, "worker-9", "worker", "not-ready"));
        records.sort_by(|a, b| a.t.total_cmp(&b.t));
        let timeline = Timeline::from_records(&records);
        let names: Vec<&str> = timeline.rows.iter().map(|m| m.node.as_str()).collect();
        assert_eq!(names, ["cp-1", "worker-1", "worker-2", "worker-3", "worker-4", "worker-5", "worker-9"]);
        assert_eq!(timeline.wave_size, 2);
        let groups: Vec<(&str, usize, usize)> =
            timeline.groups.iter().map(|g| (g.label.as_str(), g.first, g.len)).collect();
        assert_eq!(
            groups,
            [("control planes", 0, 1), ("wave 1", 1, 2), ("wave 2", 3, 2), ("wave 3", 5, 1), ("not started", 6, 1)]
        );
    }

    #[test]
    fn markers_and_spans_come_from_the_events_that_concern_the_rollout() {
        let records = vec![
            TraceRecord::new(1.0, "cp-2", "control-plane", "etcd-snapshot"),
            TraceRecord::new(2.0, "operation", "operation", "waiting").with_reason("EtcdUnhealthy"),
            TraceRecord::new(3.0, "operation", "operation", "waiting").with_reason("MaxUnavailable"),
            TraceRecord::new(4.0, "cluster", "cluster", "api-outage"),
            TraceRecord::new(5.0, "controller", "controller", "controller-restart"),
            TraceRecord::new(6.0, "cluster", "cluster", "api-back"),
            TraceRecord::new(7.0, "cp-1", "control-plane", "failed").with_reason("AbFallback"),
            TraceRecord::new(7.0, "operation", "operation", "paused").with_reason("MachineFailed"),
        ];
        let timeline = Timeline::from_records(&records);
        let kinds: Vec<(MarkerKind, f64)> = timeline.markers.iter().map(|m| (m.kind, m.t)).collect();
        assert_eq!(
            kinds,
            [
                (MarkerKind::EtcdSnapshot, 1.0),
                (MarkerKind::EtcdGate, 2.0),
                (MarkerKind::ControllerRestart, 5.0),
                (MarkerKind::AbFallback, 7.0)
            ]
        );
        let spans: Vec<(SpanKind, f64, Option<f64>)> =
            timeline.spans.iter().map(|s| (s.kind, s.start, s.end)).collect();
        assert_eq!(spans, [(SpanKind::ApiOutage, 4.0, Some(6.0)), (SpanKind::Paused, 7.0, Some(7.0))]);
    }

    #[test]
    fn a_pause_on_a_machines_row_is_the_operations_span() {
        let records = vec![
            TraceRecord::new(1.0, "w-1", "worker", "upgrade-call"),
            TraceRecord::new(5.0, "w-1", "worker", "failed").with_reason("AbFallback"),
            TraceRecord::new(5.0, "w-1", "worker", "paused").with_reason("MachineFailed"),
            TraceRecord::new(9.0, "w-1", "worker", "resumed"),
            TraceRecord::new(12.0, "w-2", "worker", "upgrade-call"),
        ];
        let timeline = Timeline::from_records(&records);
        let spans: Vec<(SpanKind, f64, Option<f64>)> =
            timeline.spans.iter().map(|s| (s.kind, s.start, s.end)).collect();
        assert_eq!(spans, [(SpanKind::Paused, 5.0, Some(9.0))]);
        let phases: Vec<Phase> = timeline.rows[0].bars.iter().map(|b| b.phase).collect();
        assert_eq!(phases, [Phase::Installing, Phase::Failed], "the pause is not a phase of the machine");
    }

    #[test]
    fn the_tracker_counts_machines_per_phase() {
        let mut tracker = Tracker::new();
        for record in [
            TraceRecord::new(1.0, "w-1", "worker", "upgrade-call"),
            TraceRecord::new(1.0, "w-2", "worker", "upgrade-call"),
            TraceRecord::new(2.0, "w-2", "worker", "reboot-start"),
            TraceRecord::new(2.0, "w-3", "worker", "image-pull-start"),
            TraceRecord::new(3.0, "w-3", "worker", "image-pulled"),
        ] {
            tracker.observe(&record);
        }
        assert_eq!(tracker.counts(), (vec![(Phase::Installing, 1), (Phase::Rebooting, 1)], 1));
    }

    #[test]
    fn names_order_by_their_numbers() {
        let mut names = vec!["worker-10", "worker-2", "cp-1", "worker-1"];
        names.sort_by(|a, b| natural(a, b));
        assert_eq!(names, ["cp-1", "worker-1", "worker-2", "worker-10"]);
    }
}
