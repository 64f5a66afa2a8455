//! One machine's part of a pass, one driver per kind of work, as the core's
//! `ichor_upgrade_core::machine` has one step per kind. Each reads what its step looks at,
//! calls the pure step, carries out its one action through [`crate::effects`] and writes
//! the machine's conditions; none keeps anything between passes.
//!
//! - [`talos`]: a Talos upgrade ([`advance_machine`](talos::advance_machine)), on the
//!   legacy Upgrade call or, from Talos 1.13, handing the machine to [`lifecycle`];
//! - [`lifecycle`]: a Talos upgrade on the lifecycle API (pull, install, drain, reboot);
//! - [`actions`]: the actions both Talos executors share (the evacuation, the converged
//!   record, waits and failures) and the legacy Upgrade call;
//! - [`removal`]: a machine's removal;
//! - [`kubernetes`]: a Kubernetes upgrade's component changes on one machine.

pub mod actions;
pub mod kubernetes;
pub mod lifecycle;
pub mod removal;
pub mod talos;
