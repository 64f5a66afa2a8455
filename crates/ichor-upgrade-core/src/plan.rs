//! A calibrated plan of an upgrade before it runs (issue 33): its makespan's p10, p50 and
//! p90 and the physical bound, the order the machines would go in, and the machines the
//! preflight holds now, from how long the cluster's own machines took before.
//!
//! The model is the engine's schedule: after a lead (planning, the etcd snapshot), the
//! control planes one at a time, then the workers `maxUnavailable` at a time in the
//! engine's order, each slot taken again a reaction time after its machine converged
//! (the engine learns of it through a watch and starts the next at its next pass). Each
//! of [`PlanInput::runs`] runs draws every machine's turn (its evacuation, pull, install
//! or Upgrade call, reboot, Ready and verification, end to end) from its role's
//! [`TurnModel`]: the turns recorded in an earlier upgrade, resampled (each run from its
//! own bootstrap replicate of the record, so that a short history widens the spread as it
//! should), or the sum of default phase ranges when there is no history. The lead and the reaction time are
//! measured in the same history (else defaults), so the plan is calibrated by the engine's
//! own overhead, not an ideal scheduler's. Where the history recorded the bytes its
//! evacuations moved ([`StorageRate`]) and the bytes on a machine now are known, its
//! evacuation is the one those bytes take at the recorded rate, in place of the one its
//! role's recorded turns had: storage that grew, moved or went makes the plan longer or
//! shorter.
//!
//! What it does not model (its limits, also in `docs/plan.md`): machines the preflight
//! holds are left out of the makespan (they go when what holds them clears, which no
//! history predicts); a fault (a fallback, a pause) is not drawn; turns are drawn
//! independently, so a cause that slows every machine at once (a slow registry) widens
//! the spread less than it should; a history of one run is a small sample.
//!
//! Pure and deterministic: the draws come from a SplitMix64 stream seeded by
//! [`PlanInput::seed`], never from entropy; the same input gives the same plan.

use serde::{Deserialize, Serialize};

use crate::operation::MachineRole;

/// How many runs a plan draws by default.
pub const DEFAULT_RUNS: usize = 200;

/// A machine as a plan sees it, in the engine's order within its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanMachine {
    /// Its node.
    pub node: String,
    /// Its role.
    pub role: MachineRole,
    /// What the preflight holds it for now, if anything.
    pub held: Option<String>,
    /// The bytes on it now that its evacuation would move (`Some(0)`: no storage to
    /// move); `None` when not known.
    pub bytes: Option<u64>,
}

/// What recorded evacuations say: how fast storage moved off a machine, and how much of
/// a recorded turn was evacuation. A plan with it turns each machine's evacuation from
/// the one its role's turns had into the one the bytes on it now take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StorageRate {
    /// Bytes a second an evacuation moved (the median of the machines that recorded both
    /// bytes and duration).
    pub bytes_per_s: f64,
    /// The median evacuation of the control planes recorded (0 for one that had none),
    /// seconds.
    pub control_plane_s: f64,
    /// The same for the workers.
    pub worker_s: f64,
}

impl StorageRate {
    /// How much longer (or shorter, negative) than a recorded turn of its role a
    /// machine's turn is, with `bytes` on it now: its evacuation at the recorded rate in
    /// place of the role's median evacuation.
    #[must_use]
    pub fn adjustment(&self, role: MachineRole, bytes: u64) -> f64 {
        let recorded = match role {
            MachineRole::ControlPlane => self.control_plane_s,
            MachineRole::Worker => self.worker_s,
        };
        #[allow(clippy::cast_precision_loss, reason = "bytes to seconds, well within f64's range")]
        let now = bytes as f64 / self.bytes_per_s;
        now - recorded
    }
}

/// How long one machine's turn takes, for one role.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnModel {
    /// Turns recorded in an earlier upgrade, in seconds, resampled.
    Recorded(Vec<f64>),
    /// No history: each turn is the sum of one uniform draw from each phase's range
    /// (seconds).
    Phases(Vec<(f64, f64)>),
}

