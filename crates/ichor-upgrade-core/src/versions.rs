//! Talos and Kubernetes versions: strict parsing, the upgrade-path rule, and the pairing of a
//! target Talos with the cluster's Kubernetes version.
//!
//! Talos versions come from two places: a spec (`v1.14.3`, pre-releases such as
//! `v1.14.0-beta.1` too) and a Node's `status.nodeInfo.osImage` (`Talos (v1.14.3)`).
//! Kubernetes versions are written `1.34.1` or `v1.34.1`. Anything else is an error that
//! quotes the text; nothing is guessed (`1.14`, `v1.14` and `Talos (banana)` are refused).

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which kind of version a text was meant to be; names the expected form in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionKind {
    /// A Talos version as written in a spec: `v1.14.3`.
    Talos,
    /// A Node's `osImage`: `Talos (v1.14.3)`.
    OsImage,
    /// A Kubernetes version: `1.34.1` or `v1.34.1`.
    Kubernetes,
}

impl VersionKind {
    fn expected(self) -> &'static str {
        match self {
            Self::Talos => "a Talos version such as v1.14.3",
            Self::OsImage => "an osImage such as \"Talos (v1.14.3)\"",
            Self::Kubernetes => "a Kubernetes version such as 1.34.1",
        }
    }
}

/// A text that is not a version of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not {}: {problem}", kind.expected())]
pub struct VersionError {
    /// What the text was meant to be.
    pub kind: VersionKind,
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

impl VersionError {
    fn new(kind: VersionKind, text: &str, problem: impl Into<String>) -> Self {
        Self { kind, text: text.to_owned(), problem: problem.into() }
    }
}

/// Parses `[v]MAJOR.MINOR.PATCH[-PRE]` with nothing around it and no build metadata.
fn parse_semver(kind: VersionKind, text: &str) -> Result<semver::Version, VersionError> {
    if text.is_empty() {
        return Err(VersionError::new(kind, text, "it is empty"));
    }
    let bare = text.strip_prefix('v').unwrap_or(text);
    if bare.contains('+') {
        return Err(VersionError::new(kind, text, "build metadata (+...) is not allowed"));
    }
    let version = semver::Version::parse(bare).map_err(|e| VersionError::new(kind, text, e.to_string()))?;
    Ok(version)
}

/// A minor release line, such as Talos `v1.13` or Kubernetes `1.34`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Minor {
    /// The major version.
    pub major: u64,
    /// The minor version.
    pub minor: u64,
}

impl Minor {
    /// Formats as a Talos minor line: `v1.13`.
    #[must_use]
    pub fn talos(self) -> String {
        format!("v{}.{}", self.major, self.minor)
    }
}

/// A Talos version, such as `v1.14.3` or `v1.14.0-beta.1`. Displays with the leading `v`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TalosVersion(semver::Version);

impl TalosVersion {
    /// Parses a Talos version as written in a spec: `v1.14.3` (the `v` may be left out).
    ///
    /// # Errors
    /// Anything but `[v]MAJOR.MINOR.PATCH[-PRE]`, quoting the text.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        parse_semver(VersionKind::Talos, text).map(Self)
    }

    /// Parses a Node's `status.nodeInfo.osImage`, which Talos writes as `Talos (v1.14.3)`.
    ///
    /// # Errors
    /// Anything else, including an empty string, quoting the text.
    pub fn from_os_image(os_image: &str) -> Result<Self, VersionError> {
        let kind = VersionKind::OsImage;
        if os_image.is_empty() {
            return Err(VersionError::new(kind, os_image, "it is empty"));
        }
        let Some(inner) = os_image.strip_prefix("Talos (").and_then(|rest| rest.strip_suffix(')')) else {
            return Err(VersionError::new(kind, os_image, "it is not of the form \"Talos (vX.Y.Z)\""));
        };
        // Talos always writes the `v`; a version without it is not Talos's own text.
        if !inner.starts_with('v') {
            return Err(VersionError::new(kind, os_image, "the version lacks its leading \"v\""));
        }
        parse_semver(kind, inner).map(Self).map_err(|e| VersionError { text: os_image.to_owned(), ..e })
    }

    /// The major version.
    #[must_use]
    pub fn major(&self) -> u64 {
        self.0.major
    }

    /// The minor line this version belongs to.
    #[must_use]
    pub fn minor_line(&self) -> Minor {
        Minor { major: self.0.major, minor: self.0.minor }
    }

    /// The underlying semantic version.
    #[must_use]
    pub fn as_semver(&self) -> &semver::Version {
        &self.0
    }

    /// The `osImage` a Talos node of this version reports: `Talos (v1.14.3)`.
    #[must_use]
    pub fn os_image(&self) -> String {
        format!("Talos ({self})")
    }
}

