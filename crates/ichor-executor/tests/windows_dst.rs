//! The maintenance windows' property (issue 56 item 3), across daylight-saving changes:
//! over random windows (cron schedules in random IANA zones, durations, blackouts) and
//! random turns, a run of starts admitted by the engine's rule
//! ([`ichor_upgrade_core::window::Calendar::admit`] on the calendar
//! [`ichor_executor::calendar::calendar`] expands at each instant) never starts a machine
//! outside a window and never starts one whose p90 turn would run past its window's end.
//! It also never refuses a start that fits, and the next start it names is one.
//!
//! The oracle is independent of the expansion: it walks every minute of the case, reads
//! each one's local time in the window's zone (instant to local time is never ambiguous),
//! and opens a window at the first instant that shows a scheduled local time, or at the
//! first instant after a clock change that skipped one.

use std::time::Duration;

use ichor_executor::calendar::calendar;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::window::{BlackoutSpec, MaintenanceSpec, WindowSpec, WindowVerdict};
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use proptest::prelude::*;

/// Zones with daylight-saving changes of every shape: an hour forward and back at 02:00
/// (Berlin, New York), in the southern hemisphere (Sydney, Santiago at midnight), half an
/// hour (Lord Howe), offsets of half and three quarters of an hour (St John's, Chatham),
/// and none (Kolkata, UTC).
const ZONES: [&str; 10] = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Sydney",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Europe/London",
    "America/St_Johns",
    "Pacific/Chatham",
    "Asia/Kolkata",
    "UTC",
];

const MINUTE: i64 = 60_000;

/// One window as the case draws it: `minute hour * * days`.
#[derive(Debug, Clone)]
struct Drawn {
    minute: i8,
    hour: i8,
    /// Days of the week, Sunday 0; empty: every day.
    days: Vec<i8>,
    minutes: i64,
    zone: &'static str,
}

impl Drawn {
    fn spec(&self) -> WindowSpec {
        let days = if self.days.is_empty() {
            "*".to_owned()
        } else {
            self.days.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
        };
        WindowSpec {
            schedule: format!("{} {} * * {days}", self.minute, self.hour),
            duration: format!("{}m", self.minutes),
            time_zone: Some(self.zone.to_owned()),
        }
    }

    fn matches(&self, local: DateTime) -> bool {
        local.minute() == self.minute
            && local.hour() == self.hour
            && (self.days.is_empty() || self.days.contains(&local.weekday().to_sunday_zero_offset()))
    }
}

fn drawn_window() -> impl Strategy<Value = Drawn> {
    // Openings drawn often inside the hours that clocks skip or repeat.
    let hour = prop_oneof![0_i8..24, 0_i8..4];
    (
        0_i8..60,
        hour,
        proptest::collection::btree_set(0_i8..7, 0..4),
        20_i64..=480,
        proptest::sample::select(ZONES.to_vec()),
    )
        .prop_map(|(minute, hour, days, minutes, zone)| Drawn {
            minute,
            hour,
            days: days.into_iter().collect(),
            minutes,
            zone,
        })
}

/// A case: windows, blackouts (minutes from the start, lengths), when it starts (minutes
/// before the zone's first clock change of 2026 or its second), the turns' p90 and the
/// share of it each turn takes.
#[derive(Debug, Clone)]
struct Case {
    windows: Vec<Drawn>,
    blackouts: Vec<(i64, i64)>,
    change: usize,
    before: i64,
    p90_minutes: i64,
    turns: Vec<u8>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(drawn_window(), 1..4),
        proptest::collection::vec((0_i64..4 * 1440, 30_i64..600), 0..3),
        0_usize..2,
        0_i64..2 * 1440,
        5_i64..=180,
        proptest::collection::vec(30_u8..=100, 4..12),
    )
        .prop_map(|(windows, blackouts, change, before, p90_minutes, turns)| Case {
            windows,
            blackouts,
            change,
            before,
            p90_minutes,
            turns,
        })
}

/// Where every minute of the case stands, as the oracle reads the windows.
struct Oracle {
    /// The first minute, Unix milliseconds.
    from: i64,
    /// Per minute: whether it is inside a window and outside every blackout.
    open: Vec<bool>,
    /// `closed[i]`: how many of the first `i` minutes are not open.
    closed: Vec<u32>,
}

