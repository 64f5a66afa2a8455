//! The integration tests of ichor-timeline, one module per file, in one test binary.

mod browser;
mod common;
mod svg;
