//! What a simulated cluster looks like and which faults it has.

use std::ops::RangeInclusive;
use std::time::Duration;

use ichor_upgrade_core::versions::TalosVersion;

/// A fault the simulated world can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// One node falls back to its old version after its upgrade reboot.
    AbFallback,
    /// The controller is killed at random points and restarted with nothing in memory.
    ControllerCrash,
    /// The Kubernetes and Talos APIs refuse calls for a while.
    ApiOutage,
    /// One node's replicas never move.
    EvacuationStuck,
    /// Reboot times have a long tail.
    SlowReboot,
    /// A PodDisruptionBudget blocks evictions for a while: a removal's drain waits, and so
    /// does Talos's own drain at the start of an upgrade (for at most its 5 minutes).
    PdbBlocked,
    /// A control plane's etcd member rejoins late, as a learner first.
    EtcdLag,
    /// A worker is NotReady before the rollout starts and recovers later.
    NotReady,
    /// One node's first Upgrade call breaks off on the wire before it reaches the node: the
    /// engine is left with an unconfirmed intent, void once its deadline passes.
    CallLost,
    /// A control plane's Node goes NotReady for a while during the rollout, for reasons of
    /// its own (a kubelet or network hiccup), not because of the upgrade: one not upgraded
    /// yet, so that the other control planes' calls must wait for it.
    ControlPlaneNotReady,
    /// Every etcd snapshot stream breaks off half way: an operation that requires one
    /// pauses before any control plane (and so before any Upgrade call).
    SnapshotFails,
    /// A PodDisruptionBudget `payments/ledger` at zero disruptions covers `ledger` pods on
    /// a quarter of the workers (at least one) and is released 10 to 30 minutes in: the
    /// preflight gate keeps those machines waiting, naming it, so no drain stalls on it.
    PdbZero,
    /// A Deployment `reports/exporter` with one replica runs on one worker; it is scaled
    /// to two 10 to 30 minutes in (as an operator answering the Warning would): until
    /// then the preflight gate keeps that machine waiting.
    SingleReplica,
    /// A person holds a machine at a drawn instant of its upgrade's start (within a minute
    /// of its first installer pull, while the pull, the install job or the Upgrade call is
    /// under way) and lifts the hold 2 to 10 minutes later: whatever runs for the machine
    /// must stop before its next side effect unless the machine is past its call. In a
    /// Kubernetes upgrade (with the two below): at a drawn read of a started machine's
    /// configuration, then within a minute, in either stage.
    HoldDuringInstall,
    /// The operation pauses at a drawn instant of a machine's upgrade start (within a
    /// minute of its first installer pull): that machine's failure is recorded in the
    /// operation's status, as a pass of the same controller would record it. Nobody
    /// resumes: the run ends paused, and the failed machine is never touched again.
    PauseDuringInstall,
    /// A person pauses the operation (`ichor.dev/pause`) at a drawn instant of a
    /// machine's upgrade start, as [`Fault::HoldDuringInstall`] draws it, and removes the
    /// annotation 2 to 10 minutes later: nothing new may begin meanwhile (a machine not
    /// past its call stops before its next side effect), and the rollout then completes.
    PauseRequestedDuringInstall,
    /// A person deletes the operation at a drawn instant of a machine's upgrade start:
    /// the operation winds down (machines not past their call stopped, the others finished)
    /// and its finalizer is removed.
    DeleteDuringInstall,
    /// A Kubernetes upgrade: one control plane's component (kube-apiserver,
    /// kube-controller-manager or kube-scheduler, drawn) crash-loops on the version it is
    /// changed to.
    ComponentCrashloop,
    /// A Kubernetes upgrade: the API servers report requests to an API the next minor
    /// removes (`widgets.v1beta1.widgets.sim.ichor.dev`, the simulator's own), 3 of them.
    RemovedApiInUse,
    /// A Kubernetes upgrade: one node's kubelet never comes back after its apply.
    KubeletNotBack,
    /// One control plane's component (kube-apiserver, kube-controller-manager or
    /// kube-scheduler, drawn) is not Ready (its container restarting) for 1 to 4 minutes,
    /// 1 to 20 minutes in, for reasons of its own, its Node Ready all along: no other control plane's component
    /// may change meanwhile (a Talos upgrade's reboot takes all three of a control plane
    /// down, a Kubernetes upgrade's apply one), or two API servers would be down at once.
    ComponentDown,
    /// A volume per worker (three workers or more), its three replicas on that worker and
    /// the next two: a replica is down while its node is not Ready and rebuilds for 3 to 8
    /// minutes once it is back, so a volume stays degraded long after its node's reboot.
    /// A health gate reads the volumes (`longhorn.io/v1beta2` `Volume`,
    /// `status.robustness`).
    StorageDegraded,
}

