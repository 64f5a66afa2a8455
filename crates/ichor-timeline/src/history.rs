//! What a finished rollout's trace says about how long things take, for a plan of the
//! next one (`rollout --plan --history FILE`): each converged machine's turn, end to end
//! and by phase, the lead before the first turn, and the engine's reaction time between
//! a machine's convergence and the next start.

use crate::model::{Machine, Phase, Timeline};

/// The durations a trace recorded, in seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Each converged machine's turn with its phases, in the order the turns began (what a
    /// plan resamples, phases together).
    pub turns: Vec<Turn>,
    /// From the trace's start to the first turn.
    pub lead: Option<f64>,
    /// The median time from a machine's convergence to the next machine's start, over
    /// the starts that followed one (a control plane after the one before; a worker after
    /// the latest convergence before it); `None` with no such start.
    pub reaction: Option<f64>,
    /// From the trace's start to its last convergence.
    pub makespan: Option<f64>,
}

/// One converged machine's turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Whether it is a control plane's.
    pub control_plane: bool,
    /// From its first in-turn phase to converged, seconds.
    pub seconds: f64,
    /// Each in-turn phase it went through and its seconds, in order.
    pub phases: Vec<(Phase, f64)>,
    /// The bytes its evacuation moved, where the trace says (and it evacuated).
    pub evacuated_bytes: Option<u64>,
}

impl Turn {
    /// Whether it is a Kubernetes upgrade's turn (configuration applies, no Talos
    /// install or reboot): its durations say nothing of a Talos upgrade's, nor the
    /// other way round.
    #[must_use]
    pub fn is_kubernetes(&self) -> bool {
        self.phases.iter().any(|(p, _)| *p == Phase::Applying)
    }
}

impl History {
    /// The seconds of each converged control plane's turn (`control_plane`), or each
    /// worker's, from its first in-turn phase to converged.
    #[must_use]
    pub fn turn_seconds(&self, control_plane: bool) -> Vec<f64> {
        self.turns.iter().filter(|t| t.control_plane == control_plane).map(|t| t.seconds).collect()
    }

