//! The checks behind the fuzz targets of `fuzz/`, one function per target. The targets call
//! them with libFuzzer's input; `tests/replay.rs` calls them with every committed corpus
//! entry, so CI replays the corpora with no fuzzer. Each panics on a broken property.
//!
//! # What this crate must not do
//! Depend on anything with IO or async (no tonic, no kube): a fuzz build is a release
//! build of everything it depends on.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod rollout;
mod step;

use ichor_talosconfig::{Overrides, parse};
use ichor_upgrade_core::upgrade_marker::UpgradeMarker;
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion, check_kubernetes_pairing, check_upgrade_path};

pub use rollout::rollout;
pub use step::step;

/// Version parsing: never a panic; whatever parses prints back to a text that parses to the
/// same version; the path rule and the pairing never panic on parsed versions.
pub fn versions(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (left, right) = text.split_once('\n').unwrap_or((text, text));
    let spec = TalosVersion::parse(left);
    if let Ok(v) = &spec {
        assert_eq!(TalosVersion::parse(&v.to_string()).as_ref(), Ok(v));
        assert_eq!(TalosVersion::from_os_image(&v.os_image()).as_ref(), Ok(v));
    }
    if let Ok(v) = TalosVersion::from_os_image(left) {
        assert_eq!(TalosVersion::from_os_image(&v.os_image()), Ok(v));
    }
    if let Ok(k) = KubernetesVersion::parse(right) {
        assert_eq!(KubernetesVersion::parse(&k.to_string()).as_ref(), Ok(&k));
        if let Ok(v) = &spec {
            let _ = check_kubernetes_pairing(v, &k);
        }
    }
    if let (Ok(from), Ok(to)) = (spec, TalosVersion::parse(right)) {
        let _ = check_upgrade_path(&from, &to);
    }
}

/// The `TalosUpgrade` marker: never a panic; whatever parses formats back to the same text
/// and parses to the same value; whatever is formatted parses back to itself.
pub fn marker(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(marker) = UpgradeMarker::parse(text)
    {
        assert_eq!(marker.to_string(), text, "a parsed marker formats to its own text");
        assert_eq!(UpgradeMarker::parse(&marker.to_string()), Ok(marker));
    }
    let mut u = arbitrary::Unstructured::new(data);
    let (Ok(major), Ok(minor), Ok(patch), Ok(boot), Ok(deadline)) = (
        u.int_in_range(0u64..=3),
        u.int_in_range(0u64..=40),
        u.int_in_range(0u64..=99),
        u.arbitrary::<String>(),
        u.arbitrary::<i64>(),
    ) else {
        return;
    };
    let Ok(target) = TalosVersion::parse(&format!("v{major}.{minor}.{patch}")) else { return };
    if !ichor_upgrade_core::upgrade_marker::is_valid_boot_id(&boot) {
        return;
    }
    // A node name only when the input holds one that a marker can carry.
    let node = u.arbitrary::<String>().ok().filter(|n| ichor_upgrade_core::upgrade_marker::is_valid_node_name(n));
    let marker = UpgradeMarker {
        target,
        boot_id: boot,
        call_deadline: ichor_upgrade_core::Timestamp::from_unix_millis(deadline.max(0)),
        node,
    };
    assert_eq!(UpgradeMarker::parse(&marker.to_string()), Ok(marker));
}

/// Talosconfig parsing: never a panic; a context that parses has an endpoint and all the
/// mutual-TLS material.
pub fn talosconfig(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(context) = parse(text, &Overrides::default()) {
        assert!(!context.endpoints.is_empty());
        assert!(!context.ca_pem.is_empty() && !context.crt_pem.is_empty() && !context.key_pem.is_empty());
    }
}
