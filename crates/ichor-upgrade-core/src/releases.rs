//! The releases the engine knows: the latest patch of each Talos and Kubernetes minor line,
//! and the chain of hops from what a cluster runs to a target more than one minor ahead.
//!
//! Talos tests configuration migrations only between adjacent minor lines, and asks that a
//! cluster go through the latest patch of each minor line between (`upgrading-talos`);
//! Kubernetes upgrades its control plane one minor at a time. So a target two minors ahead
//! is a chain: each hop the latest known patch of the next minor line, the last the target
//! itself, each hop a full rollout verified before the next begins.
//!
//! The latest patches are data: [`BUILT_IN_TALOS`] and [`BUILT_IN_KUBERNETES`] as the
//! project recorded them, and what a person adds on a cluster (`TalosCluster
//! spec.releases`), where a later patch of a minor line replaces the built-in one. A hop
//! through a minor line nobody listed is refused naming it and where to add it: never a
//! guessed version.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use crate::versions::{KubernetesVersion, Minor, TalosVersion, VersionError, VersionKind};

/// The latest patch of each Talos minor line, as the project recorded them (2026-12).
pub const BUILT_IN_TALOS: &[&str] = &["v1.9.6", "v1.10.9", "v1.11.6", "v1.12.11", "v1.13.9", "v1.14.5"];

/// The latest patch of each Kubernetes minor line, as the project recorded them (2026-12).
pub const BUILT_IN_KUBERNETES: &[&str] = &["1.31.14", "1.32.11", "1.33.7", "1.34.4", "1.35.2", "1.36.1", "1.37.2"];

/// The latest known patch of each minor line, Talos's and Kubernetes's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownReleases {
    talos: BTreeMap<Minor, TalosVersion>,
    kubernetes: BTreeMap<Minor, KubernetesVersion>,
}

static BUILT_IN: LazyLock<KnownReleases> = LazyLock::new(|| {
    KnownReleases::empty()
        .with(BUILT_IN_TALOS, BUILT_IN_KUBERNETES)
        .expect("the built-in releases parse (a unit test reads them)")
});

/// Why a chain of hops cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HopRefusal {
    /// The target is older than what a machine runs.
    #[error("{to} is older than {from}, which the cluster runs: a target is never a downgrade")]
    Downgrade {
        /// The oldest version the cluster runs.
        from: String,
        /// The target.
        to: String,
    },
    /// The target is on another major version.
    #[error("{from} -> {to} changes the major version; upgrades across major versions are not supported")]
    OtherMajor {
        /// The oldest version the cluster runs.
        from: String,
        /// The target.
        to: String,
    },
    /// A minor line between has no known patch.
    #[error(
        "{from} -> {to} goes through {line}, and no patch of {line} is known: add its latest patch to the \
         TalosCluster's spec.releases.{field} (such as {example})"
    )]
    UnknownLine {
        /// The oldest version the cluster runs.
        from: String,
        /// The target.
        to: String,
        /// The minor line, as its kind writes it (`v1.13`, `1.35`).
        line: String,
        /// `talos` or `kubernetes`.
        field: &'static str,
        /// A version of that line, to show the form.
        example: String,
    },
}

fn pre_release(kind: VersionKind, text: &str) -> VersionError {
    VersionError {
        kind,
        text: text.to_owned(),
        problem: "a pre-release is not a release a cluster goes through".to_owned(),
    }
}

impl KnownReleases {
    /// No release known.
    #[must_use]
    pub fn empty() -> Self {
        Self { talos: BTreeMap::new(), kubernetes: BTreeMap::new() }
    }

