//! Wall-clock instants as plain values.
//!
//! The core never reads a clock: every decision takes `now` as an argument. Instants are
//! milliseconds since the Unix epoch so that they survive a restart inside a Kubernetes
//! object, and every subtraction saturates: an instant in the future (clock skew between
//! the writer of a condition and the reader) counts as "no time has passed", never as a
//! negative duration or a panic.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// An instant, in milliseconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Self = Self(0);

    /// The instant `millis` milliseconds after the Unix epoch.
    #[must_use]
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// The instant `secs` seconds after the Unix epoch.
    #[must_use]
    pub const fn from_unix_secs(secs: i64) -> Self {
        Self(secs.saturating_mul(1000))
    }

    /// Milliseconds since the Unix epoch.
    #[must_use]
    pub const fn unix_millis(self) -> i64 {
        self.0
    }

    /// The time elapsed from `earlier` to `self`; zero when `earlier` is not before `self`
    /// (a transition time in the future is treated as now).
    #[must_use]
    pub fn saturating_since(self, earlier: Self) -> Duration {
        let millis = self.0.saturating_sub(earlier.0);
        Duration::from_millis(u64::try_from(millis).unwrap_or(0))
    }

    /// `self + duration`, saturating at the largest representable instant.
    #[must_use]
    pub fn saturating_add(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_add(millis))
    }

    /// `self - duration`, saturating at the smallest representable instant.
    #[must_use]
    pub fn saturating_sub(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_sub(millis))
    }

    /// The instant's calendar date and time of day in UTC, to the second, in the
    /// proleptic Gregorian calendar: what a name or a message built from it reads.
    #[must_use]
    pub fn utc(self) -> Utc {
        let secs = self.0.div_euclid(1000);
        let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        Utc { year, month, day, hour: day_secs / 3600, minute: day_secs % 3600 / 60, second: day_secs % 60 }
    }

    /// The instant in RFC 3339, UTC, to the second (`2026-03-29T01:00:00Z`): how a status
    /// message names it for people.
    #[must_use]
    pub fn rfc3339(self) -> String {
        let Utc { year, month, day, hour, minute, second } = self.utc();
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
    }

    /// The earlier of `self` and `other`, where `None` means "never".
    #[must_use]
    pub fn min_opt(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (Some(a), None) => Some(a),
            (None, b) => b,
        }
    }
}

/// A [`Timestamp`] read on the UTC calendar ([`Timestamp::utc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    /// The year (proleptic Gregorian; before 1970 too).
    pub year: i64,
    /// The month, 1 to 12.
    pub month: i64,
    /// The day of the month, 1 to 31.
    pub day: i64,
    /// The hour, 0 to 23.
    pub hour: i64,
    /// The minute, 0 to 59.
    pub minute: i64,
    /// The second, 0 to 59.
    pub second: i64,
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}s", self.0.div_euclid(1000), self.0.rem_euclid(1000))
    }
}

/// The proleptic Gregorian date `days` days after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_future_instant_counts_as_no_time_passed() {
        let now = Timestamp::from_unix_secs(100);
        let future = Timestamp::from_unix_secs(160);
        assert_eq!(now.saturating_since(future), Duration::ZERO);
        assert_eq!(future.saturating_since(now), Duration::from_secs(60));
    }

    #[test]
    fn extremes_saturate_instead_of_overflowing() {
        let max = Timestamp::from_unix_millis(i64::MAX);
        assert_eq!(max.saturating_add(Duration::from_secs(1)), max);
        let min = Timestamp::from_unix_millis(i64::MIN);
        assert_eq!(max.saturating_since(min), Duration::from_millis(i64::MAX as u64));
        assert_eq!(Timestamp::from_unix_secs(i64::MAX).unix_millis(), i64::MAX);
    }

    #[test]
    fn instants_read_as_rfc3339_in_utc() {
        assert_eq!(Timestamp::EPOCH.rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(Timestamp::from_unix_secs(1_774_746_000).rfc3339(), "2026-03-29T01:00:00Z");
        // A leap day, and the last second of a year.
        assert_eq!(Timestamp::from_unix_secs(951_782_400).rfc3339(), "2000-02-29T00:00:00Z");
        assert_eq!(Timestamp::from_unix_millis(1_798_761_599_999).rfc3339(), "2026-12-31T23:59:59Z");
        assert_eq!(Timestamp::from_unix_secs(-1).rfc3339(), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn min_opt_treats_none_as_never() {
        let a = Timestamp::from_unix_secs(1);
        let b = Timestamp::from_unix_secs(2);
        assert_eq!(Timestamp::min_opt(Some(b), Some(a)), Some(a));
        assert_eq!(Timestamp::min_opt(None, Some(b)), Some(b));
        assert_eq!(Timestamp::min_opt(Some(a), None), Some(a));
        assert_eq!(Timestamp::min_opt(None, None), None);
    }
}
