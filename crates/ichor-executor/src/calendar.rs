//! Maintenance windows as written ([`MaintenanceSpec`]) expanded into the instants the
//! engine decides on ([`Calendar`]): the shell's half of issue 56 item 3. The time-zone
//! database and the cron schedules live here; the rule (a start only inside a window, and
//! only when its p90 turn ends before the window does) is the core's
//! ([`ichor_upgrade_core::window`]).
//!
//! A window opens at each local time its five-field cron schedule names in its IANA time
//! zone, and stays open for its duration of elapsed time. Across a daylight-saving change:
//! a local opening time that the change skips opens the window at the first instant after
//! the gap (as cron runs a job whose time was skipped); a local time that the change
//! repeats opens it once, at the first of the two. Blackouts are RFC 3339 instants and
//! need no zone. The time zones come from the tz database compiled into the binary, so a
//! calendar is the same on every machine that runs the same build.
//!
//! Pure: no clock (the instant is an argument) and no IO.

use std::str::FromStr;
use std::time::Duration;

use croner::Cron;
use croner::parser::CronParser;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::window::{Calendar, MaintenanceSpec, Span, TurnP90, Windows};
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};

/// How far ahead of the pass's instant a calendar is expanded: two months, enough for a
/// monthly window; a turn no window in it can take waits with no next start named.
pub const HORIZON: Duration = Duration::from_secs(62 * 86_400);

/// The longest a window may stay open: a week (a longer one is a mistake for "always").
pub const LONGEST_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// The most openings of one window a calendar expands; a schedule that opens more often
/// (every minute for two months) is known only as far as its openings reach.
const MOST_OPENINGS: usize = 20_000;

/// The windows the engine decides on at `now`: `None` when `spec` sets no rule, else the
/// calendar with the turns' p90 (`p90`), or what is wrong with the spec.
#[must_use]
pub fn windows(spec: &MaintenanceSpec, now: Timestamp, p90: TurnP90) -> Option<Windows> {
    if spec.is_empty() {
        return None;
    }
    Some(match calendar(spec, now) {
        Ok(calendar) => Windows::Calendar { calendar, p90 },
        Err(problem) => Windows::Invalid(problem),
    })
}

/// The calendar of `spec` from `now` to [`HORIZON`] ahead: the union of the windows (open
/// all the time when it names none) less the blackouts.
///
/// # Errors
/// What is wrong, naming the field: a schedule that is not five cron fields, a duration
/// that does not read or is not between a minute and [`LONGEST_WINDOW`], a time zone the
/// tz database does not know, a blackout whose instants do not read or do not end after
/// they begin.
pub fn calendar(spec: &MaintenanceSpec, now: Timestamp) -> Result<Calendar, String> {
    let mut horizon = now.saturating_add(HORIZON);
    let blackouts = spec
        .blackouts
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let (start, end) = (instant(&b.start, i, "start")?, instant(&b.end, i, "end")?);
            if end <= start {
                return Err(format!("blackouts[{i}]: end {:?} is not after start {:?}", b.end, b.start));
            }
            Ok(Span::new(start, end))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut open = Vec::new();
    if spec.windows.is_empty() {
        open.push(Span::new(now, horizon));
    }
    for (i, window) in spec.windows.iter().enumerate() {
        let cron =
            schedule(&window.schedule).map_err(|e| format!("windows[{i}].schedule {:?}: {e}", window.schedule))?;
        let duration =
            duration(&window.duration).map_err(|e| format!("windows[{i}].duration {:?}: {e}", window.duration))?;
        let zone = window.time_zone.as_deref().unwrap_or("UTC");
        let tz = TimeZone::get(zone)
            .map_err(|_| format!("windows[{i}].timeZone {zone:?} is not a time zone of the IANA database"))?;
        // A window that opened before now may still be open.
        let from = tz.to_datetime(to_jiff(Timestamp::from_unix_millis(
            now.unix_millis().saturating_sub(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)),
        )));
        let mut openings = 0;
        for local in cron.iter_from(from, croner::Direction::Forward) {
            let Some(at) = opening(&tz, local) else { continue };
            if at >= horizon {
                break;
            }
            openings += 1;
            if openings > MOST_OPENINGS {
                // Known only this far.
                horizon = at;
                break;
            }
            open.push(Span::new(at, at.saturating_add(duration)));
        }
    }
    Ok(Calendar::new(open, blackouts, horizon))
}

/// A five-field cron schedule (minute, hour, day of month, month, day of week), or a
/// nickname such as `@daily`.
fn schedule(text: &str) -> Result<Cron, String> {
    let fields = text.split_whitespace().count();
    if !text.trim_start().starts_with('@') && fields != 5 {
        return Err(format!(
            "a schedule has five fields (minute hour day-of-month month day-of-week), such as \"0 2 * * SAT\"; this has {fields}"
        ));
    }
    CronParser::new().parse(text).map_err(|e| e.to_string())
}

/// A duration such as `4h`, `90m` or `1h30m`, from a minute to [`LONGEST_WINDOW`].
fn duration(text: &str) -> Result<Duration, String> {
    let parsed = jiff::SignedDuration::from_str(text.trim())
        .map_err(|_| "a duration reads as hours and minutes, such as \"4h\", \"90m\" or \"1h30m\"".to_owned())?;
    let duration = Duration::try_from(parsed).map_err(|_| "a duration is not negative".to_owned())?;
    if duration < Duration::from_secs(60) || duration > LONGEST_WINDOW {
        return Err("a window stays open from a minute to a week".to_owned());
    }
    Ok(duration)
}

/// An RFC 3339 instant with its offset, of blackout `i`'s `field`.
fn instant(text: &str, i: usize, field: &str) -> Result<Timestamp, String> {
    let at = jiff::Timestamp::from_str(text.trim()).map_err(|_| {
        format!("blackouts[{i}].{field} {text:?} is not an RFC 3339 instant with its offset, such as \"2026-12-24T00:00:00+01:00\"")
    })?;
    Ok(Timestamp::from_unix_millis(at.as_millisecond()))
}

/// The instant a window whose local opening time is `local` opens in `tz`: the first of
/// two where a daylight-saving change repeats it, the first instant after the gap where
/// one skips it. `None` only outside the instants the tz database can name.
fn opening(tz: &TimeZone, local: DateTime) -> Option<Timestamp> {
    let at = match tz.to_ambiguous_timestamp(local).offset() {
        AmbiguousOffset::Unambiguous { offset } | AmbiguousOffset::Fold { before: offset, .. } => {
            offset.to_timestamp(local).ok()?
        }
        AmbiguousOffset::Gap { before, .. } => {
            // Read with the offset before the change, a skipped time falls after it: the
            // change is the last transition at or before that instant.
            let past = before.to_timestamp(local).ok()?;
            let just_after = past.checked_add(jiff::SignedDuration::from_secs(1)).ok()?;
            tz.preceding(just_after).next()?.timestamp()
        }
    };
    Some(Timestamp::from_unix_millis(at.as_millisecond()))
}

/// `at` as jiff's instant.
fn to_jiff(at: Timestamp) -> jiff::Timestamp {
    jiff::Timestamp::from_millisecond(at.unix_millis()).unwrap_or(jiff::Timestamp::MIN)
}

#[cfg(test)]
mod tests;