impl Fault {
    /// Every fault, in the order the command line lists them.
    pub const ALL: [Self; 22] = [
        Self::AbFallback,
        Self::ControllerCrash,
        Self::ApiOutage,
        Self::EvacuationStuck,
        Self::SlowReboot,
        Self::PdbBlocked,
        Self::EtcdLag,
        Self::NotReady,
        Self::CallLost,
        Self::ControlPlaneNotReady,
        Self::SnapshotFails,
        Self::PdbZero,
        Self::SingleReplica,
        Self::HoldDuringInstall,
        Self::PauseDuringInstall,
        Self::PauseRequestedDuringInstall,
        Self::DeleteDuringInstall,
        Self::ComponentCrashloop,
        Self::RemovedApiInUse,
        Self::KubeletNotBack,
        Self::ComponentDown,
        Self::StorageDegraded,
    ];

    /// The name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::AbFallback => "ab-fallback",
            Self::ControllerCrash => "controller-crash",
            Self::ApiOutage => "api-outage",
            Self::EvacuationStuck => "evacuation-stuck",
            Self::SlowReboot => "slow-reboot",
            Self::PdbBlocked => "pdb-blocked",
            Self::EtcdLag => "etcd-lag",
            Self::NotReady => "not-ready",
            Self::CallLost => "call-lost",
            Self::ControlPlaneNotReady => "control-plane-not-ready",
            Self::SnapshotFails => "snapshot-fails",
            Self::PdbZero => "pdb-zero",
            Self::SingleReplica => "single-replica",
            Self::HoldDuringInstall => "hold-during-install",
            Self::PauseDuringInstall => "pause-during-install",
            Self::PauseRequestedDuringInstall => "pause-requested-during-install",
            Self::DeleteDuringInstall => "delete-during-install",
            Self::ComponentCrashloop => "component-crashloop",
            Self::RemovedApiInUse => "removed-api-in-use",
            Self::KubeletNotBack => "kubelet-not-back",
            Self::ComponentDown => "component-down",
            Self::StorageDegraded => "storage-degraded",
        }
    }

    /// The fault of that name.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// Durations the world draws from, in whole seconds, uniformly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durations {
    /// Talos's drain at the start of an upgrade: evicting the node's pods and waiting for
    /// them to go (each has its termination grace period; Talos waits up to a minute per
    /// pod). A PodDisruptionBudget that refuses evictions makes it longer (`pdb-blocked`).
    pub drain: RangeInclusive<u64>,
    /// From the drain's end to the reboot: the installer writing the new boot slot. The
    /// image pull before it is not drawn: it is the registry's bandwidth shared by the
    /// pulls under way ([`Registry`]).
    pub install: RangeInclusive<u64>,
    /// The reboot itself: the node and its Talos API are gone.
    pub reboot: RangeInclusive<u64>,
    /// From boot to the Node being Ready.
    pub ready: RangeInclusive<u64>,
    /// Moving one replica off a node.
    pub replica_move: RangeInclusive<u64>,
}

impl Default for Durations {
    fn default() -> Self {
        Self { drain: 5..=30, install: 30..=60, reboot: 60..=150, ready: 15..=45, replica_move: 5..=20 }
    }
}

/// Where the installer image comes from, and how fast. A legacy Upgrade call pulls the
/// image before it answers (facts sheet §4.1), so the pull is on the call's critical path;
/// concurrent pulls share the registry's (or the site's uplink's) bandwidth equally, each
/// capped by its own node's share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// The installer image's compressed size: 100 MB, the order of a metal installer from
    /// the Image Factory (a kernel, an initramfs and the installer binary). Measure your
    /// own with `crane manifest`.
    pub image_bytes: u64,
    /// The fastest one node pulls, alone: 50 MB/s, a 1 Gbit/s link less the registry's
    /// and containerd's own overheads (decompression, layer checks).
    pub node_bytes_per_s: u64,
    /// What every pull under way shares: 125 MB/s, a site's 1 Gbit/s uplink to the Image
    /// Factory or the egress of a small pull-through mirror.
    pub shared_bytes_per_s: u64,
}

