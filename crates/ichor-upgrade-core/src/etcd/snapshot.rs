//! The etcd snapshot an upgrade takes before it touches the first control plane, as the
//! operation's status records it, and the name it is stored under.
//!
//! The rules (in [`crate::rollout`]): under `spec.etcdSnapshot: Required`, a control plane
//! is started only once a snapshot is recorded; a snapshot is recorded only whole (a
//! partial one, interrupted by a crash, is never recorded, so it is taken again); once
//! recorded, a resumed or restarted operation does not take a second one; a failure to take
//! it pauses the operation until a person resumes it, which takes it again.

use serde::{Deserialize, Serialize};

use crate::time::{Timestamp, Utc};

/// A snapshot taken and stored whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// Where it is (a path, an `s3://` URL).
    pub location: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, in lowercase hex.
    pub sha256: String,
    /// The control plane it was streamed from.
    pub node: String,
    /// When it was finished.
    pub taken_at: Timestamp,
}

/// Where an operation's etcd snapshot stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotState {
    /// Taken and recorded: control planes may go.
    Taken(SnapshotRecord),
    /// Could not be taken: the operation is paused until resumed.
    Failed {
        /// Why, with its causes.
        reason: String,
        /// When it failed.
        at: Timestamp,
    },
}

impl SnapshotState {
    /// The record, if the snapshot was taken.
    #[must_use]
    pub fn taken(&self) -> Option<&SnapshotRecord> {
        match self {
            Self::Taken(record) => Some(record),
            Self::Failed { .. } => None,
        }
    }
}

/// The name a snapshot is stored under: the cluster, the target and the time in UTC, as
/// the runbook names its own (`prod-etcd-before-v1.14.4-20261201T043000Z.db`). Characters
/// other than ASCII letters, digits, `.`, `-` and `_` in the cluster's name or the target
/// become `_`, so the name is a file name and an object key on any store.
#[must_use]
pub fn snapshot_name(cluster: &str, target: &str, at: Timestamp) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect()
    };
    let Utc { year, month, day, hour, minute, second } = at.utc();
    format!(
        "{}-etcd-before-{}-{year:04}{month:02}{day:02}T{hour:02}{minute:02}{second:02}Z.db",
        clean(cluster),
        clean(target)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_cluster_the_target_and_the_utc_time() {
        // 2026-12-01T04:30:00Z
        let at = Timestamp::from_unix_secs(1_796_099_400);
        assert_eq!(snapshot_name("prod", "v1.14.4", at), "prod-etcd-before-v1.14.4-20261201T043000Z.db");
        assert_eq!(
            snapshot_name("eu/west 1", "v1.14.4", Timestamp::from_unix_secs(0)),
            "eu_west_1-etcd-before-v1.14.4-19700101T000000Z.db"
        );
        // A leap day, and the turn of a century that is not a leap year.
        assert!(snapshot_name("c", "t", Timestamp::from_unix_secs(951_782_400)).ends_with("-20000229T000000Z.db"));
        assert!(snapshot_name("c", "t", Timestamp::from_unix_secs(4_107_542_400)).ends_with("-21000301T000000Z.db"));
    }

    #[test]
    fn only_a_taken_snapshot_has_a_record() {
        let record = SnapshotRecord {
            location: "/snapshots/x.db".into(),
            size: 3,
            sha256: "ab".into(),
            node: "cp-1".into(),
            taken_at: Timestamp::from_unix_secs(1),
        };
        assert_eq!(SnapshotState::Taken(record.clone()).taken(), Some(&record));
        let failed = SnapshotState::Failed { reason: "x".into(), at: Timestamp::from_unix_secs(1) };
        assert_eq!(failed.taken(), None);
    }
}
