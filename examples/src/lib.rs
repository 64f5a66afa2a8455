//! Shared pieces of the Ichor examples: how they report argument errors.
//!
//! The examples' command lines are contracts used by checks outside the repository, so
//! their output and exit codes are kept in one place: here, and the conventions they share
//! with the operator's own binary in [`ichor_operator::cli`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use ichor_operator::cli::{EXIT_BAD_ARGUMENT, ExecutorArg, Switch, executor_config, parse_args};

/// Exit code: the request was carried out or allowed.
pub const EXIT_OK: i32 = 0;
/// Exit code: the request was understood and refused.
pub const EXIT_REFUSED: i32 = 3;