impl Default for Registry {
    fn default() -> Self {
        Self { image_bytes: 100_000_000, node_bytes_per_s: 50_000_000, shared_bytes_per_s: 125_000_000 }
    }
}

impl Registry {
    /// How long one pull takes alone, at its node's full speed.
    #[must_use]
    pub fn uncontended(&self) -> Duration {
        Duration::from_secs_f64(self.image_bytes as f64 / self.node_bytes_per_s.max(1) as f64)
    }

    /// Each pull's rate, in bytes per second, while `pulls` are under way.
    #[must_use]
    pub fn rate(&self, pulls: usize) -> f64 {
        (self.node_bytes_per_s as f64).min(self.shared_bytes_per_s as f64 / pulls.max(1) as f64).max(1.0)
    }
}

/// How the controller learns that something changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// As a kube-rs controller does: watch events on the kinds it watches (Nodes, its own
    /// custom resources, Longhorn's replicas), each delivered after a drawn delay, and its
    /// own requeue times. Nothing else wakes it.
    Watch,
    /// The old model, kept only for comparison: the controller is woken at the exact
    /// instant anything in the world changes, with no API latency, and the Node shows
    /// every change at once. No real controller can do this.
    Oracle,
}

impl Wake {
    /// The name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Watch => "watch",
            Self::Oracle => "oracle",
        }
    }
}

/// What makes the simulated cluster behave like a real one rather than an oracle: the
/// time calls take, how late watches report, and what the Node object shows when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Realism {
    /// How the controller is woken.
    pub wake: Wake,
    /// The time an API call takes, in milliseconds, drawn uniformly: a write to the API
    /// server, a read that is not served from a watch cache (the Lease, storage replicas,
    /// pods), a Talos API call to a node that answers. 5-50 ms: a round trip inside a
    /// data centre plus an etcd write (etcd's own guidance puts a healthy commit under
    /// 25 ms at the 99th percentile).
    pub api_latency_ms: RangeInclusive<u64>,
    /// The delay between a change and its watch event reaching the controller, in
    /// milliseconds, drawn per event. 200-2,000 ms: the API server's watch cache and
    /// fan-out, the informer's queue, and the controller's own debounce.
    pub watch_delay_ms: RangeInclusive<u64>,
    /// How long a Talos API call to a node that is down takes to fail: a machine in its
    /// reboot does not refuse connections, its address does not answer at all, and the
    /// call fails on its dial timeout. 15 s.
    pub unreachable_timeout: Duration,
    /// How long after a node's kubelet stops the Node turns NotReady: the node lifecycle
    /// controller's `--node-monitor-grace-period`, 40 s by default in the Kubernetes
    /// releases this engine targets before 1.32 (the figure the model uses).
    pub node_monitor_grace: Duration,
    /// How long after boot the kubelet first reports the Node (with its new boot ID and
    /// osImage, NotReady until its runtime and network are up). 10 s: Talos starts the
    /// kubelet after containerd and the network, a few seconds after boot.
    pub kubelet_report: Duration,
}

impl Realism {
    /// A cluster as the engine meets it in production (the defaults above).
    #[must_use]
    pub fn cluster() -> Self {
        Self {
            wake: Wake::Watch,
            api_latency_ms: 5..=50,
            watch_delay_ms: 200..=2_000,
            unreachable_timeout: Duration::from_secs(15),
            node_monitor_grace: Duration::from_secs(40),
            kubelet_report: Duration::from_secs(10),
        }
    }

    /// The oracle: no latency, no delay, the Node showing every change at once, and the
    /// controller woken at every change. Only for comparison, and for a simulator driven
    /// in wall-clock time (the operator's simulated fleet).
    #[must_use]
    pub fn oracle() -> Self {
        Self {
            wake: Wake::Oracle,
            api_latency_ms: 0..=0,
            watch_delay_ms: 0..=0,
            unreachable_timeout: Duration::ZERO,
            node_monitor_grace: Duration::ZERO,
            kubelet_report: Duration::ZERO,
        }
    }

