//! The real clock.

use std::time::{SystemTime, UNIX_EPOCH};

use ichor_executor::Clock;
use ichor_upgrade_core::Timestamp;

/// The machine's wall clock. A time before the Unix epoch (a badly set clock) reads as
/// the epoch rather than failing: the core treats instants in the future of a condition
/// as "no time passed", so a backwards clock delays timeouts but never panics.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        Timestamp::from_unix_millis(i64::try_from(millis).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_reads_a_time_after_2025() {
        let now = SystemClock.now();
        assert!(now > Timestamp::from_unix_secs(1_735_689_600), "{now}");
    }
}