    /// The seconds of each time `phase` was gone through in the turns of control planes
    /// (`control_plane`), or of workers.
    #[must_use]
    pub fn phase_seconds(&self, control_plane: bool, phase: Phase) -> Vec<f64> {
        let turns = self.turns.iter().filter(|t| t.control_plane == control_plane);
        turns.flat_map(|t| &t.phases).filter(|(p, _)| *p == phase).map(|(_, s)| *s).collect()
    }
    /// Bytes a second its evacuations moved: the median over converged machines that
    /// recorded both bytes and an evacuation; `None` when none did.
    #[must_use]
    pub fn storage_rate(&self) -> Option<f64> {
        let mut rates: Vec<f64> = self
            .turns
            .iter()
            .filter_map(|t| {
                let seconds: f64 = t.phases.iter().filter(|(p, _)| *p == Phase::Evacuating).map(|(_, s)| s).sum();
                #[allow(clippy::cast_precision_loss, reason = "bytes to a rate, well within f64's range")]
                t.evacuated_bytes.filter(|b| *b > 0 && seconds > 0.0).map(|b| b as f64 / seconds)
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        rates.get(rates.len() / 2).copied()
    }

    /// What `timeline` recorded; a machine that did not converge (failed, held, never
    /// started) is left out.
    #[must_use]
    pub fn from_timeline(timeline: &Timeline) -> Self {
        let converged: Vec<&Machine> = timeline
            .rows
            .iter()
            .filter(|m| m.bars.last().is_some_and(|b| b.phase == Phase::Converged) && m.started.is_some())
            .collect();
        let mut history = Self::default();
        let mut finishes: Vec<f64> = Vec::new();
        let mut gaps: Vec<f64> = Vec::new();
        let mut by_start = converged.clone();
        by_start.sort_by(|a, b| a.started.unwrap_or(0.0).total_cmp(&b.started.unwrap_or(0.0)));
        for machine in &by_start {
            let (Some(start), Some(end)) = (machine.started, machine.finished) else { continue };
            let phases: Vec<(Phase, f64)> = machine
                .bars
                .iter()
                .filter(|b| b.phase.in_turn() && b.start >= start)
                .map(|bar| (bar.phase, bar.end.unwrap_or(end) - bar.start))
                .collect();
            let evacuated_bytes =
                machine.evacuated_bytes.filter(|_| phases.iter().any(|(p, _)| *p == Phase::Evacuating));
            history.turns.push(Turn {
                control_plane: machine.is_control_plane(),
                seconds: end - start,
                phases,
                evacuated_bytes,
            });
            if let Some(previous) = finishes.iter().copied().filter(|f| *f <= start).reduce(f64::max) {
                gaps.push(start - previous);
            }
            finishes.push(end);
            history.lead = Some(history.lead.map_or(start, |lead: f64| lead.min(start)));
            history.makespan = Some(history.makespan.map_or(end, |m: f64| m.max(end)));
        }
        gaps.sort_by(f64::total_cmp);
        history.reaction = gaps.get(gaps.len() / 2).copied();
        history
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_trace;

    #[test]
    fn turns_phases_lead_and_reaction_are_read_from_a_trace() {
        let trace = r#"{"t":0,"node":"cp-1","role":"control-plane","event":"listed"}
{"t":10,"node":"cp-1","role":"control-plane","event":"upgrade-call"}
{"t":70,"node":"cp-1","role":"control-plane","event":"reboot-start"}
{"t":170,"node":"cp-1","role":"control-plane","event":"reboot-end"}
{"t":190,"node":"cp-1","role":"control-plane","event":"ready"}
{"t":200,"node":"cp-1","role":"control-plane","event":"converged"}
{"t":203,"node":"worker-1","role":"worker","event":"upgrade-call"}
{"t":300,"node":"worker-1","role":"worker","event":"converged"}
{"t":305,"node":"worker-2","role":"worker","event":"upgrade-call"}
{"t":400,"node":"worker-2","role":"worker","event":"failed","reason":"AbFallback"}"#;
        let timeline = Timeline::from_records(&read_trace(trace.as_bytes()).unwrap());
        let history = History::from_timeline(&timeline);
        assert_eq!(history.turn_seconds(true), [190.0]);
        assert_eq!(history.turn_seconds(false), [97.0], "the failed worker teaches nothing");
        assert_eq!(history.phase_seconds(true, Phase::Rebooting), [100.0]);
        assert_eq!(history.phase_seconds(true, Phase::Installing), [60.0]);
        let cp = &history.turns[0];
        assert!(cp.control_plane && cp.seconds == 190.0, "{cp:?}");
        assert_eq!(
            cp.phases,
            [
                (Phase::Installing, 60.0),
                (Phase::Rebooting, 100.0),
                (Phase::WaitingReady, 20.0),
                (Phase::Verifying, 10.0)
            ]
        );
        assert_eq!((history.turns.len(), history.turns[1].control_plane), (2, false));
        assert_eq!((history.lead, history.reaction, history.makespan), (Some(10.0), Some(3.0), Some(300.0)));
        assert_eq!(History::from_timeline(&Timeline::from_records(&[])), History::default());
    }

    #[test]
    fn the_bytes_an_evacuation_start_records_over_its_evacuation_are_the_rate() {
        let trace = r#"{"t":0,"node":"w-1","role":"worker","event":"evacuation-start","bytes":2000}
{"t":20,"node":"w-1","role":"worker","event":"upgrade-call"}
{"t":80,"node":"w-1","role":"worker","event":"converged"}
{"t":82,"node":"w-2","role":"worker","event":"evacuation-start","bytes":0}
{"t":83,"node":"w-2","role":"worker","event":"upgrade-call"}
{"t":140,"node":"w-2","role":"worker","event":"converged"}
{"t":141,"node":"w-3","role":"worker","event":"upgrade-call"}
{"t":200,"node":"w-3","role":"worker","event":"converged"}"#;
        let history = History::from_timeline(&Timeline::from_records(&read_trace(trace.as_bytes()).unwrap()));
        let bytes: Vec<Option<u64>> = history.turns.iter().map(|t| t.evacuated_bytes).collect();
        assert_eq!(bytes, [Some(2000), Some(0), None], "a turn with no evacuation has no bytes");
        assert_eq!(history.storage_rate(), Some(100.0), "w-2 moved nothing: no rate from it");
        assert_eq!(History::default().storage_rate(), None);
    }
}
