//! The one place the drivers learn the time.

use ichor_upgrade_core::Timestamp;

/// A source of wall-clock time. Drivers read it once per pass and hand the value to the
/// pure core; the simulated cluster implements it with virtual time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
