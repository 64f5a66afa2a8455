//! One machine's part of an operation: a pure step per kind of work, each from what was
//! observed of the machine to the one thing to do next.
//!
//! - [`talos`]: a Talos upgrade on the legacy `MachineService.Upgrade` call;
//! - [`lifecycle`]: a Talos upgrade on the lifecycle API (pull, install, the engine's
//!   drain, reboot), built on the legacy step's gates before the call;
//! - [`removal`]: a machine's removal (drain, etcd leave, reset, the Node's deletion);
//! - [`kubernetes`]: a Kubernetes upgrade's component changes on one machine (a static
//!   pod's image applied with no reboot, then verified; the kubelet);
//! - [`vocabulary`]: what they share: the machine as observed, its stage, its timeouts,
//!   and the records that say an upgrade call is in flight whichever executor made it.
//!
//! The steps depend on [`vocabulary`], [`lifecycle`] on [`talos`], and none on another.

pub mod kubernetes;
pub mod lifecycle;
pub mod removal;
pub mod talos;
pub mod vocabulary;
