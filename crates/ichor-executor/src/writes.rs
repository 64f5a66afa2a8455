//! The writes the drivers make on a machine, its Node and its pods, as values (decision
//! 0016).
//!
//! A write is a [`TalosWrite`], a [`KubeWrite`], a [`ConditionWrite`] or a
//! [`StorageWrite`], carried out through the one method its trait has for it
//! ([`TalosApi::write`](crate::talos_api::TalosApi::write),
//! [`KubeApi::write`](crate::kube_api::KubeApi::write),
//! [`KubeApi::write_conditions`](crate::kube_api::KubeApi::write_conditions),
//! [`StorageApi::write`](crate::storage_api::StorageApi::write)), which asks for a [`Seal`]. Only
//! [`crate::effects`] can make a seal, so nothing else in this crate can make a write: the
//! seam is a rule the compiler keeps. Its answer is a [`TalosWritten`], a [`KubeWritten`]
//! or a [`StorageWritten`], of the variant's own kind. The evacuation's definition in
//! `ichor-storage` makes its writes through `ichor_storage::EvacuationWrites`, which
//! `effects` implements over these.
//!
//! A wrapper (a fence, a trace, request counting) implements `write` once, with a `match`
//! over the variants where it must tell them apart, and passes on the seal it was given.
//! The enums live beside their traits (`talos_api`, `kube_api`, `storage_api`) and the seal in
//! `effects::seal`, below both, so that no module circle runs through the seam. Adding a
//! write is one variant and its reply, and the arms of the implementations.

pub use crate::effects::seal::Seal;
pub use crate::kube_api::{ConditionWrite, KubeWrite, KubeWritten};
pub use crate::storage_api::{StorageWrite, StorageWritten};
pub use crate::talos_api::{TalosWrite, TalosWritten};
