//! A calibrated plan of an upgrade before it runs (issue 33): its makespan's p10, p50 and
//! p90 and the physical bound, the order the machines would go in, and the machines the
//! preflight holds now, from how long the cluster's own machines took before.
//!
//! The model is the engine's schedule: after a lead (planning, the etcd snapshot), the
//! control planes one at a time, then the workers `maxUnavailable` at a time in the
//! engine's order, each slot taken again a reaction time after its machine converged
//! (the engine learns of it through a watch and starts the next at its next pass). Each
//! of [`PlanInput::runs`] runs draws every machine's turn from its role's [`TurnModel`],
//! phase by phase (its evacuation, install or Upgrade call, drain, reboot, Ready and
//! verification). Each phase's distribution per role is the one the earlier upgrade
//! recorded ([`PhaseFit`] says it, per role and phase); a drawn turn takes its phases
//! together from one recorded machine, resampled (each run from its own bootstrap
//! replicate of the record, so that a short history widens the spread as it should),
//! which keeps what the phases of one machine share (a slow disk slows its install and its
//! reboot). A phase the plan knows better now replaces the recorded one: where the history
//! recorded the bytes its evacuations moved ([`StorageRate`]) and the bytes on a machine
//! now are known, its evacuation is the one those bytes take at the recorded rate, so
//! storage that grew, moved or went makes the plan longer or shorter. With no history for
//! a role, each phase is drawn from its default range. The lead and the reaction time are
//! measured in the same history (else defaults), so the plan is calibrated by the engine's
//! own overhead, not an ideal scheduler's.
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

use crate::machine::vocabulary::MachineRole;

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

/// What recorded evacuations say: how fast storage moved off a machine. A plan with it
/// times each machine's evacuation by the bytes on it now, in place of the one its drawn
/// turn recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StorageRate {
    /// Bytes a second an evacuation moved (the median of the machines that recorded both
    /// bytes and duration).
    pub bytes_per_s: f64,
}

impl StorageRate {
    /// The seconds an evacuation of `bytes` takes at this rate.
    #[must_use]
    pub fn seconds(&self, bytes: u64) -> f64 {
        #[allow(clippy::cast_precision_loss, reason = "bytes to seconds, well within f64's range")]
        let bytes = bytes as f64;
        bytes / self.bytes_per_s
    }
}

/// The name of a turn's evacuation among a [`RecordedTurn`]'s phases (the timeline's
/// name for it): the phase the bytes on a machine now time anew.
pub const EVACUATION: &str = "evacuating";

/// One machine's turn in an earlier upgrade: end to end, and by phase.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedTurn {
    /// From its first phase to its convergence, seconds.
    pub seconds: f64,
    /// Each phase it went through and its seconds, by name (such as [`EVACUATION`]); what
    /// no phase covers is in `seconds` only.
    pub phases: Vec<(String, f64)>,
}

impl RecordedTurn {
    /// A turn of `seconds` with no phase recorded.
    #[must_use]
    pub fn of(seconds: f64) -> Self {
        Self { seconds, phases: Vec::new() }
    }

    /// The seconds of its phase `name` (summed, if it went through it twice); 0 if none.
    #[must_use]
    pub fn phase(&self, name: &str) -> f64 {
        self.phases.iter().filter(|(n, _)| n == name).map(|(_, s)| s).sum()
    }

    /// This turn with its evacuation taking `evacuation` seconds.
    fn with_evacuation(&self, evacuation: f64) -> f64 {
        (self.seconds - self.phase(EVACUATION) + evacuation).max(0.0)
    }
}

/// How long one machine's turn takes, for one role.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnModel {
    /// Turns recorded in an earlier upgrade, each with its phases, resampled whole.
    Recorded(Vec<RecordedTurn>),
    /// No history: each turn is the sum of one uniform draw from each phase's range
    /// (its name, and seconds).
    Phases(Vec<(String, (f64, f64))>),
}