impl Oracle {
    fn new(case: &Case, from: i64, to: i64, blackouts: &[(i64, i64)]) -> Self {
        let minutes = usize::try_from((to - from) / MINUTE).unwrap();
        let mut open = vec![false; minutes];
        for window in &case.windows {
            let tz = TimeZone::get(window.zone).unwrap();
            let local = |ms: i64| tz.to_datetime(jiff::Timestamp::from_millisecond(ms).unwrap());
            for i in 0..minutes {
                let at = from + i64::try_from(i).unwrap() * MINUTE;
                let now = local(at);
                let before = local(at - MINUTE);
                // A scheduled local time shown for the first time (a repeated hour shows it
                // twice: the second is no opening).
                let shown = window.matches(now) && (1..=180).all(|k| local(at - k * MINUTE) != now);
                // A clock change that skipped a scheduled local time opens it here.
                let skipped = now > before.saturating_add(jiff::SignedDuration::from_mins(1)) && {
                    let mut c = before.saturating_add(jiff::SignedDuration::from_mins(1));
                    let mut hit = false;
                    while c < now {
                        hit |= window.matches(c);
                        c = c.saturating_add(jiff::SignedDuration::from_mins(1));
                    }
                    hit
                };
                if shown || skipped {
                    let end = (i + usize::try_from(window.minutes).unwrap()).min(minutes);
                    open[i..end].iter_mut().for_each(|m| *m = true);
                }
            }
        }
        for (start, end) in blackouts {
            let first = usize::try_from(((start - from) / MINUTE).max(0)).unwrap().min(minutes);
            let last = usize::try_from(((end - from) / MINUTE).max(0)).unwrap().min(minutes);
            open[first..last].iter_mut().for_each(|m| *m = false);
        }
        let mut closed = Vec::with_capacity(minutes + 1);
        closed.push(0);
        for m in &open {
            closed.push(closed.last().unwrap() + u32::from(!m));
        }
        Self { from, open, closed }
    }

    /// Whether a turn of `turn` may start at `at` by the oracle: every minute it spans
    /// open. `None`: beyond what the oracle knows.
    fn fits(&self, at: Timestamp, turn: Duration) -> Option<bool> {
        let first = (at.unix_millis() - self.from).div_euclid(MINUTE);
        let last = (at.unix_millis() + i64::try_from(turn.as_millis()).unwrap() - 1 - self.from).div_euclid(MINUTE);
        let (first, last) = (usize::try_from(first).ok()?, usize::try_from(last).ok()?);
        (last < self.open.len()).then(|| self.closed[last + 1] == self.closed[first])
    }
}

/// The instant of the zone's `n`th clock change of 2026 (or mid-2026 for a zone without
/// any), Unix milliseconds.
fn clock_change(zone: &str, n: usize) -> i64 {
    let tz = TimeZone::get(zone).unwrap();
    let year = jiff::Timestamp::from_second(1_767_225_600).unwrap();
    let changes: Vec<i64> = tz.following(year).take(2).map(|t| t.timestamp().as_millisecond()).collect();
    changes.get(n).or(changes.first()).copied().unwrap_or(1_780_272_000_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::cases("WINDOW_CASES", 48), ..ProptestConfig::default() })]

    #[test]
    fn no_start_outside_a_window_nor_past_its_end_across_clock_changes(case in case()) {
        let start = clock_change(case.windows[0].zone, case.change) - case.before * MINUTE;
        let start = start - start.rem_euclid(MINUTE);
        let blackouts: Vec<(i64, i64)> =
            case.blackouts.iter().map(|(at, len)| (start + at * MINUTE, start + (at + len) * MINUTE)).collect();
        let spec = MaintenanceSpec {
            windows: case.windows.iter().map(Drawn::spec).collect(),
            blackouts: blackouts
                .iter()
                .map(|(s, e)| BlackoutSpec {
                    start: jiff::Timestamp::from_millisecond(*s).unwrap().to_string(),
                    end: jiff::Timestamp::from_millisecond(*e).unwrap().to_string(),
                    reason: None,
                })
                .collect(),
        };
        let oracle = Oracle::new(&case, start - 1440 * MINUTE, start + 9 * 1440 * MINUTE, &blackouts);
        let turn = Duration::from_secs(u64::try_from(case.p90_minutes).unwrap() * 60);
        let mut now = Timestamp::from_unix_millis(start);
        let mut turns = case.turns.iter();
        while let Some(share) = turns.clone().next() {
            let calendar = calendar(&spec, now).expect("the case's windows read");
            let verdict = calendar.admit(now, turn);
            let Some(fits) = oracle.fits(now, turn) else { break };
            prop_assert_eq!(matches!(verdict, WindowVerdict::Open { .. }), fits, "at {}: {:?}", now.rfc3339(), verdict);
            match verdict {
                WindowVerdict::Open { closes } => {
                    prop_assert!(now.saturating_add(turn) <= closes);
                    turns.next();
                    // The turn takes its share of the p90, then the next is looked at.
                    now = now.saturating_add(turn.mul_f64(f64::from(*share) / 100.0));
                }
                WindowVerdict::Outside { next_start } | WindowVerdict::WouldOverrun { next_start, .. } => {
                    let Some(next) = next_start else {
                        // None in the calendar's two months: none in the oracle's days.
                        let mut at = now;
                        while let Some(fits) = oracle.fits(at, turn) {
                            prop_assert!(!fits, "a start fits at {} but none was named", at.rfc3339());
                            at = at.saturating_add(Duration::from_secs(60));
                        }
                        break;
                    };
                    prop_assert!(next > now);
                    // Nothing fits before the start named, and it does fit then.
                    let mut at = Timestamp::from_unix_millis(now.unix_millis() - now.unix_millis().rem_euclid(MINUTE) + MINUTE);
                    while at < next {
                        if let Some(fits) = oracle.fits(at, turn) {
                            prop_assert!(!fits, "a start fits at {}, before the next named, {}", at.rfc3339(), next.rfc3339());
                        }
                        at = at.saturating_add(Duration::from_secs(60));
                    }
                    now = next;
                }
            }
        }
    }
}
