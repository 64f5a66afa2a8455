use super::*;

fn machines(control_planes: usize, workers: usize) -> Vec<PlanMachine> {
    let cp = (1..=control_planes).map(|i| PlanMachine {
        node: format!("cp-{i}"),
        role: MachineRole::ControlPlane,
        held: None,
        bytes: None,
    });
    let w = (1..=workers).map(|i| PlanMachine {
        node: format!("worker-{i}"),
        role: MachineRole::Worker,
        held: None,
        bytes: None,
    });
    cp.chain(w).collect()
}

fn turns_of(turns: &[f64]) -> TurnModel {
    TurnModel::Recorded(turns.iter().copied().map(RecordedTurn::of).collect())
}

fn phases(ranges: &[(f64, f64)]) -> TurnModel {
    TurnModel::Phases(ranges.iter().enumerate().map(|(i, r)| (format!("phase-{i}"), *r)).collect())
}

fn input(machines: &[PlanMachine], cp: TurnModel, worker: TurnModel, k: usize, seed: u64) -> PlanInput<'_> {
    PlanInput {
        machines,
        control_plane: cp,
        worker,
        lead_s: 10.0,
        reaction_s: 2.0,
        storage: None,
        max_unavailable: k,
        runs: DEFAULT_RUNS,
        seed,
    }
}

#[test]
fn fixed_turns_give_the_engines_schedule_exactly() {
    let m = machines(3, 4);
    let p = plan(&input(&m, turns_of(&[100.0]), turns_of(&[50.0]), 2, 1));
    // Lead 10; three control planes of 100, each slot taken again 2 s later: the workers
    // start at 316; two at once: 316-366, then 368-418.
    assert_eq!((p.p10_s, p.p50_s, p.p90_s), (418.0, 418.0, 418.0));
    assert_eq!(p.bound_s, 300.0 + 100.0, "control planes in series, then 200 s of workers over 2 slots");
    assert_eq!(p.order, ["cp-1", "cp-2", "cp-3", "worker-1", "worker-2", "worker-3", "worker-4"]);
    let starts: Vec<f64> = p.median_run.iter().map(|t| t.start_s).collect();
    assert_eq!(starts, [10.0, 112.0, 214.0, 316.0, 316.0, 368.0, 368.0]);
    assert!(p.held.is_empty());
    assert_eq!(p.runs, DEFAULT_RUNS);
}

#[test]
fn held_machines_are_named_with_their_reason_and_left_out_of_the_schedule() {
    let mut m = machines(1, 3);
    m[2].held = Some("PodDisruptionBudget prod/db allows no disruption".into());
    let p = plan(&input(&m, turns_of(&[100.0]), turns_of(&[50.0]), 1, 1));
    assert_eq!(
        p.held,
        [Held { node: "worker-2".into(), reason: "PodDisruptionBudget prod/db allows no disruption".into() }]
    );
    assert_eq!(p.order, ["cp-1", "worker-1", "worker-3"]);
    assert_eq!(p.p50_s, 10.0 + 102.0 + 52.0 + 50.0);
}

#[test]
fn the_spread_orders_its_quantiles_and_the_same_seed_gives_the_same_plan() {
    let m = machines(3, 20);
    let cp = turns_of(&[200.0, 220.0, 260.0, 240.0, 300.0]);
    let worker = phases(&[(5.0, 30.0), (30.0, 60.0), (60.0, 150.0), (15.0, 45.0)]);
    let a = plan(&input(&m, cp.clone(), worker.clone(), 3, 7));
    assert!(a.p10_s < a.p50_s && a.p50_s < a.p90_s, "{a:?}");
    assert!(a.bound_s < a.p50_s, "the median run's bound has no lead and no reaction: {a:?}");
    assert_eq!(a, plan(&input(&m, cp.clone(), worker.clone(), 3, 7)));
    assert_ne!(a.p50_s, plan(&input(&m, cp, worker, 3, 8)).p50_s);
    assert_eq!(a.median_run.len(), 23);
    assert!(a.median_run.iter().all(|t| t.end_s > t.start_s));
}

/// The point of the plan: a run drawn from the same turns falls between p10 and p90 about
/// 80 % of the time, and near p50.
#[test]
fn runs_drawn_from_the_same_turns_fall_between_p10_and_p90_about_four_times_in_five() {
    let m = machines(3, 20);
    let cp = TurnModel::Recorded((0..30).map(|i| RecordedTurn::of(180.0 + 4.0 * f64::from(i))).collect());
    let worker = phases(&[(5.0, 30.0), (30.0, 60.0), (60.0, 150.0), (15.0, 45.0)]);
    let p = plan(&input(&m, cp.clone(), worker.clone(), 2, 1));
    let trials = 500;
    let mut inside = 0;
    let mut near = 0;
    for seed in 0..trials {
        // One run, as an upgrade would draw it: a plan of one run with another seed.
        let actual = plan(&PlanInput { runs: 1, ..input(&m, cp.clone(), worker.clone(), 2, 1_000 + seed) }).p50_s;
        inside += usize::from(p.p10_s <= actual && actual <= p.p90_s);
        near += usize::from((actual - p.p50_s).abs() <= 0.1 * p.p50_s);
    }
    let share = f64::from(u32::try_from(inside).unwrap()) / f64::from(u32::try_from(trials).unwrap());
    assert!((0.72..=0.88).contains(&share), "{share}");
    assert!(near >= trials as usize * 95 / 100, "{near} of {trials} within 10 % of p50");
}

