use super::*;

fn at(minutes: i64) -> Timestamp {
    Timestamp::from_unix_secs(minutes * 60)
}

fn span(from: i64, to: i64) -> Span {
    Span::new(at(from), at(to))
}

fn mins(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

#[test]
fn windows_merge_into_their_union_and_blackouts_cut_them() {
    let calendar =
        Calendar::new([span(100, 200), span(150, 260), span(260, 300), span(400, 410)], [span(180, 190)], at(1_000));
    assert_eq!(calendar.spans(), &[span(100, 180), span(190, 300), span(400, 410)]);
}

#[test]
fn a_span_past_the_horizon_ends_there_and_empty_ones_count_for_nothing() {
    let calendar = Calendar::new([span(10, 5), span(20, 20), span(90, 200)], [], at(120));
    assert_eq!(calendar.spans(), &[span(90, 120)]);
    assert_eq!(calendar.horizon(), at(120));
}

#[test]
fn a_start_is_admitted_only_when_its_p90_ends_inside_the_window() {
    let calendar = Calendar::new([span(100, 200), span(300, 500)], [], at(1_000));
    assert_eq!(calendar.admit(at(100), mins(100)), WindowVerdict::Open { closes: at(200) });
    // One minute late: the turn's p90 would run a minute past the end.
    assert_eq!(
        calendar.admit(at(101), mins(100)),
        WindowVerdict::WouldOverrun { closes: at(200), next_start: Some(at(300)) }
    );
    assert_eq!(calendar.admit(at(50), mins(10)), WindowVerdict::Outside { next_start: Some(at(100)) });
    // The end is not in the window.
    assert_eq!(calendar.admit(at(200), mins(10)), WindowVerdict::Outside { next_start: Some(at(300)) });
}

#[test]
fn the_next_start_skips_windows_too_short_for_the_turn() {
    let calendar = Calendar::new([span(100, 130), span(300, 500)], [], at(1_000));
    assert_eq!(calendar.admit(at(0), mins(60)), WindowVerdict::Outside { next_start: Some(at(300)) });
    // None long enough before the horizon.
    assert_eq!(calendar.admit(at(0), mins(600)), WindowVerdict::Outside { next_start: None });
}

#[test]
fn a_blackout_inside_a_window_shortens_what_it_admits() {
    let calendar = Calendar::new([span(0, 600)], [span(120, 180)], at(1_000));
    assert_eq!(calendar.admit(at(30), mins(60)), WindowVerdict::Open { closes: at(120) });
    assert_eq!(
        calendar.admit(at(90), mins(60)),
        WindowVerdict::WouldOverrun { closes: at(120), next_start: Some(at(180)) }
    );
    assert_eq!(calendar.admit(at(150), mins(60)), WindowVerdict::Outside { next_start: Some(at(180)) });
}

#[test]
fn a_rollout_is_fitted_to_the_windows_it_needs() {
    // Two-hour windows a day apart; turns of 30 minutes, admitted on a p90 of 40.
    let day = 24 * 60;
    let calendar = Calendar::new((0..10).map(|d| span(d * day, d * day + 120)), [], at(10 * day));
    let p90 = TurnP90 { control_plane: mins(40), worker: mins(40) };
    let cps = [mins(30); 3];
    let workers = [mins(30); 5];
    let turns = Turns { control_planes: &cps, workers: &workers };
    // Control planes at 0, 30, 60 (the next at 90 ends by 130 > 120: tomorrow); workers
    // two at a time: 1 day + 0, 0, 30, 30, 60.
    let fitted = calendar.fit(at(0), &turns, p90, 2).expect("fits");
    assert_eq!(fitted, Fitted { windows: 2, finish: at(day + 90) });
    // One at a time: 0, 30, 60 then 1 day + 0, 30, 60, then 2 days + 0, 30.
    let fitted = calendar.fit(at(0), &turns, p90, 1).expect("fits");
    assert_eq!(fitted, Fitted { windows: 3, finish: at(2 * day + 60) });
    // A turn no window can take: it never fits.
    let long = TurnP90 { control_plane: mins(200), worker: mins(40) };
    assert_eq!(calendar.fit(at(0), &turns, long, 2), None);
}

#[test]
fn the_spec_round_trips_in_the_crd_s_words() {
    let spec = MaintenanceSpec {
        windows: vec![WindowSpec {
            schedule: "0 2 * * SAT,SUN".into(),
            duration: "4h".into(),
            time_zone: Some("Europe/Berlin".into()),
        }],
        blackouts: vec![BlackoutSpec {
            start: "2026-12-24T00:00:00+01:00".into(),
            end: "2026-12-27T00:00:00+01:00".into(),
            reason: None,
        }],
    };
    let json = serde_json::to_value(&spec).expect("serializes");
    assert_eq!(json["windows"][0]["timeZone"], "Europe/Berlin");
    assert_eq!(serde_json::from_value::<MaintenanceSpec>(json).expect("parses"), spec);
    assert!(MaintenanceSpec::default().is_empty());
}
