use ichor_upgrade_core::window::{BlackoutSpec, WindowSpec};

use super::*;

fn window(schedule: &str, duration: &str, zone: &str) -> WindowSpec {
    WindowSpec { schedule: schedule.into(), duration: duration.into(), time_zone: Some(zone.into()) }
}

fn spec(windows: Vec<WindowSpec>) -> MaintenanceSpec {
    MaintenanceSpec { windows, blackouts: Vec::new() }
}

fn utc(text: &str) -> Timestamp {
    Timestamp::from_unix_millis(jiff::Timestamp::from_str(text).expect("an instant").as_millisecond())
}

/// The first `n` open spans, as RFC 3339 pairs.
fn spans(calendar: &Calendar, n: usize) -> Vec<(String, String)> {
    calendar.spans().iter().take(n).map(|s| (s.start.rfc3339(), s.end.rfc3339())).collect()
}

fn pair(start: &str, end: &str) -> (String, String) {
    (start.to_owned(), end.to_owned())
}

#[test]
fn a_window_whose_opening_a_clock_change_skips_opens_at_the_first_instant_after_it() {
    // Berlin, 2026-03-29: 02:00 CET does not exist (clocks go to 03:00 CEST, 01:00 UTC).
    let spec = spec(vec![window("0 2 * * *", "3h", "Europe/Berlin")]);
    let calendar = calendar(&spec, utc("2026-03-28T12:00:00Z")).expect("reads");
    assert_eq!(
        spans(&calendar, 2),
        vec![
            pair("2026-03-29T01:00:00Z", "2026-03-29T04:00:00Z"),
            // The next day, 02:00 CEST.
            pair("2026-03-30T00:00:00Z", "2026-03-30T03:00:00Z"),
        ]
    );
}

#[test]
fn a_window_whose_opening_a_clock_change_repeats_opens_once_at_the_first() {
    // Berlin, 2026-10-25: 02:30 happens twice (CEST, then CET).
    let spec = spec(vec![window("30 2 * * *", "1h", "Europe/Berlin")]);
    let calendar = calendar(&spec, utc("2026-10-24T12:00:00Z")).expect("reads");
    assert_eq!(
        spans(&calendar, 2),
        vec![
            pair("2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"),
            pair("2026-10-26T01:30:00Z", "2026-10-26T02:30:00Z")
        ]
    );
}

#[test]
fn a_window_open_now_counts_and_windows_make_a_union() {
    // Opened at 09:00 UTC for 2 h; another opens at 10:30 for an hour: one span.
    let spec = spec(vec![window("0 9 * * *", "2h", "UTC"), window("30 10 * * *", "1h", "UTC")]);
    let calendar = calendar(&spec, utc("2026-06-01T10:00:00Z")).expect("reads");
    assert_eq!(spans(&calendar, 1), vec![pair("2026-06-01T09:00:00Z", "2026-06-01T11:30:00Z")]);
    assert_eq!(calendar.horizon(), utc("2026-06-01T10:00:00Z").saturating_add(HORIZON));
}

#[test]
fn blackouts_alone_close_only_themselves() {
    let spec = MaintenanceSpec {
        windows: Vec::new(),
        blackouts: vec![BlackoutSpec {
            start: "2026-12-24T00:00:00+01:00".into(),
            end: "2026-12-27T00:00:00+01:00".into(),
            reason: Some("the holidays".into()),
        }],
    };
    let calendar = calendar(&spec, utc("2026-12-20T00:00:00Z")).expect("reads");
    assert_eq!(
        spans(&calendar, 2),
        vec![
            pair("2026-12-20T00:00:00Z", "2026-12-23T23:00:00Z"),
            pair("2026-12-26T23:00:00Z", &utc("2026-12-20T00:00:00Z").saturating_add(HORIZON).rfc3339())
        ]
    );
}

#[test]
fn no_rule_means_no_windows() {
    let p90 = TurnP90 { control_plane: Duration::from_secs(600), worker: Duration::from_secs(300) };
    assert_eq!(windows(&MaintenanceSpec::default(), Timestamp::EPOCH, p90), None);
}

#[test]
fn what_does_not_read_is_named_with_its_field() {
    let p90 = TurnP90 { control_plane: Duration::from_secs(600), worker: Duration::from_secs(300) };
    let cases: Vec<(MaintenanceSpec, &str)> = vec![
        (
            spec(vec![window("0 0 2 * * *", "4h", "UTC")]),
            "windows[0].schedule \"0 0 2 * * *\": a schedule has five fields",
        ),
        (spec(vec![window("0 25 * * *", "4h", "UTC")]), "windows[0].schedule \"0 25 * * *\""),
        (spec(vec![window("0 2 * * *", "four hours", "UTC")]), "windows[0].duration \"four hours\""),
        (spec(vec![window("0 2 * * *", "30s", "UTC")]), "from a minute to a week"),
        (spec(vec![window("0 2 * * *", "200h", "UTC")]), "from a minute to a week"),
        (
            spec(vec![window("0 2 * * *", "4h", "UTC"), window("0 2 * * *", "4h", "Mars/Olympus")]),
            "windows[1].timeZone \"Mars/Olympus\" is not a time zone",
        ),
        (
            MaintenanceSpec {
                windows: Vec::new(),
                blackouts: vec![BlackoutSpec {
                    start: "2026-12-24".into(),
                    end: "2026-12-25T00:00:00Z".into(),
                    reason: None,
                }],
            },
            "blackouts[0].start \"2026-12-24\" is not an RFC 3339 instant",
        ),
        (
            MaintenanceSpec {
                windows: Vec::new(),
                blackouts: vec![BlackoutSpec {
                    start: "2026-12-25T00:00:00Z".into(),
                    end: "2026-12-24T00:00:00Z".into(),
                    reason: None,
                }],
            },
            "blackouts[0]: end \"2026-12-24T00:00:00Z\" is not after start",
        ),
    ];
    for (spec, wanted) in cases {
        match windows(&spec, utc("2026-06-01T00:00:00Z"), p90) {
            Some(Windows::Invalid(problem)) => assert!(problem.contains(wanted), "{problem:?} lacks {wanted:?}"),
            other => panic!("{spec:?} read as {other:?}"),
        }
    }
}
