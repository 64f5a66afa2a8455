//! The message of the `TalosUpgrade` condition: what a restarted controller needs to know
//! about an Upgrade call it (or its predecessor) made.
//!
//! Format, one line, fields in this order and nothing else:
//!
//! ```text
//! talos-upgrade/v1 target=v1.14.4 boot-id=5f1d3a2c-8a0e-4b53-9d55-0b4c9e7f2a61 call-deadline-ms=1764412800000 node=worker-7
//! ```
//!
//! - `target`: the Talos version the call asked for;
//! - `boot-id`: the Node's `status.nodeInfo.bootID` read just before the call;
//! - `call-deadline-ms`: when the call's own bound ends (Unix milliseconds). gRPC carries the
//!   deadline to the node, so after it no call made under this marker can still be
//!   acknowledged;
//! - `node` (optional; markers written before it existed lack it): the Kubernetes node
//!   name read before the call. While the machine reboots, Talos cannot be asked for it, so
//!   the name recorded here is used meanwhile.
//!
//! Parsing is strict: a message that is not exactly this shape is an error, never a guess.

use std::fmt;

use crate::time::Timestamp;
use crate::versions::TalosVersion;

/// The condition type of the Upgrade call's marker.
pub const TALOS_UPGRADE: &str = "TalosUpgrade";

/// Condition reasons of [`TALOS_UPGRADE`].
pub mod reason {
    /// `Unknown`: written just before the call; the call may or may not have been made.
    pub const UPGRADE_INTENT: &str = "UpgradeIntent";
    /// `True`: the node acknowledged the call.
    pub const UPGRADE_REQUESTED: &str = "UpgradeRequested";
    /// `False`: the machine was verified on the target; no upgrade in flight.
    pub const CONVERGED: &str = "Converged";
    /// `False`: the node refused the call (an answered error); nothing was started.
    pub const UPGRADE_REFUSED: &str = "UpgradeRefused";
    /// `False`: a person resumed the operation; the failed attempt is closed.
    pub const RETRY: &str = "Retry";
    /// `False`: the intent's deadline passed with no sign of the call on the node; it can
    /// no longer be acknowledged.
    pub const INTENT_VOID: &str = "IntentVoid";
}

const PREFIX: &str = "talos-upgrade/v1";

/// What the `TalosUpgrade` condition records about a call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpgradeMarker {
    /// The version the call asked for.
    pub target: TalosVersion,
    /// The node's boot ID read just before the call.
    pub boot_id: String,
    /// When the call's bound ends.
    pub call_deadline: Timestamp,
    /// The node name read before the call, if recorded.
    pub node: Option<String>,
}

/// A `TalosUpgrade` message that is not a marker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "TalosUpgrade message {text:?} is not a marker ({PREFIX} target=... boot-id=... call-deadline-ms=...): {problem}"
)]
pub struct MarkerError {
    /// The message as found.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Whether a boot ID can be written into a marker and read back: 1 to 64 ASCII letters,
/// digits or dashes (kubelet reports the kernel's UUID).
#[must_use]
pub fn is_valid_boot_id(boot_id: &str) -> bool {
    (1..=64).contains(&boot_id.len()) && boot_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Whether a node name can be written into a marker and read back: a Kubernetes node name
/// (a DNS subdomain: 1 to 253 lowercase letters, digits, dashes and dots, starting and
/// ending with a letter or digit).
#[must_use]
pub fn is_valid_node_name(name: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (1..=253).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && edge(name.as_bytes().first())
        && edge(name.as_bytes().last())
}

/// A marker read in place from a message, without copying it (the step reads one on every
/// observation of a machine in flight).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerRef<'a> {
    /// The version the call asked for.
    pub target: TalosVersion,
    /// The node's boot ID read just before the call.
    pub boot_id: &'a str,
    /// When the call's bound ends.
    pub call_deadline: Timestamp,
    /// The node name read before the call, if recorded.
    pub node: Option<&'a str>,
}

impl MarkerRef<'_> {
    /// An owned copy.
    #[must_use]
    pub fn to_marker(&self) -> UpgradeMarker {
        UpgradeMarker {
            target: self.target.clone(),
            boot_id: self.boot_id.to_owned(),
            call_deadline: self.call_deadline,
            node: self.node.map(str::to_owned),
        }
    }
}

impl UpgradeMarker {
    /// Parses a `TalosUpgrade` message.
    ///
    /// # Errors
    /// A [`MarkerError`] quoting the text, for anything but the exact format.
    pub fn parse(text: &str) -> Result<Self, MarkerError> {
        MarkerRef::parse(text).map(|m| m.to_marker())
    }
}