impl PartialOrd for TalosVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TalosVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

impl fmt::Display for TalosVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl FromStr for TalosVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for TalosVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TalosVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A Kubernetes version, such as `1.34.1`. Displays without a `v`. Ordered as semver
/// orders them (a pre-release before its release).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubernetesVersion(semver::Version);

impl KubernetesVersion {
    /// Parses `1.34.1` or `v1.34.1` (pre-releases such as `1.37.0-rc.1` too).
    ///
    /// # Errors
    /// Anything else, quoting the text.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        parse_semver(VersionKind::Kubernetes, text).map(Self)
    }

    /// (major, minor, patch), the pre-release ignored, as Talos compares them.
    #[must_use]
    pub fn core(&self) -> (u64, u64, u64) {
        (self.0.major, self.0.minor, self.0.patch)
    }

    /// Its minor line, such as `1.34`.
    #[must_use]
    pub fn minor_line(&self) -> Minor {
        Minor { major: self.0.major, minor: self.0.minor }
    }

    /// As a [`semver::Version`].
    #[must_use]
    pub fn as_semver(&self) -> &semver::Version {
        &self.0
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for KubernetesVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for KubernetesVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KubernetesVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// What kind of step an allowed upgrade is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeStep {
    /// The node is already on the target: nothing to do.
    AlreadyOnTarget,
    /// Same minor line, a later patch or pre-release.
    WithinMinor,
    /// The next minor line.
    NextMinor,
}

/// Why an upgrade from one Talos version to another is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    /// The target is older than the current version.
    #[error("{from} -> {to} is a downgrade; Talos is never downgraded by an upgrade")]
    Downgrade {
        /// Current version.
        from: TalosVersion,
        /// Requested target.
        to: TalosVersion,
    },
    /// The target is on another major version.
    #[error("{from} -> {to} changes the major version ({} to {}); upgrades across major versions are not supported", from.major(), to.major())]
    OtherMajor {
        /// Current version.
        from: TalosVersion,
        /// Requested target.
        to: TalosVersion,
    },
    /// The target skips one or more minor lines.
    #[error("{}", skips_message(from, to, through, *skipped))]
    SkipsMinors {
        /// Current version.
        from: TalosVersion,
        /// Requested target.
        to: TalosVersion,
        /// The minor lines to go through, in order: all of them, or the first
        /// [`MAX_LISTED_MINORS`] when more are skipped.
        through: Vec<Minor>,
        /// How many minor lines are skipped in all.
        skipped: u64,
    },
}

/// At most this many skipped minor lines are listed in a refusal (a garbled target such as
/// `v1.13333333314.3` must not make the engine list billions).
pub const MAX_LISTED_MINORS: u64 = 8;

fn list_minors(minors: &[Minor], separator: &str) -> String {
    minors.iter().map(|m| m.talos()).collect::<Vec<_>>().join(separator)
}

