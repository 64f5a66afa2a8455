//! A picture of a rollout: draws a trace (the JSON lines that `rollout --trace` and
//! `operator --trace` write) as an SVG Gantt chart, with one row per machine and a bar per
//! phase, or, for thousands of machines, a density band per role.
//!
//! It reads records and returns a document; it does no other IO, starts nothing and
//! knows nothing of the engine but the trace's event names, so that a trace from any
//! version of the simulator or the operator draws. An event it does not know is ignored.
//!
//! ```
//! let trace = r#"{"t":0,"node":"cp-1","role":"control-plane","event":"upgrade-call"}
//! {"t":60,"node":"cp-1","role":"control-plane","event":"reboot-start"}
//! {"t":180,"node":"cp-1","role":"control-plane","event":"reboot-end"}
//! {"t":200,"node":"cp-1","role":"control-plane","event":"ready"}
//! {"t":205,"node":"cp-1","role":"control-plane","event":"converged"}"#;
//! let records = ichor_timeline::read_trace(trace.as_bytes())?;
//! let timeline = ichor_timeline::Timeline::from_records(&records);
//! let svg = ichor_timeline::render(&timeline, &ichor_timeline::Options::default()).to_string();
//! assert!(svg.contains(r#"data-phase="rebooting""#));
//! # Ok::<(), ichor_timeline::TraceError>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod draw;
pub mod history;
pub mod model;
pub mod trace;

pub use draw::{Options, clock, render};
pub use history::History;
pub use model::{Bar, Machine, Phase, Timeline, Tracker};
pub use trace::{TraceError, TraceRecord, read_trace};