#[test]
fn quantiles_by_nearest_rank() {
    let values = [5.0, 1.0, 4.0, 2.0, 3.0];
    assert_eq!((quantile(&values, 0.0), quantile(&values, 0.5), quantile(&values, 1.0)), (1.0, 3.0, 5.0));
    assert_eq!(quantile(&[], 0.5), 0.0);
    assert_eq!(phases(&[(0.0, 10.0), (20.0, 30.0)]).median(), 30.0);
}

#[test]
fn models_take_what_was_recorded_and_say_what_they_assumed() {
    let defaults =
        Defaults { phases: vec![("install".into(), (30.0, 60.0)), ("pull".into(), (4.0, 4.0))], reaction_s: 2.0 };
    let recorded = Recorded {
        control_plane_turns: vec![RecordedTurn::of(200.0), RecordedTurn::of(210.0)],
        worker_turns: vec![],
        lead: Some(12.0),
        reaction: None,
        storage: None,
    };
    let m = models(Some(&recorded), &defaults);
    assert_eq!(m.control_plane, turns_of(&[200.0, 210.0]));
    assert_eq!(m.worker, TurnModel::Phases(vec![("install".into(), (30.0, 60.0)), ("pull".into(), (4.0, 4.0))]));
    assert_eq!((m.lead_s, m.reaction_s), (12.0, 2.0));
    assert!(
        m.assumed[0].starts_with("workers: no turn recorded: default phases (install 30-60 s, pull 4 s)"),
        "{:?}",
        m.assumed
    );
    assert!(m.assumed[1].starts_with("reaction: none recorded: 2 s"), "{:?}", m.assumed);
    assert!(!m.assumed.iter().any(|a| a.starts_with("control planes") || a.starts_with("lead")), "{:?}", m.assumed);

    let none = models(None, &defaults);
    assert_eq!(none.control_plane, none.worker);
    assert_eq!(none.lead_s, 0.0);
    assert_eq!(none.assumed.len(), 5, "both roles, the lead, the reaction and the faults: {:?}", none.assumed);
    assert_eq!(none.storage, None);
    let rate = StorageRate { bytes_per_s: 1e8 };
    assert_eq!(models(Some(&Recorded { storage: Some(rate), ..recorded }), &defaults).storage, Some(rate));
}

#[test]
fn the_bytes_on_each_machine_now_replace_the_evacuation_its_drawn_turn_recorded() {
    // Recorded: workers' turns of 50 s, 20 s of which evacuating 2,000 MiB at 100 MiB/s.
    const MIB: u64 = 1 << 20;
    let rate = StorageRate { bytes_per_s: 100.0 * 1024.0 * 1024.0 };
    let worker = |evacuation: Option<f64>| {
        let mut turn = RecordedTurn::of(50.0);
        turn.phases =
            evacuation.iter().map(|e| (EVACUATION.to_owned(), *e)).chain([("installing".into(), 30.0)]).collect();
        turn
    };
    let with = |bytes: Option<u64>, turns: Vec<RecordedTurn>| {
        let mut m = machines(3, 4);
        for machine in m.iter_mut().filter(|m| m.role == MachineRole::Worker) {
            machine.bytes = bytes;
        }
        let mut input = input(&m, turns_of(&[100.0]), TurnModel::Recorded(turns), 2, 1);
        input.storage = Some(rate);
        plan(&input).p50_s
    };
    let evacuating = || vec![worker(Some(20.0))];
    // As recorded (2,000 MiB each): the schedule of fixed_turns_give_the_engines_schedule_exactly.
    assert_eq!(with(Some(2000 * MIB), evacuating()), 418.0);
    // Unknown bytes: the turns as recorded.
    assert_eq!(with(None, evacuating()), 418.0);
    // Twice the bytes: 20 s more a worker, two waves: 40 s more.
    assert_eq!(with(Some(4000 * MIB), evacuating()), 458.0);
    // Storage gone: no evacuation, 20 s less a worker.
    assert_eq!(with(Some(0), evacuating()), 378.0);
    // A turn that recorded no evacuation (the machine had no storage then) gets the whole
    // of the one its bytes take now.
    assert_eq!(with(Some(2000 * MIB), vec![worker(None)]), 418.0 + 40.0);
    // No rate recorded: the bytes change nothing.
    let mut m = machines(3, 4);
    m.iter_mut().for_each(|m| m.bytes = Some(8 << 30));
    let p = plan(&input(&m, turns_of(&[100.0]), TurnModel::Recorded(evacuating()), 2, 1));
    assert_eq!(p.p50_s, 418.0);
    assert_eq!(rate.seconds(0), 0.0);
}

