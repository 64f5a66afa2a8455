//! The executor's configuration.

use std::time::Duration;

use ichor_upgrade_core::rollout::RolloutConfig;
use ichor_upgrade_core::talos_step::StepTimeouts;

/// How long calls may take, and the step's and engine's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutorConfig {
    /// The bound of every call but Upgrade (default 15 s).
    pub call_timeout: Duration,
    /// The step's bounds; `upgrade_call` (default 10 minutes) is the Upgrade call's own
    /// bound, since the node pulls and checks the installer image before it answers.
    pub step: StepTimeouts,
    /// The cluster lock's timing.
    pub rollout: RolloutConfig,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self { call_timeout: Duration::from_secs(15), step: StepTimeouts::default(), rollout: RolloutConfig::default() }
    }
}

impl ExecutorConfig {
    /// The same configuration with another ordinary call bound.
    #[must_use]
    pub fn with_call_timeout(mut self, bound: Duration) -> Self {
        self.call_timeout = bound;
        self
    }

    /// The same configuration with another Upgrade call bound.
    #[must_use]
    pub fn with_upgrade_call_timeout(mut self, bound: Duration) -> Self {
        self.step.upgrade_call = bound;
        self
    }
}