fn skips_message(from: &TalosVersion, to: &TalosVersion, through: &[Minor], skipped: u64) -> String {
    let path = through.iter().map(|m| format!("{}.x", m.talos())).collect::<Vec<_>>().join(" -> ");
    if skipped == through.len() as u64 {
        format!(
            "{from} -> {to} skips {}; upgrade through the latest patch of {} first (path: {from} -> {path} -> {to})",
            list_minors(through, " and "),
            list_minors(through, ", then ")
        )
    } else {
        format!(
            "{from} -> {to} skips {skipped} minor lines; upgrade one minor line at a time, through the latest patch of each \
             (path: {from} -> {path} -> ... -> {to})"
        )
    }
}

/// The upgrade-path rule: same major; the target's minor equal to the current one or the
/// next; never a downgrade. A longer jump is refused with the minor lines to go through.
///
/// # Errors
/// A [`PathRefusal`] naming the path to take.
pub fn check_upgrade_path(from: &TalosVersion, to: &TalosVersion) -> Result<UpgradeStep, PathRefusal> {
    let refusal_from = || from.clone();
    let refusal_to = || to.clone();
    if from.major() != to.major() {
        return Err(PathRefusal::OtherMajor { from: refusal_from(), to: refusal_to() });
    }
    match from.cmp(to) {
        Ordering::Equal => return Ok(UpgradeStep::AlreadyOnTarget),
        Ordering::Greater => return Err(PathRefusal::Downgrade { from: refusal_from(), to: refusal_to() }),
        Ordering::Less => {}
    }
    let (current, target) = (from.minor_line().minor, to.minor_line().minor);
    match target - current {
        0 => Ok(UpgradeStep::WithinMinor),
        1 => Ok(UpgradeStep::NextMinor),
        gap => Err(PathRefusal::SkipsMinors {
            from: refusal_from(),
            to: refusal_to(),
            through: (current + 1..target)
                .take(MAX_LISTED_MINORS as usize)
                .map(|minor| Minor { major: from.major(), minor })
                .collect(),
            skipped: gap - 1,
        }),
    }
}

/// One row of the Talos-to-Kubernetes support table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubernetesSupport {
    /// The target Talos minor line.
    pub talos: Minor,
    /// The lowest supported Kubernetes version (inclusive).
    pub minimum: (u64, u64, u64),
    /// The ceiling (exclusive); Talos writes it as `X.Y.99`, meaning every patch of `X.Y`.
    pub ceiling: (u64, u64, u64),
}

impl KubernetesSupport {
    /// Whether `kubernetes` (pre-release ignored) is in the range.
    #[must_use]
    pub fn supports(&self, kubernetes: &KubernetesVersion) -> bool {
        let core = kubernetes.core();
        core >= self.minimum && core < self.ceiling
    }
}

impl fmt::Display for KubernetesSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (min_major, min_minor, min_patch) = self.minimum;
        let (max_major, max_minor, _) = self.ceiling;
        write!(f, "Kubernetes {min_major}.{min_minor}.{min_patch} to {max_major}.{max_minor}.x")
    }
}

const fn row(talos_minor: u64, min_minor: u64, max_minor: u64) -> KubernetesSupport {
    KubernetesSupport {
        talos: Minor { major: 1, minor: talos_minor },
        minimum: (1, min_minor, 0),
        ceiling: (1, max_minor, 99),
    }
}

/// The Talos-to-Kubernetes support table, as Talos's own compatibility data has it
/// (`pkg/machinery/compatibility/talos1*/talos1*.go`): target minor, lowest Kubernetes,
/// and the `X.Y.99` ceiling.
pub const KUBERNETES_SUPPORT: &[KubernetesSupport] = &[
    row(2, 23, 25),
    row(3, 24, 26),
    row(4, 25, 27),
    row(5, 26, 28),
    row(6, 24, 29),
    row(7, 25, 30),
    row(8, 26, 31),
    row(9, 27, 32),
    row(10, 28, 33),
    row(11, 29, 34),
    row(12, 30, 35),
    row(13, 31, 36),
    row(14, 32, 37),
    row(15, 33, 38),
];

