//! The integration tests of ichor-executor, one module per file, in one test binary.

mod advance_driver;
mod lifecycle_driver;
mod reconcile_driver;
mod removal_driver;
mod support;
mod windows_dst;

/// How many cases a property runs: the environment variable `var` if set (a soak run, for
/// instance `WINDOW_CASES=5000`), else `default`.
pub(crate) fn cases(var: &str, default: u32) -> u32 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
