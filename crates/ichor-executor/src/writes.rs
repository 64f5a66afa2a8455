//! The writes the drivers make on a machine, its Node and its pods, as values (decision
//! 0016).
//!
//! A write is a [`TalosWrite`] or a [`KubeWrite`], carried out through the one method its
//! trait has for writes ([`TalosApi::write`](crate::talos_api::TalosApi::write),
//! [`KubeApi::write`](crate::kube_api::KubeApi::write)), which asks for a [`Seal`]. Only
//! [`crate::effects`] can make a seal, so nothing else in this crate can make a write: the
//! seam is a rule the compiler keeps. Its answer is a [`TalosWritten`] or a
//! [`KubeWritten`], of the variant's own kind.
//!
//! A wrapper (a fence, a trace, request counting) implements `write` once, with a `match`
//! over the variants where it must tell them apart, and passes on the seal it was given.
//! The enums live beside their traits (`talos_api`, `kube_api`) and the seal in
//! `effects::seal`, below both, so that no module circle runs through the seam. Adding a
//! write is one variant and its reply, and the arms of the implementations.

pub use crate::effects::seal::Seal;
pub use crate::kube_api::{KubeWrite, KubeWritten};
pub use crate::talos_api::{TalosWrite, TalosWritten};