impl<'a> MarkerRef<'a> {
    /// Parses a `TalosUpgrade` message in place.
    ///
    /// # Errors
    /// A [`MarkerError`] quoting the text, for anything but the exact format.
    pub fn parse(text: &'a str) -> Result<Self, MarkerError> {
        let fail = |problem: &str| MarkerError { text: text.to_owned(), problem: problem.to_owned() };
        let mut fields = text.split(' ');
        if fields.next() != Some(PREFIX) {
            return Err(fail("it does not start with the format tag"));
        }
        let mut field = |key: &str| -> Result<&str, MarkerError> {
            let Some(field) = fields.next() else { return Err(fail(&format!("{key} is missing"))) };
            field
                .strip_prefix(key)
                .and_then(|rest| rest.strip_prefix('='))
                .ok_or_else(|| fail(&format!("expected {key}=")))
        };
        let target_text = field("target")?;
        let target = TalosVersion::parse(target_text).map_err(|e| fail(&e.to_string()))?;
        if target.to_string() != target_text {
            return Err(fail("target is not written as vMAJOR.MINOR.PATCH"));
        }
        let boot_id = field("boot-id")?;
        if !is_valid_boot_id(boot_id) {
            return Err(fail("boot-id is not 1 to 64 letters, digits or dashes"));
        }
        let deadline_text = field("call-deadline-ms")?;
        if deadline_text.is_empty() || !deadline_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(fail("call-deadline-ms is not a whole number"));
        }
        if deadline_text.len() > 1 && deadline_text.starts_with('0') {
            return Err(fail("call-deadline-ms has leading zeros"));
        }
        let deadline = deadline_text.parse::<i64>().map_err(|_| fail("call-deadline-ms is out of range"))?;
        let node = match fields.next() {
            None => None,
            Some(field) => {
                let name = field.strip_prefix("node=").ok_or_else(|| fail("expected node= after call-deadline-ms"))?;
                if !is_valid_node_name(name) {
                    return Err(fail("node is not a Kubernetes node name"));
                }
                Some(name)
            }
        };
        if fields.next().is_some() {
            return Err(fail("there is text after the last field"));
        }
        Ok(Self { target, boot_id, call_deadline: Timestamp::from_unix_millis(deadline), node })
    }
}

impl fmt::Display for UpgradeMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX} target={} boot-id={} call-deadline-ms={}",
            self.target,
            self.boot_id,
            self.call_deadline.unix_millis().max(0)
        )?;
        match &self.node {
            Some(node) => write!(f, " node={node}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker() -> UpgradeMarker {
        UpgradeMarker {
            target: TalosVersion::parse("v1.14.4").unwrap(),
            boot_id: "5f1d3a2c-8a0e-4b53-9d55-0b4c9e7f2a61".into(),
            call_deadline: Timestamp::from_unix_millis(1_764_412_800_000),
            node: Some("worker-7.example.com".into()),
        }
    }

    #[test]
    fn a_marker_round_trips() {
        let text = marker().to_string();
        assert_eq!(
            text,
            "talos-upgrade/v1 target=v1.14.4 boot-id=5f1d3a2c-8a0e-4b53-9d55-0b4c9e7f2a61 call-deadline-ms=1764412800000 node=worker-7.example.com"
        );
        assert_eq!(UpgradeMarker::parse(&text), Ok(marker()));
    }

    #[test]
    fn a_marker_written_before_the_node_field_still_parses() {
        let old = "talos-upgrade/v1 target=v1.14.4 boot-id=5f1d3a2c-8a0e-4b53-9d55-0b4c9e7f2a61 call-deadline-ms=1764412800000";
        let parsed = UpgradeMarker::parse(old).unwrap();
        assert_eq!(parsed, UpgradeMarker { node: None, ..marker() });
        assert_eq!(parsed.to_string(), old);
    }

    #[test]
    fn garbled_markers_are_errors_quoting_the_text() {
        let good = marker().to_string();
        let bad = [
            String::new(),
            "Upgrade request received".to_owned(),
            good.replace("talos-upgrade/v1", "talos-upgrade/v2"),
            good.replace("target=v1.14.4", "target=v1.14"),
            good.replace(" boot-id=", " bootid="),
            good.replace("5f1d3a2c-8a0e", "5f1d3a2c 8a0e"),
            good.replace("1764412800000", "-1"),
            good.replace("1764412800000", "99999999999999999999"),
            good.replace("1764412800000", ""),
            // Found by the marker fuzz target: accepted, then formatted differently.
            good.replace("1764412800000", "0001764412800000"),
            good.replace("target=v1.14.4", "target=1.14.4"),
            format!("{good} extra"),
            format!("{good} "),
            good.replace("node=worker-7.example.com", "node="),
            good.replace("node=worker-7.example.com", "node=Worker-7"),
            good.replace("node=worker-7.example.com", "node=-worker"),
            good.replace("node=worker-7.example.com", "nodes=worker-7"),
            good.replace(' ', "  "),
            good.replace("boot-id=5f1d3a2c-8a0e-4b53-9d55-0b4c9e7f2a61", "boot-id="),
        ];
        for text in bad {
            let err = UpgradeMarker::parse(&text).unwrap_err();
            assert_eq!(err.text, text);
            assert!(err.to_string().contains(&format!("{text:?}")));
        }
    }

    #[test]
    fn boot_ids_are_checked() {
        assert!(is_valid_boot_id("5f1d3a2c-8a0e-4b53-9d55-0b4c9e7f2a61"));
        assert!(!is_valid_boot_id(""));
        assert!(!is_valid_boot_id("a b"));
        assert!(!is_valid_boot_id(&"a".repeat(65)));
    }
}
