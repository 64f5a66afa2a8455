//! etcd, as the engine guards it: [`gate`], its own verdict on whether a control plane may
//! go down now (every member answering, no learner, no alarm, one leader); [`snapshot`], the
//! etcd snapshot an upgrade takes before its first control plane, as its status records it.

pub mod gate;
pub mod snapshot;