    /// Whether calls take time: the simulation then runs on Tokio's paused clock.
    #[must_use]
    pub fn takes_time(&self) -> bool {
        self.wake == Wake::Watch
    }
}

/// A simulated cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// How many control planes (`cp-1`, `cp-2`, ...).
    pub control_planes: usize,
    /// How many workers (`worker-1`, ...).
    pub workers: usize,
    /// The version every node runs at the start.
    pub from: TalosVersion,
    /// The release set's version, the target.
    pub to: TalosVersion,
    /// The cluster's Kubernetes version.
    pub kubernetes: String,
    /// Whether the workers carry storage replicas (and a `TalosStorage` selects them).
    pub storage_on_workers: bool,
    /// Replicas on each storage node at the start.
    pub replicas_per_node: u32,
    /// The run's seed.
    pub seed: u64,
    /// The faults.
    pub faults: Vec<Fault>,
    /// The durations drawn from.
    pub durations: Durations,
    /// Where the installer image is pulled from.
    pub registry: Registry,
    /// The Image Factory platform.
    pub platform: String,
    /// Whether machines carry `spec.hostname`; without it the node name is read from the
    /// node's Nodename resource through the Talos API.
    pub hostnames: bool,
    /// How nodes are named and addressed.
    pub naming: Naming,
    /// How real the cluster behaves (the default: as a real one; see [`Realism`]).
    pub realism: Realism,
    /// The cluster's maintenance windows (`TalosCluster.spec.maintenance`; none by
    /// default). The simulated clock starts at 2026-01-01T00:00:00Z, a Thursday.
    pub maintenance: Option<ichor_upgrade_core::window::MaintenanceSpec>,
    /// The cluster's health gates (`TalosCluster.spec.gates`).
    pub gates: Vec<ichor_upgrade_core::gate::GateSpec>,
}

/// How the simulated nodes are named and addressed: node `i` of a role is
/// `{prefix}{role}-{i}{suffix}` (`cp`, `worker`), at the address `i + 2` above
/// `address_base`, counting every node (`10.5.0.2`, ..., `10.5.0.255`, `10.5.1.0`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// Before the role: `demo-` for the simulated fleet's `demo-cp-1`.
    pub prefix: String,
    /// After the index: a simulated fleet on a shared API server appends its namespace,
    /// since Nodes are cluster-wide.
    pub suffix: String,
    /// The network the addresses count from: `10.5.0.0` by default. The addresses are only
    /// names: the simulator is reached through the Talos API's `nodes` metadata.
    pub address_base: std::net::Ipv4Addr,
}

impl Naming {
    /// The address of the node at `index` (counting every node from 0).
    ///
    /// # Panics
    /// When the address would run past 255.255.255.255 (more nodes than the base leaves room for).
    #[must_use]
    pub fn address(&self, index: usize) -> String {
        let offset = u32::try_from(index + 2).ok();
        let address = offset.and_then(|o| u32::from(self.address_base).checked_add(o));
        std::net::Ipv4Addr::from(address.expect("the simulated node's address fits in IPv4")).to_string()
    }
}

impl Default for Naming {
    fn default() -> Self {
        Self { prefix: String::new(), suffix: String::new(), address_base: std::net::Ipv4Addr::new(10, 5, 0, 0) }
    }
}

impl SimConfig {
    /// What a plan assumes where no turn was recorded
    /// ([`ichor_upgrade_core::plan::models`]): a turn is this simulator's drain, an
    /// uncontended image pull, install, reboot and Ready, each drawn from its range, and
    /// the reaction is `pass_interval`.
    #[must_use]
    pub fn plan_defaults(&self, pass_interval: Duration) -> ichor_upgrade_core::plan::Defaults {
        Self::plan_defaults_of(&self.durations, &self.registry, pass_interval)
    }