/// The Kubernetes range a target Talos supports, if the table knows its minor line.
#[must_use]
pub fn kubernetes_support(talos: &TalosVersion) -> Option<KubernetesSupport> {
    KUBERNETES_SUPPORT.iter().copied().find(|row| row.talos == talos.minor_line())
}

/// Why a Kubernetes version cannot run with a target Talos.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairingRefusal {
    /// The support table has no row for the target's minor line.
    #[error(
        "Talos {} is not in the Kubernetes support table (it knows {} to {}), so Kubernetes {kubernetes} cannot be paired with it",
        talos.talos(), first_known().talos(), last_known().talos()
    )]
    UnknownTalos {
        /// The target's minor line.
        talos: Minor,
        /// The Kubernetes version to pair.
        kubernetes: KubernetesVersion,
    },
    /// The Kubernetes version is outside the target's range.
    #[error("Kubernetes {kubernetes} is not supported by Talos {}: it supports {support}", support.talos.talos())]
    OutOfRange {
        /// The Kubernetes version to pair.
        kubernetes: KubernetesVersion,
        /// The target's supported range.
        support: KubernetesSupport,
    },
}

fn first_known() -> Minor {
    KUBERNETES_SUPPORT[0].talos
}

fn last_known() -> Minor {
    KUBERNETES_SUPPORT[KUBERNETES_SUPPORT.len() - 1].talos
}

/// The newest Talos minor line this engine knows (the last row of
/// [`KUBERNETES_SUPPORT`]).
#[must_use]
pub fn newest_known_talos() -> Minor {
    last_known()
}

/// Whether `target` is on a minor line newer than any this engine knows: a release it has
/// no data for (its Kubernetes range, its upgrade path), or no release at all (`v1.99.0`).
#[must_use]
pub fn is_unknown_release(target: &TalosVersion) -> bool {
    target.minor_line() > last_known()
}