impl TurnModel {
    /// The model one run draws from: recorded turns resampled once per run (a bootstrap
    /// replicate), so that the spread carries how little a short history knows besides
    /// how much turns vary; default phases as they are.
    fn for_run(&self, rng: &mut SplitMix64) -> Self {
        match self {
            Self::Recorded(turns) if !turns.is_empty() => {
                Self::Recorded((0..turns.len()).map(|_| turns[rng.below(turns.len())]).collect())
            }
            other => other.clone(),
        }
    }

    fn draw(&self, rng: &mut SplitMix64) -> f64 {
        match self {
            Self::Recorded(turns) if !turns.is_empty() => turns[rng.below(turns.len())],
            Self::Recorded(_) => 0.0,
            Self::Phases(ranges) => ranges.iter().map(|(low, high)| low + (high - low) * rng.unit()).sum(),
        }
    }

    /// Its median turn, seconds (the phases' midpoints summed, when there is no history).
    #[must_use]
    pub fn median(&self) -> f64 {
        match self {
            Self::Recorded(turns) => quantile(turns, 0.5),
            Self::Phases(ranges) => ranges.iter().map(|(low, high)| (low + high) / 2.0).sum(),
        }
    }
}

/// What an earlier operation recorded, for a plan of the next (seconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// Each converged control plane's turn.
    pub control_plane_turns: Vec<f64>,
    /// Each converged worker's turn.
    pub worker_turns: Vec<f64>,
    /// From the operation's start to its first turn.
    pub lead: Option<f64>,
    /// The median time from a convergence to the next start.
    pub reaction: Option<f64>,
    /// Its evacuations' rate and share of the turns, when it recorded bytes.
    pub storage: Option<StorageRate>,
}

/// What a plan assumes where nothing was recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// Each phase of a turn: its name and range (seconds), summed into a turn.
    pub phases: Vec<(String, (f64, f64))>,
    /// The reaction time (the engine's pass interval).
    pub reaction_s: f64,
}

/// The models a plan draws from, and what it assumed for want of a record.
#[derive(Debug, Clone, PartialEq)]
pub struct Models {
    /// The control planes' turns.
    pub control_plane: TurnModel,
    /// The workers' turns.
    pub worker: TurnModel,
    /// The lead, seconds.
    pub lead_s: f64,
    /// The reaction time, seconds.
    pub reaction_s: f64,
    /// The recorded evacuations' rate, if the record has one (the caller, who reads the
    /// bytes on the machines now, says what it made of it).
    pub storage: Option<StorageRate>,
    /// Each default taken, in words (empty: everything came from the record).
    pub assumed: Vec<String>,
}