    /// As [`SimConfig::plan_defaults`], from phase ranges and a registry.
    #[must_use]
    pub fn plan_defaults_of(
        durations: &Durations,
        registry: &Registry,
        pass_interval: Duration,
    ) -> ichor_upgrade_core::plan::Defaults {
        #[allow(clippy::cast_precision_loss, reason = "seconds well within f64's exact range")]
        let range = |r: &RangeInclusive<u64>| (*r.start() as f64, *r.end() as f64);
        let pull = registry.uncontended().as_secs_f64();
        let d = durations;
        ichor_upgrade_core::plan::Defaults {
            phases: vec![
                ("drain".to_owned(), range(&d.drain)),
                ("pull".to_owned(), (pull, pull)),
                ("install".to_owned(), range(&d.install)),
                ("reboot".to_owned(), range(&d.reboot)),
                ("Ready".to_owned(), range(&d.ready)),
            ],
            reaction_s: pass_interval.as_secs_f64(),
        }
    }

    /// A cluster of `control_planes` + `workers` on `from`, upgraded to `to`.
    #[must_use]
    pub fn new(control_planes: usize, workers: usize, from: TalosVersion, to: TalosVersion) -> Self {
        Self {
            control_planes,
            workers,
            from,
            to,
            kubernetes: "1.34.1".to_owned(),
            storage_on_workers: true,
            replicas_per_node: 4,
            seed: 1,
            faults: Vec::new(),
            durations: Durations::default(),
            registry: Registry::default(),
            platform: "metal".to_owned(),
            hostnames: true,
            naming: Naming::default(),
            realism: Realism::cluster(),
            maintenance: None,
            gates: Vec::new(),
        }
    }

    /// The same cluster with health gates.
    #[must_use]
    pub fn with_gates(mut self, gates: Vec<ichor_upgrade_core::gate::GateSpec>) -> Self {
        self.gates = gates;
        self
    }

    /// The same cluster with maintenance windows.
    #[must_use]
    pub fn with_maintenance(mut self, maintenance: ichor_upgrade_core::window::MaintenanceSpec) -> Self {
        self.maintenance = Some(maintenance);
        self
    }

    /// The same cluster with another model of time and watches.
    #[must_use]
    pub fn with_realism(mut self, realism: Realism) -> Self {
        self.realism = realism;
        self
    }

    /// The same cluster with its nodes named and addressed as `naming` says.
    #[must_use]
    pub fn with_naming(mut self, naming: Naming) -> Self {
        self.naming = naming;
        self
    }

    /// The same cluster with a seed.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The same cluster with faults.
    #[must_use]
    pub fn with_faults(mut self, faults: impl IntoIterator<Item = Fault>) -> Self {
        self.faults = faults.into_iter().collect();
        self
    }

    /// The same cluster with storage on the workers or not.
    #[must_use]
    pub fn with_storage(mut self, storage_on_workers: bool) -> Self {
        self.storage_on_workers = storage_on_workers;
        self
    }

    /// The same cluster with another Kubernetes version.
    #[must_use]
    pub fn with_kubernetes(mut self, kubernetes: impl Into<String>) -> Self {
        self.kubernetes = kubernetes.into();
        self
    }

    /// The same cluster with or without `spec.hostname` on its machines.
    #[must_use]
    pub fn with_hostnames(mut self, hostnames: bool) -> Self {
        self.hostnames = hostnames;
        self
    }

    /// Whether the fault is on.
    #[must_use]
    pub fn has(&self, fault: Fault) -> bool {
        self.faults.contains(&fault)
    }
}

/// Converts whole seconds to a duration.
pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_count_past_a_byte_and_stay_addresses() {
        let naming = Naming::default();
        assert_eq!(naming.address(0), "10.5.0.2");
        assert_eq!(naming.address(253), "10.5.0.255");
        assert_eq!(naming.address(254), "10.5.1.0");
        let fleet = Naming { address_base: std::net::Ipv4Addr::new(127, 1, 0, 0), ..Naming::default() };
        assert_eq!(fleet.address(1002), "127.1.3.236");
        assert!(fleet.address(5000).parse::<std::net::Ipv4Addr>().is_ok());
    }

    #[test]
    fn a_default_simulators_plan_defaults_are_the_engines_for_a_new_real_cluster() {
        // The operator's dry run on a real cluster assumes `Defaults::talos`; the simulated
        // fleet's must plan the same, or the fleet's dry runs would say nothing of a real one.
        let interval = Duration::from_millis(2_000);
        let sim = SimConfig::plan_defaults_of(&Durations::default(), &Registry::default(), interval);
        assert_eq!(sim, ichor_upgrade_core::plan::Defaults::talos(2.0));
    }
}
