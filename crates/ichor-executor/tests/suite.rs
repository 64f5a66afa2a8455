//! The integration tests of ichor-executor, one module per file, in one test binary.

mod advance_driver;
mod lifecycle_driver;
mod reconcile_driver;
mod removal_driver;
mod support;