#[test]
fn each_phases_distribution_per_role_is_said_from_the_record_or_its_default() {
    let turn = |seconds: f64, phases: &[(&str, f64)]| RecordedTurn {
        seconds,
        phases: phases.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect(),
    };
    let workers = TurnModel::Recorded(vec![
        turn(100.0, &[("installing", 40.0), ("rebooting", 50.0)]),
        turn(120.0, &[(EVACUATION, 15.0), ("installing", 45.0), ("rebooting", 50.0)]),
        turn(110.0, &[("installing", 50.0), ("rebooting", 55.0), ("installing", 5.0)]),
    ]);
    let fits = workers.fits(MachineRole::Worker);
    let named: Vec<(&str, usize, f64)> = fits.iter().map(|f| (f.phase.as_str(), f.samples, f.p50_s)).collect();
    assert_eq!(named, [("installing", 3, 45.0), ("rebooting", 3, 50.0), (EVACUATION, 1, 15.0), ("turn", 3, 110.0)]);
    assert!(
        fits.iter().all(|f| f.recorded && f.role == MachineRole::Worker && f.p10_s <= f.p50_s && f.p50_s <= f.p90_s)
    );
    let fits = phases(&[(10.0, 20.0)]).fits(MachineRole::ControlPlane);
    assert_eq!(fits.len(), 1, "a default's turn is not one range");
    assert_eq!(
        (fits[0].p10_s, fits[0].p50_s, fits[0].p90_s, fits[0].samples, fits[0].recorded),
        (11.0, 15.0, 19.0, 0, false)
    );
    // A plan says the fits of the roles it has machines of.
    let m = machines(0, 2);
    let p = plan(&input(&m, turns_of(&[100.0]), workers, 1, 1));
    assert!(p.phases.iter().all(|f| f.role == MachineRole::Worker) && p.phases.len() == 4, "{:?}", p.phases);
}

#[test]
fn what_a_plan_made_of_storage_is_said() {
    const GIB: u64 = 1 << 30;
    let mut m = machines(1, 3);
    assert_eq!(describe_storage(&m, None), None, "no storage, no rate: nothing to say");
    m[1].bytes = Some(3 * GIB);
    m[2].bytes = Some(GIB);
    m[3].bytes = None;
    m[0].bytes = Some(0);
    let rate = StorageRate { bytes_per_s: 100.0 * f64::from(1u32 << 20) };
    let said = describe_storage(&m, Some(rate)).unwrap();
    assert!(
        said.starts_with("storage: 4.0 GiB on 2 machines now, each evacuation timed at the recorded 100 MiB/s"),
        "{said}"
    );
    assert!(
        said.contains("in place of the one its drawn turn recorded")
            && said.ends_with("1 machines' bytes unknown: their evacuations as recorded"),
        "{said}"
    );
    let said = describe_storage(&m, None).unwrap();
    assert!(said.contains("the history recorded no bytes"), "{said}");
    // A held machine goes nowhere: its storage is not counted.
    m[1].held = Some("a budget".into());
    assert!(describe_storage(&m, Some(rate)).unwrap().starts_with("storage: 1.0 GiB on 1 machines"));
}

// Issue 55: the simulated fleet runs its cluster ten times faster than a real one, and a
// dry run there with no history planned a real cluster's turns: the quick start's
// calibration then read -92 %.
#[test]
fn defaults_sped_up_divide_each_phase_and_keep_the_reaction() {
    let real = Defaults::talos(2.0);
    let fast = real.clone().sped_up(10.0);
    assert_eq!(fast.reaction_s, 2.0, "the pass interval is already the process's");
    for ((name, (low, high)), (fast_name, (fast_low, fast_high))) in real.phases.iter().zip(&fast.phases) {
        assert_eq!(name, fast_name);
        assert!((fast_low * 10.0 - low).abs() < 1e-9 && (fast_high * 10.0 - high).abs() < 1e-9, "{name}");
    }
    let none = models(None, &fast);
    let real_models = models(None, &real);
    assert!(
        none.worker.median() * 5.0 < real_models.worker.median(),
        "a tenth of each phase: {} against {}",
        none.worker.median(),
        real_models.worker.median()
    );
    for nonsense in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(real.clone().sped_up(nonsense), real, "{nonsense}");
    }
}

#[test]
fn a_turn_s_p90_is_the_record_s_or_errs_long_without_one() {
    let recorded = turns_of(&(1..=10).map(f64::from).collect::<Vec<_>>());
    assert!((recorded.p90() - 9.0).abs() < 1e-9, "{}", recorded.p90());
    // Each default phase's p90, summed: 9 + 18, more than the sum's own p90.
    let defaults = phases(&[(0.0, 10.0), (0.0, 20.0)]);
    assert!((defaults.p90() - 27.0).abs() < 1e-9, "{}", defaults.p90());
    let models = Models {
        control_plane: recorded,
        worker: defaults,
        lead_s: 0.0,
        reaction_s: 0.0,
        storage: None,
        assumed: Vec::new(),
    };
    let p90 = models.p90();
    assert_eq!(p90.control_plane, std::time::Duration::from_secs(9));
    assert_eq!(p90.worker, std::time::Duration::from_secs(27));
}