impl TurnModel {
    /// The model one run draws from: recorded turns resampled once per run (a bootstrap
    /// replicate, kept as indices), so that the spread carries how little a short history
    /// knows besides how much turns vary; default phases as they are.
    fn for_run(&self, rng: &mut SplitMix64) -> RunModel<'_> {
        let replicate = match self {
            Self::Recorded(turns) => (0..turns.len()).map(|_| rng.below(turns.len())).collect(),
            Self::Phases(_) => Vec::new(),
        };
        RunModel { model: self, replicate }
    }

    /// Its median turn, seconds (the phases' midpoints summed, when there is no history).
    #[must_use]
    pub fn median(&self) -> f64 {
        match self {
            Self::Recorded(turns) => quantile(&turns.iter().map(|t| t.seconds).collect::<Vec<_>>(), 0.5),
            Self::Phases(ranges) => ranges.iter().map(|(_, (low, high))| (low + high) / 2.0).sum(),
        }
    }

    /// The p90 of one turn, seconds: the recorded turns' own; with no record, the sum of
    /// each phase's p90, which is longer than the sum's p90: a start admitted on it into
    /// a maintenance window errs long, never short.
    #[must_use]
    pub fn p90(&self) -> f64 {
        match self {
            Self::Recorded(turns) => quantile(&turns.iter().map(|t| t.seconds).collect::<Vec<_>>(), 0.9),
            Self::Phases(ranges) => ranges.iter().map(|(_, (low, high))| low + (high - low) * 0.9).sum(),
        }
    }

    /// Each phase's distribution under this model, then (for a record) the whole turn's
    /// (`turn`), for `role`.
    #[must_use]
    pub fn fits(&self, role: MachineRole) -> Vec<PhaseFit> {
        let fit = |phase: &str, values: &[f64], recorded: bool| PhaseFit {
            role,
            phase: phase.to_owned(),
            samples: values.len(),
            p10_s: quantile(values, 0.1),
            p50_s: quantile(values, 0.5),
            p90_s: quantile(values, 0.9),
            recorded,
        };
        match self {
            Self::Recorded(turns) => {
                let mut names: Vec<&str> = Vec::new();
                for (name, _) in turns.iter().flat_map(|t| &t.phases) {
                    if !names.contains(&name.as_str()) {
                        names.push(name);
                    }
                }
                let mut fits: Vec<PhaseFit> = names
                    .iter()
                    .map(|name| {
                        let values: Vec<f64> = turns
                            .iter()
                            .filter(|t| t.phases.iter().any(|(n, _)| n == name))
                            .map(|t| t.phase(name))
                            .collect();
                        fit(name, &values, true)
                    })
                    .collect();
                fits.push(fit("turn", &turns.iter().map(|t| t.seconds).collect::<Vec<_>>(), true));
                fits
            }
            Self::Phases(ranges) => {
                let uniform = |name: &str, low: f64, high: f64| PhaseFit {
                    role,
                    phase: name.to_owned(),
                    samples: 0,
                    p10_s: low + (high - low) * 0.1,
                    p50_s: (low + high) / 2.0,
                    p90_s: low + (high - low) * 0.9,
                    recorded: false,
                };
                // Each default phase is uniform over its range (their sum is not: no
                // `turn` is said for it).
                ranges.iter().map(|(name, (low, high))| uniform(name, *low, *high)).collect()
            }
        }
    }
}

/// A [`TurnModel`] as one run draws from it.
struct RunModel<'a> {
    model: &'a TurnModel,
    /// The recorded turns of this run's bootstrap replicate, by index.
    replicate: Vec<usize>,
}

impl RunModel<'_> {
    /// One turn; `evacuation`: the seconds its evacuation takes now, where known, in
    /// place of the drawn turn's.
    fn draw(&self, rng: &mut SplitMix64, evacuation: Option<f64>) -> f64 {
        match self.model {
            TurnModel::Recorded(turns) if !self.replicate.is_empty() => {
                let turn = &turns[self.replicate[rng.below(self.replicate.len())]];
                evacuation.map_or(turn.seconds, |e| turn.with_evacuation(e))
            }
            TurnModel::Recorded(_) => evacuation.unwrap_or(0.0),
            TurnModel::Phases(ranges) => {
                let drawn: f64 = ranges.iter().map(|(_, (low, high))| low + (high - low) * rng.unit()).sum();
                drawn + evacuation.unwrap_or(0.0)
            }
        }
    }
}

/// One phase's distribution for one role, as a plan draws it: from the turns recorded
/// (`recorded`, over `samples` machines that went through it), or its default range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseFit {
    /// The role.
    pub role: MachineRole,
    /// The phase (the timeline's name, such as `evacuating` or `rebooting`; `turn`: the
    /// whole turn; a default's own name where nothing was recorded).
    pub phase: String,
    /// How many recorded turns went through it (0 for a default).
    pub samples: usize,
    /// One in ten is shorter, seconds.
    pub p10_s: f64,
    /// The median, seconds.
    pub p50_s: f64,
    /// Nine in ten are shorter, seconds.
    pub p90_s: f64,
    /// Whether it comes from the record (else from a default).
    pub recorded: bool,
}

/// What an earlier operation recorded, for a plan of the next (seconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// Each converged control plane's turn.
    pub control_plane_turns: Vec<RecordedTurn>,
    /// Each converged worker's turn.
    pub worker_turns: Vec<RecordedTurn>,
    /// From the operation's start to its first turn.
    pub lead: Option<f64>,
    /// The median time from a convergence to the next start.
    pub reaction: Option<f64>,
    /// Its evacuations' rate, when it recorded bytes.
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

