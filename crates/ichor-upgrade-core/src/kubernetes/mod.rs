//! What a Kubernetes upgrade knows of Kubernetes itself, apart from any one machine:
//!
//! - [`component`]: the components it changes, in Talos's order;
//! - [`plan`]: the upgrade's plan, its steps in Talos's order, or every reason it would
//!   break the cluster;
//! - [`args`]: the components' flags the target removes, and which of them are in use;
//! - [`dry_run`]: everything a dry run of the upgrade finds, a refusal among the rest;
//! - [`manifests`]: the bootstrap manifests' rollout, the upgrade's last step;
//! - [`removals`]: the API versions Kubernetes releases remove, and the resources only
//!   such versions serve.
//!
//! One machine's part of the upgrade is [`crate::machine::kubernetes`].

pub mod args;
pub mod component;
pub mod dry_run;
pub mod manifests;
pub mod plan;
pub mod removals;