/// The models for a plan from `recorded` (none: no history), each thing it lacks taken
/// from `defaults` and said so in [`Models::assumed`]. The main job's `--plan` and the
/// operator's dry run both plan through this.
#[must_use]
pub fn models(recorded: Option<&Recorded>, defaults: &Defaults) -> Models {
    let mut assumed = Vec::new();
    let phases: Vec<(f64, f64)> = defaults.phases.iter().map(|(_, range)| *range).collect();
    let described = defaults
        .phases
        .iter()
        .map(|(name, (low, high))| {
            if (high - low).abs() < f64::EPSILON {
                format!("{name} {low:.0} s")
            } else {
                format!("{name} {low:.0}-{high:.0} s")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut model = |turns: Option<&Vec<f64>>, role: &str| match turns.filter(|t| !t.is_empty()) {
        Some(turns) => TurnModel::Recorded(turns.clone()),
        None => {
            assumed.push(format!("{role}: no turn recorded: default phases ({described})"));
            TurnModel::Phases(phases.clone())
        }
    };
    let control_plane = model(recorded.map(|r| &r.control_plane_turns), "control planes");
    let worker = model(recorded.map(|r| &r.worker_turns), "workers");
    let lead_s = recorded.and_then(|r| r.lead).unwrap_or_else(|| {
        assumed.push("lead: none recorded: none before the first machine".to_owned());
        0.0
    });
    let reaction_s = recorded.and_then(|r| r.reaction).unwrap_or_else(|| {
        assumed.push(format!(
            "reaction: none recorded: {:.0} s (the pass interval) between a machine and the next",
            defaults.reaction_s
        ));
        defaults.reaction_s
    });
    // What storage holds now is the caller's to read, and to say.
    let storage = recorded.and_then(|r| r.storage);
    assumed.push(
        "no fault is drawn (a fallback, a pause); machines the preflight holds are left out of the makespan".to_owned(),
    );
    Models { control_plane, worker, lead_s, reaction_s, storage, assumed }
}

/// What a plan made of storage, in words for its `assumed`: the bytes on the machines
/// now and whether a recorded rate times their evacuations; `None` when there is nothing
/// to say (no storage now, none recorded).
#[must_use]
pub fn describe_storage(machines: &[PlanMachine], rate: Option<StorageRate>) -> Option<String> {
    let going = machines.iter().filter(|m| m.held.is_none());
    let (mut bytes, mut holding, mut unknown) = (0u64, 0usize, 0usize);
    for machine in going {
        match machine.bytes {
            Some(0) => {}
            Some(b) => {
                bytes = bytes.saturating_add(b);
                holding += 1;
            }
            None => unknown += 1,
        }
    }
    #[allow(clippy::cast_precision_loss, reason = "shown to a tenth of a GiB")]
    let gib = bytes as f64 / f64::from(1u32 << 30);
    let unknown = if unknown > 0 {
        format!("; {unknown} machines' bytes unknown: their evacuations as recorded")
    } else {
        String::new()
    };
    match rate {
        Some(rate) => Some(format!(
            "storage: {gib:.1} GiB on {holding} machines now, each evacuation timed at the recorded {:.0} MiB/s in place of \
             its role's recorded one (control planes {:.0} s, workers {:.0} s){unknown}",
            rate.bytes_per_s / f64::from(1u32 << 20),
            rate.control_plane_s,
            rate.worker_s
        )),
        None if holding > 0 => Some(format!(
            "storage: {gib:.1} GiB on {holding} machines now, but the history recorded no bytes: evacuations as its \
             turns had them"
        )),
        None => None,
    }
}

/// What a plan is made from.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanInput<'a> {
    /// The machines, control planes and workers each in the engine's order.
    pub machines: &'a [PlanMachine],
    /// The control planes' turns.
    pub control_plane: TurnModel,
    /// The workers' turns.
    pub worker: TurnModel,
    /// From the operation's start to its first machine's turn, seconds.
    pub lead_s: f64,
    /// From a machine's convergence to the next machine's start in its slot, seconds.
    pub reaction_s: f64,
    /// The recorded evacuations' rate: with it, a machine whose bytes are known has its
    /// turns adjusted to them ([`StorageRate::adjustment`]); without it, turns are as
    /// recorded.
    pub storage: Option<StorageRate>,
    /// Workers at once.
    pub max_unavailable: usize,
    /// Runs drawn.
    pub runs: usize,
    /// The draws' seed.
    pub seed: u64,
}

/// A machine the preflight holds now, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Its node.
    pub node: String,
    /// What holds it, as the preflight says it.
    pub reason: String,
}

/// One machine's turn in the median run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedTurn {
    /// Its node.
    pub node: String,
    /// Its role.
    pub role: MachineRole,
    /// When its turn would start, seconds from the operation's start.
    pub start_s: f64,
    /// When it would converge.
    pub end_s: f64,
}

/// A plan: the makespan's spread over the runs drawn, the bound, the order, the holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The makespan 10 % of the runs stay under, seconds.
    pub p10_s: f64,
    /// The median makespan.
    pub p50_s: f64,
    /// The makespan 90 % of the runs stay under.
    pub p90_s: f64,
    /// The physical bound at the median run's turns: the control planes in series, then
    /// the longer of the longest worker and the workers' total over `maxUnavailable`, with
    /// no lead and no reaction time.
    pub bound_s: f64,
    /// The machines in the order they would start (held ones left out).
    pub order: Vec<String>,
    /// The machines the preflight holds now, and why.
    pub held: Vec<Held>,
    /// The median run, machine by machine (what a timeline draws).
    pub median_run: Vec<PlannedTurn>,
    /// How many runs were drawn.
    pub runs: usize,
}