impl Defaults {
    /// A Talos machine's turn where a cluster has recorded none: drain 5-30 s, the
    /// installer image pulled alone (100 MB at 50 MB/s: 2 s), install 30-60 s, reboot
    /// 60-150 s, Ready 15-45 s; the reaction is `reaction_s`, the engine's pass interval.
    /// The orders of a metal machine on a 1 Gbit/s link; the simulator's defaults are the
    /// same, so that a dry run on the simulated fleet plans as on a new real cluster.
    #[must_use]
    pub fn talos(reaction_s: f64) -> Self {
        let phase = |name: &str, range: (f64, f64)| (name.to_owned(), range);
        Self {
            phases: vec![
                phase("drain", (5.0, 30.0)),
                phase("pull", (2.0, 2.0)),
                phase("install", (30.0, 60.0)),
                phase("reboot", (60.0, 150.0)),
                phase("Ready", (15.0, 45.0)),
            ],
            reaction_s,
        }
    }

    /// These defaults on a cluster whose seconds pass `time_scale` times faster than the
    /// planner's (the simulated fleet's `--time-scale`): each phase divided by it. The
    /// reaction is left as it is: it is the engine's own pass interval, already in the
    /// planner's seconds. A scale that is not a positive number changes nothing.
    #[must_use]
    pub fn sped_up(mut self, time_scale: f64) -> Self {
        if time_scale.is_finite() && time_scale > 0.0 {
            for (_, (low, high)) in &mut self.phases {
                *low /= time_scale;
                *high /= time_scale;
            }
        }
        self
    }
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

impl Models {
    /// What a start is admitted on into a maintenance window: each role's p90 turn
    /// ([`TurnModel::p90`]).
    #[must_use]
    pub fn p90(&self) -> crate::window::TurnP90 {
        let seconds = |model: &TurnModel| {
            std::time::Duration::try_from_secs_f64(model.p90().max(0.0)).unwrap_or(std::time::Duration::MAX)
        };
        crate::window::TurnP90 { control_plane: seconds(&self.control_plane), worker: seconds(&self.worker) }
    }
}

/// The models for a plan from `recorded` (none: no history), each thing it lacks taken
/// from `defaults` and said so in [`Models::assumed`]. The main job's `--plan` and the
/// operator's dry run both plan through this.
#[must_use]
pub fn models(recorded: Option<&Recorded>, defaults: &Defaults) -> Models {
    let mut assumed = Vec::new();
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
    let mut model = |turns: Option<&Vec<RecordedTurn>>, role: &str| match turns.filter(|t| !t.is_empty()) {
        Some(turns) => TurnModel::Recorded(turns.clone()),
        None => {
            assumed.push(format!("{role}: no turn recorded: default phases ({described})"));
            TurnModel::Phases(defaults.phases.clone())
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
             the one its drawn turn recorded{unknown}",
            rate.bytes_per_s / f64::from(1u32 << 20),
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
    /// evacuation timed by them ([`StorageRate::seconds`]) in each turn drawn; without
    /// it, turns are as recorded.
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
    /// Each phase's distribution the turns were drawn from, per role with machines to go.
    pub phases: Vec<PhaseFit>,
    /// How many runs were drawn.
    pub runs: usize,
}

impl Plan {
    /// How the median run goes through maintenance windows from `from`
    /// ([`crate::window::Calendar::fit`]): each turn as long as the median run has it,
    /// each start admitted on its role's `p90`, `slots` workers at once. `None`: it does
    /// not fit before the calendar's horizon (a turn no window can take).
    #[must_use]
    pub fn through_windows(
        &self,
        calendar: &crate::window::Calendar,
        from: crate::time::Timestamp,
        p90: crate::window::TurnP90,
        slots: usize,
    ) -> Option<crate::window::Fitted> {
        let turn = |t: &PlannedTurn| std::time::Duration::from_secs_f64((t.end_s - t.start_s).max(0.0));
        let of = |role: MachineRole| self.median_run.iter().filter(|t| t.role == role).map(turn).collect::<Vec<_>>();
        let (control_planes, workers) = (of(MachineRole::ControlPlane), of(MachineRole::Worker));
        calendar.fit(from, &crate::window::Turns { control_planes: &control_planes, workers: &workers }, p90, slots)
    }
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
    let evacuation = |m: &PlanMachine| input.storage.zip(m.bytes).map(|(rate, bytes)| rate.seconds(bytes));
    let (cp_evacuation, w_evacuation): (Vec<Option<f64>>, Vec<Option<f64>>) =
        (control_planes.iter().map(|m| evacuation(m)).collect(), workers.iter().map(|m| evacuation(m)).collect());
    let mut drawn: Vec<(f64, Vec<f64>, Vec<f64>)> = (0..runs)
        .map(|_| {
            let (control_plane, worker) = (input.control_plane.for_run(&mut rng), input.worker.for_run(&mut rng));
            let cps: Vec<f64> = cp_evacuation.iter().map(|e| control_plane.draw(&mut rng, *e)).collect();
            let ws: Vec<f64> = w_evacuation.iter().map(|e| worker.draw(&mut rng, *e)).collect();
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
        phases: [
            (MachineRole::ControlPlane, &input.control_plane, &control_planes),
            (MachineRole::Worker, &input.worker, &workers),
        ]
        .into_iter()
        .filter(|(_, _, going)| !going.is_empty())
        .flat_map(|(role, model, _)| model.fits(role))
        .collect(),
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