/// Checks that the cluster's Kubernetes version runs on the target Talos.
///
/// # Errors
/// A [`PairingRefusal`] naming the supported range, or saying that the table does not know
/// the target (never a guess).
pub fn check_kubernetes_pairing(
    target: &TalosVersion,
    kubernetes: &KubernetesVersion,
) -> Result<KubernetesSupport, PairingRefusal> {
    let Some(support) = kubernetes_support(target) else {
        return Err(PairingRefusal::UnknownTalos { talos: target.minor_line(), kubernetes: kubernetes.clone() });
    };
    if support.supports(kubernetes) {
        Ok(support)
    } else {
        Err(PairingRefusal::OutOfRange { kubernetes: kubernetes.clone(), support })
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
    fn talos_spec_versions_parse_with_or_without_v_and_display_with_v() {
        assert_eq!(talos("v1.14.3").to_string(), "v1.14.3");
        assert_eq!(talos("1.14.3").to_string(), "v1.14.3");
        assert_eq!(talos("v1.14.0-beta.1").to_string(), "v1.14.0-beta.1");
        assert_eq!(talos("v1.14.3").minor_line(), Minor { major: 1, minor: 14 });
    }

    #[test]
    fn malformed_talos_versions_are_errors_quoting_the_text() {
        for bad in [
            "",
            "1.14",
            "v1.14",
            "banana",
            "V1.14.3",
            " v1.14.3",
            "v1.14.3 ",
            "v01.14.3",
            "vv1.14.3",
            "v1.14.3+dirty",
            "v1.14.x",
        ] {
            let err = TalosVersion::parse(bad).unwrap_err();
            assert_eq!(err.kind, VersionKind::Talos, "{bad:?}");
            assert_eq!(err.text, bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn os_image_parses_only_the_talos_form() {
        assert_eq!(TalosVersion::from_os_image("Talos (v1.14.3)").unwrap(), talos("v1.14.3"));
        assert_eq!(TalosVersion::from_os_image("Talos (v1.15.0-alpha.2)").unwrap(), talos("v1.15.0-alpha.2"));
        assert_eq!(talos("v1.14.3").os_image(), "Talos (v1.14.3)");
    }

    #[test]
    fn bad_os_images_are_errors_naming_the_text() {
        for bad in [
            "",
            "Talos (banana)",
            "Talos (v1.14)",
            "Talos v1.14.3",
            "Ubuntu 24.04 LTS",
            "talos (v1.14.3)",
            "Talos (v1.14.3) ",
            "Talos ()",
            "Talos (1.14.4)",
            "Talos (vv1.14.4)",
        ] {
            let err = TalosVersion::from_os_image(bad).unwrap_err();
            assert_eq!(err.kind, VersionKind::OsImage, "{bad:?}");
            assert_eq!(err.text, bad);
        }
        let empty = TalosVersion::from_os_image("").unwrap_err();
        assert!(empty.to_string().contains("empty"), "{empty}");
    }

    #[test]
    fn kubernetes_versions_parse_with_or_without_v() {
        assert_eq!(kube("1.34.1").to_string(), "1.34.1");
        assert_eq!(kube("v1.34.1").to_string(), "1.34.1");
        assert_eq!(kube("1.37.0-rc.1").to_string(), "1.37.0-rc.1");
        for bad in ["1.34", "v1.34", "", "latest", "1.34.1.2"] {
            assert_eq!(KubernetesVersion::parse(bad).unwrap_err().kind, VersionKind::Kubernetes, "{bad:?}");
        }
    }

    #[test]
    fn versions_round_trip_through_serde() {
        let v: TalosVersion = serde_json_like(&talos("v1.14.0-rc.1"));
        assert_eq!(v, talos("v1.14.0-rc.1"));
    }

    /// Round trip through serde's string form without a JSON dependency.
    fn serde_json_like(v: &TalosVersion) -> TalosVersion {
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        let text = v.to_string();
        let de: StrDeserializer<'_, Error> = text.as_str().into_deserializer();
        TalosVersion::deserialize(de).unwrap()
    }

    #[test]
    fn patch_and_next_minor_are_allowed() {
        assert_eq!(check_upgrade_path(&talos("v1.14.3"), &talos("v1.14.4")), Ok(UpgradeStep::WithinMinor));
        assert_eq!(check_upgrade_path(&talos("v1.13.6"), &talos("v1.14.0")), Ok(UpgradeStep::NextMinor));
        assert_eq!(check_upgrade_path(&talos("v1.14.0-beta.1"), &talos("v1.14.0")), Ok(UpgradeStep::WithinMinor));
        assert_eq!(check_upgrade_path(&talos("v1.14.3"), &talos("v1.14.3")), Ok(UpgradeStep::AlreadyOnTarget));
    }

    #[test]
    fn skipping_minors_names_each_intermediate_minor_in_order() {
        let refusal = check_upgrade_path(&talos("v1.11.2"), &talos("v1.14.3")).unwrap_err();
        assert_eq!(
            refusal,
            PathRefusal::SkipsMinors {
                from: talos("v1.11.2"),
                to: talos("v1.14.3"),
                through: vec![Minor { major: 1, minor: 12 }, Minor { major: 1, minor: 13 }],
                skipped: 2,
            }
        );
        assert_eq!(
            refusal.to_string(),
            "v1.11.2 -> v1.14.3 skips v1.12 and v1.13; upgrade through the latest patch of v1.12, then v1.13 first \
             (path: v1.11.2 -> v1.12.x -> v1.13.x -> v1.14.3)"
        );
    }

    #[test]
    fn a_huge_minor_is_refused_without_listing_every_minor_between() {
        // Found by the versions fuzz target: listing them all asked for 213 GB.
        let refusal = check_upgrade_path(&talos("v1.12.5"), &talos("v1.13333333314.3")).unwrap_err();
        let PathRefusal::SkipsMinors { through, skipped, .. } = &refusal else { panic!("{refusal:?}") };
        assert_eq!(*skipped, 13_333_333_301);
        assert_eq!(through.len() as u64, MAX_LISTED_MINORS);
        assert_eq!(through[0], Minor { major: 1, minor: 13 });
        let text = refusal.to_string();
        assert!(text.contains("skips 13333333301 minor lines") && text.contains("v1.13.x"), "{text}");
        assert!(text.len() < 400, "{text}");
    }

    #[test]
    fn downgrades_are_refused_including_to_a_pre_release() {
        assert!(matches!(check_upgrade_path(&talos("v1.14.4"), &talos("v1.14.3")), Err(PathRefusal::Downgrade { .. })));
        assert!(matches!(
            check_upgrade_path(&talos("v1.14.0"), &talos("v1.14.0-rc.1")),
            Err(PathRefusal::Downgrade { .. })
        ));
        assert!(matches!(check_upgrade_path(&talos("v1.14.0"), &talos("v1.13.9")), Err(PathRefusal::Downgrade { .. })));
    }

    #[test]
    fn another_major_is_refused() {
        let refusal = check_upgrade_path(&talos("v1.14.3"), &talos("v2.0.0")).unwrap_err();
        assert!(matches!(refusal, PathRefusal::OtherMajor { .. }));
        assert!(refusal.to_string().contains("major"), "{refusal}");
    }

    #[test]
    fn support_table_is_ordered_and_matches_the_reference_rows() {
        for pair in KUBERNETES_SUPPORT.windows(2) {
            assert_eq!(pair[1].talos.minor, pair[0].talos.minor + 1);
        }
        let v114 = kubernetes_support(&talos("v1.14.3")).unwrap();
        assert_eq!((v114.minimum, v114.ceiling), ((1, 32, 0), (1, 37, 99)));
        assert_eq!(v114.to_string(), "Kubernetes 1.32.0 to 1.37.x");
        let v16 = kubernetes_support(&talos("v1.6.0")).unwrap();
        assert_eq!(v16.minimum, (1, 24, 0), "talos 1.6 really does go back to 1.24");
    }

    #[test]
    fn pairing_checks_the_range_ignoring_pre_releases() {
        assert!(check_kubernetes_pairing(&talos("v1.14.4"), &kube("1.34.1")).is_ok());
        assert!(check_kubernetes_pairing(&talos("v1.14.4"), &kube("1.37.98")).is_ok());
        assert!(check_kubernetes_pairing(&talos("v1.14.4"), &kube("1.37.0-rc.1")).is_ok());
        assert!(check_kubernetes_pairing(&talos("v1.14.4"), &kube("1.32.0")).is_ok());
        let refusal = check_kubernetes_pairing(&talos("v1.14.4"), &kube("1.31.9")).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "Kubernetes 1.31.9 is not supported by Talos v1.14: it supports Kubernetes 1.32.0 to 1.37.x"
        );
        assert!(matches!(
            check_kubernetes_pairing(&talos("v1.14.4"), &kube("1.38.0")),
            Err(PairingRefusal::OutOfRange { .. })
        ));
    }

    #[test]
    fn a_target_unknown_to_the_table_is_refused_for_pairing() {
        let refusal = check_kubernetes_pairing(&talos("v1.16.0"), &kube("1.34.1")).unwrap_err();
        assert!(matches!(refusal, PairingRefusal::UnknownTalos { .. }));
        assert_eq!(
            refusal.to_string(),
            "Talos v1.16 is not in the Kubernetes support table (it knows v1.2 to v1.15), so Kubernetes 1.34.1 cannot be paired with it"
        );
        assert!(check_kubernetes_pairing(&talos("v1.1.0"), &kube("1.23.0")).is_err());
    }
}