    /// The project's own: [`BUILT_IN_TALOS`] and [`BUILT_IN_KUBERNETES`].
    #[must_use]
    pub fn built_in() -> &'static Self {
        &BUILT_IN
    }

    /// These and `talos` and `kubernetes` (versions as written, such as `v1.13.10` and
    /// `1.35.3`): of each minor line, the latest patch is kept. Pre-releases are not
    /// releases a cluster goes through: they are refused.
    ///
    /// # Errors
    /// The first version that does not parse, or is a pre-release, quoting it.
    pub fn with(mut self, talos: &[impl AsRef<str>], kubernetes: &[impl AsRef<str>]) -> Result<Self, VersionError> {
        for text in talos {
            let version = TalosVersion::parse(text.as_ref())?;
            if !version.as_semver().pre.is_empty() {
                return Err(pre_release(VersionKind::Talos, text.as_ref()));
            }
            let line = version.minor_line();
            if self.talos.get(&line).is_none_or(|known| *known < version) {
                self.talos.insert(line, version);
            }
        }
        for text in kubernetes {
            let version = KubernetesVersion::parse(text.as_ref())?;
            if !version.as_semver().pre.is_empty() {
                return Err(pre_release(VersionKind::Kubernetes, text.as_ref()));
            }
            let line = version.minor_line();
            if self.kubernetes.get(&line).is_none_or(|known| *known < version) {
                self.kubernetes.insert(line, version);
            }
        }
        Ok(self)
    }

    /// The latest known patch of the Talos minor line `line`.
    #[must_use]
    pub fn latest_talos(&self, line: Minor) -> Option<&TalosVersion> {
        self.talos.get(&line)
    }

    /// The latest known patch of the Kubernetes minor line `line`.
    #[must_use]
    pub fn latest_kubernetes(&self, line: Minor) -> Option<&KubernetesVersion> {
        self.kubernetes.get(&line)
    }

    /// Whether an operation may target `target` on the way to the release set `release`:
    /// `target` is the latest known patch of an earlier minor line of the same major.
    #[must_use]
    pub fn is_talos_hop_toward(&self, target: &TalosVersion, release: &TalosVersion) -> bool {
        target.major() == release.major()
            && target.minor_line() < release.minor_line()
            && self.latest_talos(target.minor_line()) == Some(target)
    }

    /// The Talos versions to go through from `from` (the oldest a machine runs) to `to`, in
    /// order, `to` last; empty when `from` is `to`.
    ///
    /// # Errors
    /// A downgrade, another major, or a minor line between with no known patch.
    pub fn talos_hops(&self, from: &TalosVersion, to: &TalosVersion) -> Result<Vec<TalosVersion>, HopRefusal> {
        let words = || (from.to_string(), to.to_string());
        if from.major() != to.major() {
            let (from, to) = words();
            return Err(HopRefusal::OtherMajor { from, to });
        }
        if to < from {
            let (from, to) = words();
            return Err(HopRefusal::Downgrade { from, to });
        }
        if to == from {
            return Ok(Vec::new());
        }
        let mut hops = Vec::new();
        for minor in from.minor_line().minor + 1..to.minor_line().minor {
            let line = Minor { major: from.major(), minor };
            let Some(latest) = self.latest_talos(line) else {
                let (from, to) = words();
                let example = format!("{}.0", line.talos());
                return Err(HopRefusal::UnknownLine { from, to, line: line.talos(), field: "talos", example });
            };
            hops.push(latest.clone());
        }
        hops.push(to.clone());
        Ok(hops)
    }

    /// The Kubernetes versions to go through from `from` (the oldest a component or kubelet
    /// runs) to `to`, one minor line at a time, `to` last; empty when `from` is `to`.
    ///
    /// # Errors
    /// A downgrade, another major, or a minor line between with no known patch.
    pub fn kubernetes_hops(
        &self,
        from: &KubernetesVersion,
        to: &KubernetesVersion,
    ) -> Result<Vec<KubernetesVersion>, HopRefusal> {
        let words = || (from.to_string(), to.to_string());
        let (from_line, to_line) = (from.minor_line(), to.minor_line());
        if from_line.major != to_line.major {
            let (from, to) = words();
            return Err(HopRefusal::OtherMajor { from, to });
        }
        if to.core() < from.core() {
            let (from, to) = words();
            return Err(HopRefusal::Downgrade { from, to });
        }
        if to.core() == from.core() {
            return Ok(Vec::new());
        }
        let mut hops = Vec::new();
        for minor in from_line.minor + 1..to_line.minor {
            let line = Minor { major: from_line.major, minor };
            let Some(latest) = self.latest_kubernetes(line) else {
                let (from, to) = words();
                let name = format!("{}.{}", line.major, line.minor);
                let example = format!("{name}.0");
                return Err(HopRefusal::UnknownLine { from, to, line: name, field: "kubernetes", example });
            };
            hops.push(latest.clone());
        }
        hops.push(to.clone());
        Ok(hops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn talos(text: &str) -> TalosVersion {
        TalosVersion::parse(text).unwrap()
    }

    fn kube(text: &str) -> KubernetesVersion {
        KubernetesVersion::parse(text).unwrap()
    }

    #[test]
    fn the_built_in_releases_parse_one_per_line() {
        let known = KnownReleases::built_in();
        assert_eq!(known.talos.len(), BUILT_IN_TALOS.len());
        assert_eq!(known.kubernetes.len(), BUILT_IN_KUBERNETES.len());
        assert_eq!(known.latest_talos(Minor { major: 1, minor: 13 }), Some(&talos("v1.13.9")));
    }

    #[test]
    fn a_target_two_minors_ahead_goes_through_the_latest_patch_between() {
        let known = KnownReleases::built_in();
        assert_eq!(
            known.talos_hops(&talos("v1.12.5"), &talos("v1.14.3")).unwrap(),
            [talos("v1.13.9"), talos("v1.14.3")]
        );
        assert_eq!(
            known.talos_hops(&talos("v1.11.2"), &talos("v1.14.3")).unwrap(),
            [talos("v1.12.11"), talos("v1.13.9"), talos("v1.14.3")]
        );
        // One minor ahead, or a patch: the target alone; on it: nothing.
        assert_eq!(known.talos_hops(&talos("v1.13.0"), &talos("v1.14.3")).unwrap(), [talos("v1.14.3")]);
        assert_eq!(known.talos_hops(&talos("v1.14.2"), &talos("v1.14.3")).unwrap(), [talos("v1.14.3")]);
        assert!(known.talos_hops(&talos("v1.14.3"), &talos("v1.14.3")).unwrap().is_empty());
    }

    #[test]
    fn a_person_adds_a_later_patch_and_it_replaces_the_built_in_one() {
        let known = KnownReleases::built_in().clone().with(&["v1.13.10", "v1.13.2"], &["1.35.3"]).unwrap();
        assert_eq!(known.talos_hops(&talos("v1.12.5"), &talos("v1.14.3")).unwrap()[0], talos("v1.13.10"));
        assert_eq!(known.latest_kubernetes(Minor { major: 1, minor: 35 }), Some(&kube("1.35.3")));
        let refused = KnownReleases::empty().with(&["v1.14.0-beta.1"], &[] as &[&str]).unwrap_err();
        assert!(refused.to_string().contains("v1.14.0-beta.1"), "{refused}");
        let refused = KnownReleases::empty().with(&["banana"], &[] as &[&str]).unwrap_err();
        assert!(refused.to_string().contains("banana"), "{refused}");
    }

    #[test]
    fn a_line_nobody_listed_is_refused_naming_it_and_where_to_add_it() {
        let refusal = KnownReleases::empty().talos_hops(&talos("v1.12.5"), &talos("v1.14.3")).unwrap_err();
        let text = refusal.to_string();
        assert!(text.contains("v1.13") && text.contains("spec.releases.talos"), "{text}");
        let refusal = KnownReleases::empty().kubernetes_hops(&kube("1.34.1"), &kube("1.36.0")).unwrap_err();
        assert!(refusal.to_string().contains("1.35") && refusal.to_string().contains("spec.releases.kubernetes"));
    }

    #[test]
    fn a_downgrade_or_another_major_is_no_chain() {
        let known = KnownReleases::built_in();
        assert!(matches!(known.talos_hops(&talos("v1.14.3"), &talos("v1.13.9")), Err(HopRefusal::Downgrade { .. })));
        assert!(matches!(known.talos_hops(&talos("v1.14.3"), &talos("v2.0.0")), Err(HopRefusal::OtherMajor { .. })));
        assert!(matches!(known.kubernetes_hops(&kube("1.35.0"), &kube("1.34.4")), Err(HopRefusal::Downgrade { .. })));
    }

    #[test]
    fn kubernetes_goes_one_minor_at_a_time() {
        let known = KnownReleases::built_in();
        assert_eq!(
            known.kubernetes_hops(&kube("1.33.4"), &kube("1.36.0")).unwrap(),
            [kube("1.34.4"), kube("1.35.2"), kube("1.36.0")]
        );
        assert_eq!(known.kubernetes_hops(&kube("1.35.0"), &kube("1.36.0")).unwrap(), [kube("1.36.0")]);
    }

    #[test]
    fn a_hop_toward_the_release_set_is_the_latest_patch_of_an_earlier_line() {
        let known = KnownReleases::built_in();
        let release = talos("v1.14.3");
        assert!(known.is_talos_hop_toward(&talos("v1.13.9"), &release));
        assert!(!known.is_talos_hop_toward(&talos("v1.13.8"), &release), "not the latest patch");
        assert!(!known.is_talos_hop_toward(&talos("v1.14.5"), &release), "the release's own line");
        assert!(!known.is_talos_hop_toward(&talos("v1.13.9"), &talos("v1.13.9")));
    }
}