/// The plan for `input`.
#[must_use]
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let going: Vec<&PlanMachine> = input.machines.iter().filter(|m| m.held.is_none()).collect();
    let control_planes: Vec<&PlanMachine> =
        going.iter().copied().filter(|m| m.role == MachineRole::ControlPlane).collect();
    let workers: Vec<&PlanMachine> = going.iter().copied().filter(|m| m.role == MachineRole::Worker).collect();
    let mut rng = SplitMix64(input.seed);
    let runs = input.runs.max(1);
    // Each machine's evacuation as the bytes on it now take, where both are known.
    let adjustment = |m: &PlanMachine| match (input.storage, m.bytes) {
        (Some(rate), Some(bytes)) => rate.adjustment(m.role, bytes),
        _ => 0.0,
    };
    let (cp_adjust, w_adjust): (Vec<f64>, Vec<f64>) =
        (control_planes.iter().map(|m| adjustment(m)).collect(), workers.iter().map(|m| adjustment(m)).collect());
    let mut drawn: Vec<(f64, Vec<f64>, Vec<f64>)> = (0..runs)
        .map(|_| {
            let (control_plane, worker) = (input.control_plane.for_run(&mut rng), input.worker.for_run(&mut rng));
            let cps: Vec<f64> = cp_adjust.iter().map(|a| (control_plane.draw(&mut rng) + a).max(0.0)).collect();
            let ws: Vec<f64> = w_adjust.iter().map(|a| (worker.draw(&mut rng) + a).max(0.0)).collect();
            let makespan = schedule(input, &cps, &ws).iter().map(|(_, end)| *end).fold(input.lead_s, f64::max);
            (makespan, cps, ws)
        })
        .collect();
    drawn.sort_by(|a, b| a.0.total_cmp(&b.0));
    let makespans: Vec<f64> = drawn.iter().map(|d| d.0).collect();
    let (_, cps, ws) = &drawn[nearest_rank(runs, 0.5)];
    let turns = schedule(input, cps, ws);
    let median_run = control_planes
        .iter()
        .chain(&workers)
        .zip(&turns)
        .map(|(m, (start, end))| PlannedTurn { node: m.node.clone(), role: m.role, start_s: *start, end_s: *end })
        .collect();
    let longest = ws.iter().copied().fold(0.0, f64::max);
    #[allow(clippy::cast_precision_loss)]
    let spread = ws.iter().sum::<f64>() / input.max_unavailable.max(1) as f64;
    Plan {
        p10_s: quantile(&makespans, 0.1),
        p50_s: quantile(&makespans, 0.5),
        p90_s: quantile(&makespans, 0.9),
        bound_s: cps.iter().sum::<f64>() + longest.max(spread),
        order: control_planes.iter().chain(&workers).map(|m| m.node.clone()).collect(),
        held: input
            .machines
            .iter()
            .filter_map(|m| m.held.as_ref().map(|reason| Held { node: m.node.clone(), reason: reason.clone() }))
            .collect(),
        median_run,
        runs,
    }
}

/// Each machine's (start, end), control planes then workers, for the drawn turns.
fn schedule(input: &PlanInput<'_>, control_planes: &[f64], workers: &[f64]) -> Vec<(f64, f64)> {
    let mut turns = Vec::with_capacity(control_planes.len() + workers.len());
    let mut free = input.lead_s;
    for turn in control_planes {
        turns.push((free, free + turn));
        free += turn + input.reaction_s;
    }
    let mut slots = vec![free; input.max_unavailable.max(1)];
    for turn in workers {
        let (slot, at) = slots.iter().copied().enumerate().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((0, free));
        turns.push((at, at + turn));
        slots[slot] = at + turn + input.reaction_s;
    }
    turns
}

/// The `q` quantile of `values` by nearest rank (sorted or not); 0 for none.
#[must_use]
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[nearest_rank(sorted.len(), q)]
}

fn nearest_rank(len: usize, q: f64) -> usize {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = (q.clamp(0.0, 1.0) * (len.saturating_sub(1)) as f64).round() as usize;
    rank.min(len.saturating_sub(1))
}

/// SplitMix64: a small deterministic stream (Steele, Lea and Flood, 2014), enough for
/// resampling; seeded, never from entropy.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        unit
    }

    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let index = (self.unit() * n as f64) as usize;
        index.min(n - 1)
    }
}

#[cfg(test)]
mod tests;
