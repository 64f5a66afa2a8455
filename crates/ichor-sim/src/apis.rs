//! The simulated cluster behind the engine's traits: the Talos API, the Kubernetes API,
//! the storage backend and the clock. Every call is counted, can be refused by an API
//! outage, and can kill the controller (the controller-crash fault).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ichor_adapters::talos::server::Served;
use ichor_executor::Clock;
use ichor_executor::StorageApi;
use ichor_executor::kube_api::{
    AdminKubeconfig, ClusterInfo, ClusterKubernetesInfo, Event, Eviction, KubeApi, KubeError, LeaseInfo, LeaseWrite,
    MachineInfo, ManifestSession, NodeInfo, NodeKubernetesInfo, OperationInfo, PodInfo,
};
use ichor_executor::talos_api::{
    ApplyConfigReply, ApplyConfigRequest, EtcdAlarm, EtcdMember, EtcdStatus, ImageInfo, InstallOutcome, InstallRequest,
    PullRequest, ResetRequest, SnapshotStream, TalosApi, TalosError, UpgradeAck, UpgradeRequest,
};
use ichor_executor::writes::{
    ConditionWrite, KubeWrite, KubeWritten, Seal, StorageWrite, StorageWritten, TalosWrite, TalosWritten,
};
use ichor_storage::{ConditionWriteError, EvacuationRequest, StorageError, StorageObject, StorageReads};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, Conditions};
use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};
use ichor_upgrade_core::machine::kubernetes::{KUBERNETES_UPGRADE, reason as kubernetes_reason};
use ichor_upgrade_core::machine::talos::FACTORY;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::status::OperationStatus;
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, reason as upgrade_reason};
use ichor_upgrade_core::versions::TalosVersion;

use super::SimCluster;
use super::config::{Fault, secs};
use super::trace::TraceKind;
use super::world::{
    EtcdMember as SimMember, Evacuation, Gate, LifecycleRecord, NodePhase, StopCall, UpgradeRecord, World,
};

/// In a Kubernetes upgrade, the stop-during-install faults are armed at one read of a
/// started machine's configuration in this many (drawn), so the stop lands anywhere in
/// either stage: a 3 + 4 upgrade reads about a hundred.
const STOP_ONE_IN_READS: u64 = 25;

fn refused_talos(address: &str) -> TalosError {
    TalosError::dial(format!("{address}:50000"), "connection refused")
}

fn killed_talos() -> TalosError {
    TalosError::transport("the controller was killed")
}

fn refused_kube() -> KubeError {
    KubeError::Unreachable("connection refused".to_owned())
}

/// What a Kubernetes call is, for its latency and its count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KubeCall {
    /// A read served from the controller's watch cache: no round trip.
    CachedRead,
    /// A read that goes to the API server.
    Read,
    /// A write.
    Write,
    /// A write of the operation's status.
    StatusWrite,
    /// A write of a machine's conditions.
    ConditionWrite,
    /// A write to the storage backend's objects.
    StorageWrite,
    /// A write of the Lease.
    LeaseWrite,
    /// A write of a Node (the engine's cordon and uncordon).
    NodeWrite,
    /// An Event.
    Event,
}

impl KubeCall {
    fn is_read(self) -> bool {
        matches!(self, Self::CachedRead | Self::Read)
    }
}

impl SimCluster {
    /// A legacy Upgrade call's pull of the installer image, before the call answers (facts
    /// sheet §4.1): the node fetches the image at the rate the registry's bandwidth
    /// gives it among the pulls under way, which changes as pulls start and end. A node
    /// that is not running, or that has the image, does not pull.
    async fn pull_installer(&self, address: &str, image: &str) {
        let i = {
            let mut w = self.lock();
            w.sync_clock();
            let Some(i) = w.node_index_by_address(address).filter(|&i| w.needs_pull(i, image)) else { return };
            w.start_pull(i, image);
            i
        };
        self.pulls_changed.notify_waiters();
        loop {
            let changed = self.pulls_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let left = {
                let mut w = self.lock();
                w.sync_clock();
                w.pull_left(i)
            };
            let Some(left) = left else { break };
            tokio::select! {
                // In a fixed order, so that a seed replays the same run.
                biased;
                () = tokio::time::sleep(left) => {}
                () = &mut changed => {}
            }
        }
        // The others' share grew.
        self.pulls_changed.notify_waiters();
    }

    /// Waits a drawn API latency, in virtual time, when calls take time.
    async fn latency(&self) {
        let latency = {
            let mut w = self.lock();
            if !w.config.realism.takes_time() {
                return;
            }
            w.api_latency()
        };
        tokio::time::sleep(latency).await;
    }

    /// Runs a Talos call against the node at `address`. A node that is down does not
    /// answer: when calls take time, the call fails only at its dial timeout.
    async fn talos<T>(
        &self,
        method: &'static str,
        address: &str,
        f: impl FnOnce(&mut World, usize) -> Result<T, TalosError>,
    ) -> Result<T, TalosError> {
        let silent = {
            let mut w = self.lock();
            w.sync_clock();
            let down = w.node_index_by_address(address).is_none_or(|i| !w.nodes[i].reachable());
            (down && w.config.realism.takes_time()).then_some(w.config.realism.unreachable_timeout)
        };
        match silent {
            Some(timeout) => {
                tokio::time::sleep(timeout).await;
                let mut w = self.lock();
                w.sync_clock();
                w.counters.talos_call(method);
                return Err(TalosError::dial(format!("{address}:50000"), "i/o timeout"));
            }
            None => self.latency().await,
        }
        let mut w = self.lock();
        w.sync_clock();
        let killed = match w.enter() {
            Gate::Refuse => return Err(refused_talos(address)),
            Gate::Go { killed } => killed,
        };
        w.counters.talos_call(method);
        let result = match w.node_index_by_address(address) {
            Some(i) if w.nodes[i].reachable() => {
                let before = (std::mem::discriminant(&w.nodes[i].phase), w.nodes[i].etcd);
                let result = f(&mut w, i);
                // Only a call that changed a node (an Upgrade, a reset, an etcd member
                // removed) can change what is measured or when the world next changes.
                if (std::mem::discriminant(&w.nodes[i].phase), w.nodes[i].etcd) != before || result.is_err() {
                    w.changed(i);
                    w.measure();
                }
                result
            }
            Some(_) | None => Err(refused_talos(address)),
        };
        if killed { Err(killed_talos()) } else { result }
    }

    /// Runs a Kubernetes call of this kind, counting it.
    async fn kube<T>(
        &self,
        call: KubeCall,
        f: impl FnOnce(&mut World) -> Result<T, KubeError>,
    ) -> Result<T, KubeError> {
        if call != KubeCall::CachedRead {
            self.latency().await;
        }
        let mut w = self.lock();
        w.sync_clock();
        let killed = match w.enter() {
            Gate::Refuse => return Err(refused_kube()),
            Gate::Go { killed } => killed,
        };
        // A call that reaches the API server (a cached read does not) may land, through
        // the control planes' load balancer, on one whose kube-apiserver is restarting.
        if call != KubeCall::CachedRead
            && let Some(restarting) = w.api_server_restarting()
        {
            let share = 1.0 / w.api_servers().max(1) as f64;
            if w.latency_rng.chance(share) {
                w.counters.api_server_restart_refusals += 1;
                return Err(KubeError::Unreachable(format!(
                    "connection refused: the kube-apiserver of {restarting} restarts"
                )));
            }
        }
        let result = f(&mut w);
        if call.is_read() {
            w.counters.kube_reads += 1;
        } else if result.is_ok() {
            let c = &mut w.counters;
            match call {
                KubeCall::Event => c.events += 1,
                KubeCall::LeaseWrite => c.lease_writes += 1,
                KubeCall::StatusWrite => {
                    c.status_writes += 1;
                    c.kube_writes += 1;
                }
                KubeCall::ConditionWrite => {
                    c.condition_writes += 1;
                    c.kube_writes += 1;
                }
                KubeCall::StorageWrite => {
                    c.storage_writes += 1;
                    c.kube_writes += 1;
                }
                KubeCall::NodeWrite => {
                    c.node_writes += 1;
                    c.kube_writes += 1;
                }
                KubeCall::Write | KubeCall::CachedRead | KubeCall::Read => c.kube_writes += 1,
            }
            // The controller watches Longhorn's nodes, whose spec it writes; of its own
            // resources it is woken only by changes to their spec, labels or annotations
            // (kube-rs predicates), never by the status and conditions it writes.
            if call == KubeCall::StorageWrite {
                w.watch_event();
            }
        }
        if killed { Err(KubeError::Unreachable("the controller was killed".to_owned())) } else { result }
    }
}

#[async_trait]
impl TalosApi for SimCluster {
    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        self.talos("nodename", node, |w, i| Ok(w.nodes[i].name.clone())).await
    }

    async fn talos_version(&self, node: &str) -> Result<String, TalosError> {
        self.talos("version", node, |w, i| Ok(w.nodes[i].version.to_string())).await
    }

    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        self.talos("machine_stage", node, |w, i| {
            Ok(match w.nodes[i].phase {
                NodePhase::Running => MachineStage::Running,
                NodePhase::Installing { .. } => MachineStage::Upgrading,
                NodePhase::Booting { .. } => MachineStage::Booting,
                NodePhase::Rebooting { .. } | NodePhase::PoweredOff => MachineStage::Rebooting,
                NodePhase::Resetting { .. } => MachineStage::Resetting,
            })
        })
        .await
    }

    async fn write(&self, node: &str, write: TalosWrite<'_>, _seal: Seal) -> Result<TalosWritten, TalosError> {
        self.serve(node, write).await
    }

    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        self.talos("etcd_members", node, |w, i| {
            match w.nodes[i].etcd {
                None => {
                    return Err(TalosError::Answered {
                        code: "FailedPrecondition".to_owned(),
                        message: "etcd is only available on control plane nodes".to_owned(),
                    });
                }
                Some(SimMember::Missing) => {
                    return Err(TalosError::Answered {
                        code: "Unavailable".to_owned(),
                        message: "etcd is not running".to_owned(),
                    });
                }
                Some(SimMember::Voter | SimMember::Learner { .. }) => {}
            }
            Ok(w.nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| !n.removed)
                .filter_map(|(k, n)| match n.etcd {
                    Some(SimMember::Voter) => Some((k, n, false)),
                    Some(SimMember::Learner { .. }) => Some((k, n, true)),
                    Some(SimMember::Missing) | None => None,
                })
                .map(|(k, n, is_learner)| EtcdMember { id: 0x1000 + k as u64, hostname: n.name.clone(), is_learner })
                .collect())
        })
        .await
    }

    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        self.talos("etcd_status", node, |w, i| {
            let is_learner = match w.nodes[i].etcd {
                Some(SimMember::Voter) => false,
                Some(SimMember::Learner { .. }) => true,
                Some(SimMember::Missing) | None => {
                    return Err(TalosError::Answered {
                        code: "Unavailable".to_owned(),
                        message: "etcd is not running".to_owned(),
                    });
                }
            };
            // The leader is the first voting member: every member agrees on it.
            let leader = w.nodes.iter().position(|n| n.etcd == Some(SimMember::Voter)).map_or(0, |k| 0x1000 + k as u64);
            Ok(EtcdStatus { member_id: 0x1000 + i as u64, leader, errors: Vec::new(), is_learner })
        })
        .await
    }

    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        self.talos("etcd_alarms", node, |w, i| match w.nodes[i].etcd {
            Some(SimMember::Voter | SimMember::Learner { .. }) => Ok(Vec::new()),
            Some(SimMember::Missing) | None => {
                Err(TalosError::Answered { code: "Unavailable".to_owned(), message: "etcd is not running".to_owned() })
            }
        })
        .await
    }

    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        let (seed, size, fails, takes_time) = self
            .talos("etcd_snapshot", node, |w, i| {
                if w.nodes[i].etcd != Some(SimMember::Voter) {
                    return Err(TalosError::answer("FailedPrecondition", "etcd is not a voting member on this node"));
                }
                w.record(i, TraceKind::EtcdSnapshot);
                let size = super::snapshot::snapshot_size(w.nodes.len());
                let fails = w.config.has(Fault::SnapshotFails);
                w.counters.snapshot_streams_broken += u64::from(fails);
                Ok((w.config.seed, size, fails, w.config.realism.takes_time()))
            })
            .await?;
        Ok(super::snapshot::stream(seed, size, fails, takes_time))
    }

    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        self.talos("image_list", node, |w, i| {
            let size = i64::try_from(w.config.registry.image_bytes).unwrap_or(i64::MAX);
            Ok(w.nodes[i]
                .pulled
                .iter()
                .map(|name| ImageInfo { name: name.clone(), digest: format!("sha256:{:064x}", 0x1ceb00da_u64), size })
                .collect())
        })
        .await
    }

    async fn install_running(&self, node: &str) -> Result<Option<bool>, TalosError> {
        self.talos("install_running", node, |w, i| Ok(Some(w.nodes[i].installing))).await
    }

    async fn machine_config(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.with_world_untouched(|w| {
            if let Some(i) = w.node_index_by_address(node) {
                let machine = w.nodes[i].name.clone();
                w.arm_stop_during_change(&machine, STOP_ONE_IN_READS);
            }
        });
        self.talos("machine_config", node, |w, i| Ok(w.nodes[i].kube.config_yaml(w.nodes[i].role).into_bytes())).await
    }

    fn client_roles(&self) -> Option<Vec<String>> {
        Some(self.lock().talosconfig_roles.clone())
    }

    async fn admin_kubeconfig(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.talos("kubeconfig", node, |w, i| {
            if !w.talosconfig_roles.iter().any(|r| r == "os:admin") {
                return Err(TalosError::Answered {
                    code: "PermissionDenied".to_owned(),
                    message: "not authorized".to_owned(),
                });
            }
            if w.nodes[i].role != MachineRole::ControlPlane {
                return Err(TalosError::Answered {
                    code: "FailedPrecondition".to_owned(),
                    message: "kubeconfig is only available on control plane nodes".to_owned(),
                });
            }
            w.counters.admin_kubeconfigs += 1;
            Ok(w.admin_kubeconfig.clone().into_bytes())
        })
        .await
    }

    async fn bootstrap_manifests(&self, node: &str) -> Result<Vec<serde_json::Value>, TalosError> {
        self.talos("bootstrap_manifests", node, |w, i| Ok(w.bootstrap_manifests(i))).await
    }

    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        self.talos("boot_id", node, |w, i| Ok(w.nodes[i].boot_id.clone())).await
    }
}

/// The writes, as the simulated node and API server carry them out: what
/// [`TalosApi::write`] and [`KubeApi::write`] do (through [`SimCluster::serve`] and
/// [`SimCluster::serve_kube`]), and what the simulator's tests and the apid stand-in call
/// directly, with no [`Seal`]: only the executor's effects make one.
impl SimCluster {
    /// Carries out a Talos write on the node at `node`, by its variant: what
    /// [`TalosApi::write`] does, without the seal (the apid stand-in's peer, or a test,
    /// asks for it).
    ///
    /// # Errors
    /// The write's own error, as its method answers it.
    pub async fn serve(&self, node: &str, write: TalosWrite<'_>) -> Result<TalosWritten, TalosError> {
        Ok(match write {
            TalosWrite::Upgrade(request) => TalosWritten::Upgrade(self.upgrade(node, request).await?),
            TalosWrite::ApplyConfiguration(request) => {
                TalosWritten::ApplyConfiguration(self.apply_configuration(node, request).await?)
            }
            TalosWrite::Install { request, started } => {
                TalosWritten::Install(self.lifecycle_upgrade_reporting(node, request, started).await?)
            }
            TalosWrite::Reboot => TalosWritten::Reboot(self.reboot(node).await?),
            TalosWrite::EtcdLeaveCluster => {
                self.etcd_leave_cluster(node).await?;
                TalosWritten::EtcdLeaveCluster
            }
            TalosWrite::EtcdRemoveMember { member_id } => {
                self.etcd_remove_member(node, member_id).await?;
                TalosWritten::EtcdRemoveMember
            }
            TalosWrite::Reset(request) => {
                self.reset(node, request).await?;
                TalosWritten::Reset
            }
            TalosWrite::ImagePull(request) => TalosWritten::ImagePull(self.image_pull(node, request).await?),
        })
    }

    /// Carries out a Kubernetes write, by its variant: what [`KubeApi::write`] does,
    /// without the seal.
    ///
    /// # Errors
    /// The write's own error, as its method answers it.
    pub async fn serve_kube(&self, write: KubeWrite<'_>) -> Result<KubeWritten, KubeError> {
        Ok(match write {
            KubeWrite::Cordon { node, annotation } => {
                self.cordon(node, annotation).await?;
                KubeWritten::Cordoned
            }
            KubeWrite::Uncordon { node } => {
                self.uncordon(node).await?;
                KubeWritten::Uncordoned
            }
            KubeWrite::Evict { namespace, name, .. } => KubeWritten::Evicted(self.evict(namespace, name).await?),
            KubeWrite::DeleteNode { node } => {
                self.delete_node(node).await?;
                KubeWritten::NodeDeleted
            }
        })
    }

    /// `MachineService.Upgrade`. Blocks while the node pulls and checks the installer.
    pub async fn upgrade(&self, node: &str, request: &UpgradeRequest) -> Result<UpgradeAck, TalosError> {
        let sent_at = self.with_world_untouched(|w| {
            w.sync_clock();
            w.now
        });
        self.pull_installer(node, &request.image).await;
        self.with_world_untouched(|w| {
            if let Some(before_effect) = w.crash.on_next_upgrade.take() {
                w.arm_crash(1, before_effect);
            }
        });
        self.talos("upgrade", node, |w, i| {
            let answered = |code: &str, message: String| TalosError::Answered { code: code.to_owned(), message };
            if w.nodes[i].phase != NodePhase::Running {
                return Err(answered("FailedPrecondition", "another upgrade is already in progress".to_owned()));
            }
            // Talos's legacy pre-check (force and preserve unset, a control plane): a
            // two-member etcd cluster cannot lose a member and keep quorum.
            let members =
                w.nodes.iter().filter(|n| matches!(n.etcd, Some(SimMember::Voter | SimMember::Learner { .. }))).count();
            if w.nodes[i].etcd.is_some() && members == 2 {
                return Err(answered(
                    "FailedPrecondition",
                    "etcd member count (2) is insufficient to maintain quorum".to_owned(),
                ));
            }
            let prefix = format!("{FACTORY}/{}-installer/", w.config.platform);
            let Some((_, tag)) = request.image.strip_prefix(&prefix).and_then(|rest| rest.rsplit_once(':')) else {
                return Err(answered("InvalidArgument", format!("failed to pull installer image {}", request.image)));
            };
            let Ok(version) = TalosVersion::parse(tag) else {
                return Err(answered("InvalidArgument", format!("failed to pull installer image {}", request.image)));
            };
            if w.nodes[i].loses_next_call {
                // The call-lost fault: the stream breaks before the request reaches the node.
                w.nodes[i].loses_next_call = false;
                w.record(i, TraceKind::CallLost);
                return Err(TalosError::transport("stream reset before the request was delivered"));
            }
            // Talos drains the node first (its server-side drain): a pod a
            // PodDisruptionBudget protects holds it up until the budget allows the eviction
            // or the drain's bound passes, then the upgrade goes on regardless.
            let drain = w.drain_wait(i);
            // Under the oracle no call takes time: the pull's least time is counted in the
            // install instead, so that the machine's time is the same under both models.
            let pull = if w.config.realism.takes_time() { Duration::ZERO } else { w.nodes[i].drawn.pull };
            let node = &mut w.nodes[i];
            let into = if node.falls_back { node.version.clone() } else { version };
            node.falls_back = false;
            // Talos evicts every pod at once: the drain takes the longest pod's time, or
            // as long as a PodDisruptionBudget holds an eviction back.
            let drained = secs(node.drawn.drain).max(drain.wait);
            let until = w.now.saturating_add(pull).saturating_add(drained).saturating_add(secs(node.drawn.install));
            node.phase = NodePhase::Installing { until, into };
            let record = UpgradeRecord { node: node.name.clone(), boot_id: node.boot_id.clone(), at: w.now, sent_at };
            w.upgrades.push(record);
            w.counters.upgrade_calls += 1;
            w.record(i, TraceKind::UpgradeCall);
            w.record_why(i, TraceKind::Drain, drain.blocked_by);
            Ok(UpgradeAck {
                ack: "Upgrade request received".to_owned(),
                actor_id: format!("actor-{}", w.counters.upgrade_calls),
            })
        })
        .await
    }

    /// `MachineService.ApplyConfiguration` on the node, or its dry run (`dry_run` set:
    /// stores nothing).
    pub async fn apply_configuration(
        &self,
        node: &str,
        request: &ApplyConfigRequest,
    ) -> Result<ApplyConfigReply, TalosError> {
        if !request.dry_run {
            self.with_world_untouched(|w| {
                if let Some(before_effect) = w.crash.on_next_apply.take() {
                    w.arm_crash(1, before_effect);
                }
            });
        }
        let reply = self.talos("apply_configuration", node, |w, i| w.apply_configuration(i, request)).await;
        if request.dry_run {
            self.with_world_untouched(|w| {
                if let Some(i) = w.node_index_by_address(node) {
                    w.call_made(StopCall::DryRun, i);
                }
            });
        }
        reply
    }

    /// `LifecycleService.Upgrade`: the install into the other boot slot, to its exit code.
    /// It neither drains nor reboots, and Talos runs no etcd check for it. A stream that
    /// ends without an exit code is [`TalosError::Transport`].
    pub async fn lifecycle_upgrade(&self, node: &str, request: &InstallRequest) -> Result<InstallOutcome, TalosError> {
        self.lifecycle_upgrade_reporting(node, request, &std::sync::atomic::AtomicBool::new(false)).await
    }

    /// [`Self::lifecycle_upgrade`], setting `started` once the node answered that the
    /// install began (the stream's first message: Talos took its one-install lock and
    /// started the installer, which then runs to its end whatever becomes of the stream).
    pub async fn lifecycle_upgrade_reporting(
        &self,
        node: &str,
        request: &InstallRequest,
        started: &std::sync::atomic::AtomicBool,
    ) -> Result<InstallOutcome, TalosError> {
        // The install runs on the node, not in the stream: Talos waits for the installer's
        // task on a context detached from the call (`internal/app/lifecycle/container.go`,
        // `task.Wait(detachedCtx)`) and holds its one-install lock until the installer
        // exits. A controller that dies mid-stream leaves the install to finish by itself.
        let sent_at = self.with_world_untouched(|w| {
            w.sync_clock();
            w.now
        });
        // The install begins: one at a time, from an image already in the store.
        let boot_id = self
            .talos("lifecycle_upgrade", node, |w, i| {
                let n = &w.nodes[i];
                if n.phase != NodePhase::Running {
                    return Err(TalosError::answer("FailedPrecondition", "the machine is not running"));
                }
                if n.installing {
                    return Err(TalosError::answer(
                        "FailedPrecondition",
                        "another installation/upgrade is already in progress",
                    ));
                }
                if n.pulled.as_deref() != Some(request.image.as_str()) {
                    return Err(TalosError::answer(
                        "FailedPrecondition",
                        format!("installer image {} not found in containerd store", request.image),
                    ));
                }
                let boot_id = n.boot_id.clone();
                let version = installer_version(w, &request.image);
                w.start_install(i, version, sent_at);
                Ok(boot_id)
            })
            .await?;
        started.store(true, std::sync::atomic::Ordering::Relaxed);
        // The stream follows the install to its end (under the oracle it ended in the call).
        loop {
            let left = self.with_world_untouched(|w| {
                w.sync_clock();
                let i = w.node_index_by_address(node)?;
                let run = w.nodes[i].install_run.as_ref().filter(|r| r.boot_id == boot_id)?;
                Some(run.until.saturating_since(w.now).max(Duration::from_millis(1)))
            });
            let Some(left) = left else { break };
            tokio::time::sleep(left).await;
        }
        // Its last message: the installer's exit code, unless the node rebooted first.
        self.talos("lifecycle_upgrade_end", node, |w, i| match &w.nodes[i].install_exit {
            Some((boot, 0)) if *boot == boot_id => {
                Ok(InstallOutcome { exit_code: 0, output: vec!["upgrade successful".to_owned()] })
            }
            Some((boot, code)) if *boot == boot_id => {
                Ok(InstallOutcome { exit_code: *code, output: vec!["invalid installer image".to_owned()] })
            }
            _ => Err(TalosError::transport("the node rebooted during the install")),
        })
        .await
    }

    /// `MachineService.Reboot` in the default mode; the actor ID. It does not drain.
    pub async fn reboot(&self, node: &str) -> Result<String, TalosError> {
        let sent_at = self.with_world_untouched(|w| {
            w.sync_clock();
            w.now
        });
        self.talos("reboot", node, |w, i| {
            if w.nodes[i].phase != NodePhase::Running {
                return Err(TalosError::answer("FailedPrecondition", "the machine is not running"));
            }
            // Under the oracle the install took no time in its call: it is counted here.
            let extra = if w.config.realism.takes_time() {
                Duration::ZERO
            } else {
                w.nodes[i].drawn.pull + secs(w.nodes[i].drawn.install)
            };
            let n = &mut w.nodes[i];
            // The slot an install wrote is booted, unless it falls back (the ab-fallback
            // fault); with no install the node boots what it runs.
            let into = match n.installed.take() {
                Some(_) if n.falls_back => {
                    n.falls_back = false;
                    n.version.clone()
                }
                Some(version) => version,
                None => n.version.clone(),
            };
            let until = w.now.saturating_add(extra).saturating_add(secs(n.drawn.reboot));
            n.phase = NodePhase::Rebooting { until, into };
            n.ready = false;
            let restarts = w.counters.restarts;
            let record =
                LifecycleRecord { node: n.name.clone(), boot_id: n.boot_id.clone(), at: w.now, sent_at, restarts };
            w.reboots.push(record);
            w.counters.reboot_calls += 1;
            w.record(i, TraceKind::RebootCall);
            w.record(i, TraceKind::RebootStart);
            w.record(i, TraceKind::NotReady);
            w.node_went_down(i);
            Ok(format!("actor-reboot-{}", w.counters.reboot_calls))
        })
        .await
    }

    /// `EtcdLeaveCluster`: the node's etcd member leaves the cluster.
    pub async fn etcd_leave_cluster(&self, node: &str) -> Result<(), TalosError> {
        self.talos("etcd_leave_cluster", node, |w, i| match w.nodes[i].etcd {
            Some(SimMember::Voter | SimMember::Learner { .. }) => {
                w.nodes[i].etcd = None;
                w.record(i, TraceKind::EtcdMemberMissing);
                Ok(())
            }
            Some(SimMember::Missing) | None => Err(TalosError::Answered {
                code: "FailedPrecondition".to_owned(),
                message: "etcd is not running on this node".to_owned(),
            }),
        })
        .await
    }

    /// `EtcdRemoveMemberByID`, asked of `node` (another control plane): removes the member
    /// of a control plane that can no longer leave by itself.
    pub async fn etcd_remove_member(&self, node: &str, member_id: u64) -> Result<(), TalosError> {
        self.talos("etcd_remove_member", node, |w, i| {
            if !matches!(w.nodes[i].etcd, Some(SimMember::Voter | SimMember::Learner { .. })) {
                return Err(TalosError::answer("FailedPrecondition", "etcd is not running on this node"));
            }
            let index = member_id.checked_sub(0x1000).and_then(|k| usize::try_from(k).ok());
            let Some(k) = index.filter(|&k| k < w.nodes.len() && w.nodes[k].etcd.is_some()) else {
                return Err(TalosError::answer("NotFound", format!("etcd member {member_id:016x} not found")));
            };
            w.nodes[k].etcd = None;
            w.record(k, TraceKind::EtcdMemberMissing);
            w.changed(k);
            w.measure();
            Ok(())
        })
        .await
    }

    /// `Reset`: the node wipes itself.
    pub async fn reset(&self, node: &str, request: &ResetRequest) -> Result<(), TalosError> {
        self.talos("reset", node, |w, i| {
            if !request.graceful || request.reboot {
                return Err(TalosError::Answered {
                    code: "InvalidArgument".to_owned(),
                    message: "the simulation only models a graceful reset that powers off".to_owned(),
                });
            }
            if let NodePhase::Resetting { .. } = w.nodes[i].phase {
                return Err(TalosError::Answered {
                    code: "FailedPrecondition".to_owned(),
                    message: "locked".to_owned(),
                });
            }
            let until = w.now.saturating_add(secs(30));
            w.nodes[i].phase = NodePhase::Resetting { until };
            w.record(i, TraceKind::ResetCall);
            Ok(())
        })
        .await
    }

    /// `ImageService.Pull` into the node's `system` containerd namespace: the pulled
    /// image's name once every layer is there (at once if it already was).
    pub async fn image_pull(&self, node: &str, request: &PullRequest) -> Result<String, TalosError> {
        if self.with_world_untouched(|w| installer_version(w, &request.image)).is_none() {
            let missing = format!("failed to pull image {}: not found", request.image);
            return self.talos("image_pull", node, |_, _| Err(TalosError::answer("NotFound", missing))).await;
        }
        self.with_world_untouched(|w| {
            if let Some(i) = w.node_index_by_address(node) {
                let machine = w.nodes[i].name.clone();
                w.arm_stop_during_install(&machine);
            }
        });
        self.pull_installer(node, &request.image).await;
        self.talos("image_pull", node, |w, i| {
            // Under the oracle a pull takes no time; its least time is counted in the reboot.
            w.nodes[i].pulled = Some(request.image.clone());
            Ok(request.image.clone())
        })
        .await
    }

    /// Cordons the Node `read`: `spec.unschedulable=true` and the annotation
    /// [`CORDONED_ANNOTATION`](ichor_upgrade_core::machine::lifecycle::CORDONED_ANNOTATION) set to
    /// `annotation`, in one write, under `read.resource_version` (a Node changed since it was
    /// read makes it [`KubeError::Conflict`]).
    pub async fn cordon(&self, read: &NodeInfo, annotation: &str) -> Result<(), KubeError> {
        self.kube(KubeCall::NodeWrite, |w| {
            if w.cordon_race.as_deref() == Some(read.name.as_str())
                && let Some(i) = w.node_index(&read.name)
            {
                w.cordon_race = None;
                w.nodes[i].unschedulable = true;
                w.node_edited(i);
            }
            let i = w.node_written_under(read)?;
            w.nodes[i].set_engine_cordon(Some(annotation));
            w.node_edited(i);
            w.record(i, TraceKind::Cordon);
            w.call_made(StopCall::Cordon, i);
            Ok(())
        })
        .await
    }

    /// Lifts the engine's cordon of the Node `read`: `spec.unschedulable=false` and the
    /// annotation removed, in one write, under `read.resource_version` (else
    /// [`KubeError::Conflict`]).
    pub async fn uncordon(&self, read: &NodeInfo) -> Result<(), KubeError> {
        self.kube(KubeCall::NodeWrite, |w| {
            let i = w.node_written_under(read)?;
            let n = &mut w.nodes[i];
            n.set_engine_cordon(None);
            // The replacements of the pods the drain evicted are scheduled here again.
            let back = std::mem::take(&mut n.evicted);
            n.pods.extend(back);
            w.node_edited(i);
            w.record(i, TraceKind::Uncordon);
            Ok(())
        })
        .await
    }

    /// Evicts a pod through the Eviction API (`policy/v1` Eviction).
    pub async fn evict(&self, namespace: &str, name: &str) -> Result<Eviction, KubeError> {
        self.kube(KubeCall::Write, |w| {
            let now = w.now;
            let Some((i, k)) = w.pod(namespace, name) else { return Ok(Eviction::Evicted) };
            let blocked = w.eviction_blocked_until(&w.nodes[i].pods[k]).is_some();
            let drain = w.nodes[i].drawn.drain;
            let pod = &mut w.nodes[i].pods[k];
            if blocked {
                return Ok(Eviction::Blocked {
                    message: "Cannot evict pod as it would violate the pod's disruption budget.".to_owned(),
                });
            }
            let first = pod.terminating_until.is_none();
            // Its termination grace: the node's drawn drain time (Talos's own drain takes as
            // long on the legacy path).
            pod.terminating_until.get_or_insert(now.saturating_add(secs(drain)));
            if first {
                w.counters.evictions += 1;
            }
            w.changed(i);
            if first && w.nodes[i].pods.iter().filter(|p| p.terminating_until.is_some()).count() == 1 {
                w.record(i, TraceKind::Drain);
            }
            Ok(Eviction::Evicted)
        })
        .await
    }

    /// Deletes the Node object `read`, only if it is still at `read.resource_version`
    /// ([`KubeError::Conflict`] otherwise). One already gone is `Ok`.
    pub async fn delete_node(&self, read: &NodeInfo) -> Result<(), KubeError> {
        self.kube(KubeCall::Write, |w| {
            let i = w.node_written_under(read)?;
            w.nodes[i].removed = true;
            w.changed(i);
            w.record(i, TraceKind::Removed);
            Ok(())
        })
        .await
    }
}

/// The simulated cluster behind the apid stand-in ([`ichor_adapters::talos::server`]):
/// its peer's writes are [`SimCluster::serve`]'s.
#[async_trait]
impl Served for SimCluster {
    async fn serve(&self, node: &str, write: TalosWrite<'_>) -> Result<TalosWritten, TalosError> {
        // The inherent method (a path finds it before the trait's).
        Self::serve(self, node, write).await
    }
}

/// The version of a factory installer image reference of this cluster's platform.
fn installer_version(w: &World, image: &str) -> Option<TalosVersion> {
    let prefix = format!("{FACTORY}/{}-installer/", w.config.platform);
    let (_, tag) = image.strip_prefix(&prefix)?.rsplit_once(':')?;
    TalosVersion::parse(tag).ok()
}

/// The writes of a machine's conditions, as the simulated API server carries them out:
/// what [`KubeApi::write_conditions`] does, and what the simulator's tests call directly,
/// with no [`Seal`].
impl SimCluster {
    /// Replaces the machine's conditions with these: [`KubeApi::write_conditions`] with no
    /// `at`.
    ///
    /// # Errors
    /// The API server unreachable (an injected outage, a restarting kube-apiserver, an
    /// injected failure of condition writes), or a machine that does not exist.
    pub async fn write_conditions(&self, machine: &str, conditions: &Conditions) -> Result<(), ConditionWriteError> {
        self.write_machine_conditions(machine, None, conditions).await
    }

    /// Replaces the machine's conditions with these only if the machine is still at
    /// `resource_version`, the version it was read at (a transient conflict otherwise):
    /// [`KubeApi::write_conditions`] with `at`.
    ///
    /// # Errors
    /// As [`Self::write_conditions`], and the conflict.
    pub async fn write_conditions_at(
        &self,
        machine: &str,
        resource_version: &str,
        conditions: &Conditions,
    ) -> Result<(), ConditionWriteError> {
        self.write_machine_conditions(machine, Some(resource_version), conditions).await
    }

    /// A write of a machine's conditions, under a precondition on its resourceVersion if
    /// one is given (a [`KubeError::Conflict`] when the machine changed since).
    async fn write_machine_conditions(
        &self,
        machine: &str,
        expected: Option<&str>,
        conditions: &Conditions,
    ) -> Result<(), ConditionWriteError> {
        self.kube(KubeCall::ConditionWrite, |w| {
            let Some(i) = w.storage_node(machine) else {
                return Err(KubeError::NotFound(format!("TalosMachine {machine}")));
            };
            if let Some(expected) = expected
                && w.machine_version(i) != expected
            {
                w.counters.conflicts += 1;
                return Err(KubeError::Conflict(format!(
                    "TalosMachine {machine} changed since it was read at resourceVersion {expected}"
                )));
            }
            if w.failing_condition_writes > 0 {
                w.failing_condition_writes -= 1;
                return Err(KubeError::Unreachable("the API server did not answer".to_owned()));
            }
            let before = w.conditions.get(machine).and_then(|c| c.get(TALOS_UPGRADE).cloned());
            let after = conditions.get(TALOS_UPGRADE);
            let converged =
                after.is_some_and(|c| c.status == ConditionStatus::False && c.reason == upgrade_reason::CONVERGED);
            if converged && before.as_ref() != after {
                w.record(i, TraceKind::Converged);
            }
            // A Kubernetes upgrade's machine, converged once its last stage is recorded.
            let kubernetes = |c: &Conditions| {
                c.get(KUBERNETES_UPGRADE).filter(|c| c.reason == kubernetes_reason::CONVERGED).cloned()
            };
            let now_converged = kubernetes(conditions);
            if now_converged.is_some() && w.conditions.get(machine).and_then(kubernetes) != now_converged {
                w.record(i, TraceKind::Converged);
            }
            w.set_conditions(i, conditions.clone());
            Ok(())
        })
        .await
        .map_err(|e| ConditionWriteError {
            machine: machine.to_owned(),
            transient: e.is_transient(),
            message: e.to_string(),
        })
    }
}

/// The simulated API server under the admin kubeconfig ([`KubeApi::manifest_session`]).
struct SimManifestSession<'a> {
    sim: &'a SimCluster,
}

#[async_trait]
impl ManifestSession for SimManifestSession<'_> {
    async fn apply(&self, object: &serde_json::Value, field_manager: &str) -> Result<(), KubeError> {
        self.sim.kube(KubeCall::Write, |w| w.apply_manifest(object, field_manager)).await
    }
}

#[async_trait]
impl KubeApi for SimCluster {
    async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError> {
        self.kube(KubeCall::CachedRead, |w| Ok(w.node_index(name).map(|i| NodeInfo::clone(&w.node_info(i))))).await
    }

    async fn nodes(&self, names: &[&str]) -> Result<Vec<Option<Arc<NodeInfo>>>, KubeError> {
        self.kube(KubeCall::CachedRead, |w| {
            // The names usually come in the order machines are listed (by name): the next
            // node in that order is tried before a lookup.
            let mut k = 0;
            let mut found = Vec::with_capacity(names.len());
            for name in names {
                while w.name_order.get(k).is_some_and(|&i| w.nodes[i].removed) {
                    k += 1;
                }
                let i = match w.name_order.get(k) {
                    Some(&i) if w.nodes[i].name == *name => {
                        k += 1;
                        Some(i)
                    }
                    _ => w.node_index(name),
                };
                found.push(i.map(|i| w.node_info(i)));
            }
            Ok(found)
        })
        .await
    }

    async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError> {
        self.kube(KubeCall::CachedRead, |w| {
            Ok(w.operations.get_mut(name).filter(|o| !o.finalized).map(|o| {
                o.seen = o.version;
                o.info.clone()
            }))
        })
        .await
    }

    async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError> {
        self.kube(KubeCall::CachedRead, |w| {
            Ok(w.operations.values().any(|o| o.info.identity == identity && !o.finalized))
        })
        .await
    }

    async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError> {
        self.kube(KubeCall::CachedRead, |w| {
            if name == w.cluster.name {
                // Every Node the simulated API server has: each is a machine's.
                let nodes = w.name_order.iter().filter(|&&i| !w.nodes[i].removed).map(|&i| w.nodes[i].name.clone());
                Ok(ClusterInfo { nodes: nodes.collect(), ..w.cluster.clone() })
            } else {
                Err(KubeError::NotFound(format!("TalosCluster {name}")))
            }
        })
        .await
    }

    async fn machines(&self, _cluster: &str) -> Result<Vec<Arc<MachineInfo>>, KubeError> {
        self.kube(KubeCall::CachedRead, |w| {
            // In name order, as the API server lists them. A removed machine's TalosMachine
            // outlives its Node, as in a real cluster: its conditions record the removal.
            let all: Vec<usize> = w.name_order.clone();
            Ok(all.into_iter().map(|i| w.machine_info(i)).collect())
        })
        .await
    }

    async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError> {
        self.kube(KubeCall::CachedRead, |w| Ok(w.storage_node(name).map(|i| MachineInfo::clone(&w.machine_info(i)))))
            .await
    }

    async fn write(&self, write: KubeWrite<'_>, _seal: Seal) -> Result<KubeWritten, KubeError> {
        self.serve_kube(write).await
    }

    async fn write_conditions(&self, write: ConditionWrite<'_>, _seal: Seal) -> Result<(), ConditionWriteError> {
        let ConditionWrite { machine, conditions, at } = write;
        self.write_machine_conditions(machine, at, conditions).await
    }

    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        self.kube(KubeCall::Read, |w| w.pods_on(node)).await
    }

    /// As the operator's pod store gives them: no request, the server's state (the
    /// simulated watch does not lag).
    async fn cached_pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        self.kube(KubeCall::CachedRead, |w| w.pods_on(node)).await
    }

    async fn preflight_facts(&self, asked: &[&str]) -> Result<ichor_upgrade_core::preflight::ClusterFacts, KubeError> {
        self.kube(KubeCall::Read, |w| Ok(w.preflight_facts(asked))).await
    }

    async fn node_kubernetes(&self, node: &str) -> Result<Option<NodeKubernetesInfo>, KubeError> {
        self.kube(KubeCall::CachedRead, |w| Ok(w.node_kubernetes(node))).await
    }

    async fn control_plane_pods(&self) -> Result<ichor_executor::kube_api::ControlPlanePods, KubeError> {
        self.kube(KubeCall::Read, |w| Ok(w.control_plane_pods())).await
    }

    async fn gate_objects(
        &self,
        objects: &ichor_upgrade_core::gate::GateObjects,
    ) -> Result<Vec<(String, serde_json::Value)>, KubeError> {
        self.kube(KubeCall::Read, |w| w.volume_objects(objects)).await
    }

    async fn alerts(
        &self,
        _source: &ichor_upgrade_core::gate::AlertSelector,
    ) -> Result<Vec<ichor_executor::kube_api::Alert>, KubeError> {
        // The monitoring stack answers as fast as the API server (one simulated peer).
        self.kube(KubeCall::Read, |w| Ok(w.alerts_now())).await
    }

    async fn silences(&self, _alertmanager: &str) -> Result<Vec<ichor_executor::kube_api::Silence>, KubeError> {
        self.kube(KubeCall::Read, |w| Ok(w.silences_now())).await
    }

    async fn put_silence(
        &self,
        _alertmanager: &str,
        silence: &ichor_executor::kube_api::Silence,
    ) -> Result<String, KubeError> {
        self.kube(KubeCall::Write, |w| Ok(w.put_silence(silence))).await
    }

    async fn cluster_kubernetes(&self) -> Result<ClusterKubernetesInfo, KubeError> {
        self.kube(KubeCall::Read, |w| {
            if w.bootstrap.reads_forbidden {
                return Err(KubeError::Forbidden(
                    "get /metrics: nonresourceURLs \"/metrics\" is forbidden for the operator's ServiceAccount"
                        .to_owned(),
                ));
            }
            Ok(w.cluster_kubernetes())
        })
        .await
    }

    async fn manifest_session(&self, kubeconfig: AdminKubeconfig) -> Result<Box<dyn ManifestSession + '_>, KubeError> {
        // The API server authenticates the admin kubeconfig's client certificate: the one
        // the control planes' Talos API gives, unless a test says it expired.
        // Making the client sends nothing yet.
        self.kube(KubeCall::CachedRead, |w| {
            if w.bootstrap.admin_refused || kubeconfig.expose() != w.admin_kubeconfig {
                return Err(KubeError::Refused(
                    "Unauthorized: the admin kubeconfig's client certificate is not accepted".to_owned(),
                ));
            }
            w.bootstrap.sessions += 1;
            Ok(())
        })
        .await?;
        Ok(Box::new(SimManifestSession { sim: self }))
    }

    async fn workload_rollout(
        &self,
        workload: &str,
    ) -> Result<ichor_upgrade_core::kubernetes::manifests::WorkloadRollout, KubeError> {
        self.kube(KubeCall::Read, |w| Ok(w.workload_rollout(workload))).await
    }

    async fn lease(&self, _cluster: &str) -> Result<Option<LeaseInfo>, KubeError> {
        self.kube(KubeCall::Read, |w| Ok(w.lease.clone())).await
    }

    async fn write_lease(&self, _cluster: &str, write: &LeaseWrite) -> Result<(), KubeError> {
        self.kube(KubeCall::LeaseWrite, |w| {
            let current = w.lease.as_ref().map(|l| l.resource_version.clone());
            if current != write.expected_resource_version {
                return Err(KubeError::Conflict("the Lease changed since it was read".to_owned()));
            }
            w.lease_version += 1;
            w.lease = Some(LeaseInfo {
                holder: write.holder.clone(),
                renewed_at: write.renewed_at,
                duration: write.duration,
                resource_version: w.lease_version.to_string(),
            });
            Ok(())
        })
        .await
    }

    async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError> {
        self.kube(KubeCall::StatusWrite, |w| {
            let Some(before) = w.operations.get(name).map(|o| o.info.status.clone()) else {
                return Err(KubeError::NotFound(format!("TalosOperation {name}")));
            };
            if w.operations.get(name).is_some_and(|o| o.seen != o.version) {
                w.counters.conflicts += 1;
                return Err(KubeError::Conflict(format!("TalosOperation {name} changed since it was read")));
            }
            trace_status_change(w, &before, status);
            let bytes = serde_json::to_vec(status).map_or(0, |v| v.len());
            w.counters.status_bytes_max = w.counters.status_bytes_max.max(bytes);
            if let Some(op) = w.operations.get_mut(name) {
                op.info.status = status.clone();
                op.version += 1;
                op.seen = op.version;
            }
            Ok(())
        })
        .await
    }

    async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError> {
        self.kube(KubeCall::Write, |w| match w.operations.get_mut(name) {
            Some(op) => {
                op.finalized = true;
                Ok(())
            }
            None => Err(KubeError::NotFound(format!("TalosOperation {name}"))),
        })
        .await
    }

    async fn event(&self, event: &Event) -> Result<(), KubeError> {
        self.kube(KubeCall::Event, |w| {
            w.events.push(event.clone());
            Ok(())
        })
        .await
    }
}

/// Failures, pauses, resumes, refusals and new reasons to wait, as the operation's status
/// records them, each with its reason and message
/// ([`ichor_upgrade_core::changes::status_changes`]).
fn trace_status_change(w: &mut World, before: &OperationStatus, after: &OperationStatus) {
    for change in ichor_upgrade_core::changes::status_changes(before, after) {
        let kind = super::trace::trace_kind(change.event);
        match change.machine {
            Some(name) => {
                if let Some(i) = w.node_index(&name) {
                    w.record_why(i, kind, Some((change.reason, change.message)));
                }
            }
            None => w.record_operation(kind, &change.reason, change.message),
        }
    }
}

/// The storage backend's writes, as the simulated Longhorn carries them out: what
/// [`StorageApi::write`] does, and what the simulator's tests call directly, with no
/// [`Seal`].
impl SimCluster {
    /// Turns storage scheduling on `node` on or off; on ends an evacuation in progress.
    /// Idempotent. Not an evacuation's write: the engine does not call it.
    ///
    /// # Errors
    /// The API server unreachable (an injected outage), or a node the storage system does
    /// not have.
    pub async fn set_scheduling(&self, node: &str, enabled: bool) -> Result<(), StorageError> {
        self.kube(KubeCall::StorageWrite, |w| {
            let i = w.storage_node(node).ok_or_else(|| KubeError::NotFound(format!("storage node {node}")))?;
            w.nodes[i].scheduling = enabled;
            w.changed(i);
            if enabled && w.nodes[i].evacuation.take().is_some() {
                w.record(i, TraceKind::EvacuationEnd);
            }
            Ok(())
        })
        .await
        .map_err(storage_error)
    }

    /// Turns storage scheduling on `node` off and asks for its replicas to move, keeping
    /// the node's scheduling from before (and `since`) beside it, as Longhorn's backend
    /// does: what [`StorageWrite::RequestEvacuation`] carries out. Idempotent; may arm the
    /// crash-on-evacuation fault.
    ///
    /// # Errors
    /// The API server unreachable (an injected outage).
    pub async fn request_evacuation(&self, node: &str, since: Timestamp) -> Result<EvacuationRequest, StorageError> {
        // Longhorn's backend reads its Node first (what to keep of its scheduling).
        let known = self.kube(KubeCall::Read, |w| Ok(w.storage_node(node).is_some())).await.map_err(storage_error)?;
        if !known {
            return Ok(EvacuationRequest::NoSuchNode);
        }
        self.with_world_untouched(|w| {
            if std::mem::take(&mut w.crash.on_next_evacuation) {
                w.arm_crash(1, false);
            }
        });
        self.kube(KubeCall::StorageWrite, |w| {
            let i = w.storage_node(node).ok_or_else(|| KubeError::NotFound(format!("storage node {node}")))?;
            // What it was before the first request is kept beside it, as Longhorn's
            // backend keeps it in an annotation written with the same patch.
            let n = &mut w.nodes[i];
            let now = Scheduling { allowed: n.scheduling, eviction_requested: n.evacuation.is_some() };
            let bytes = Some(n.drawn.bytes_left(n.replicas));
            let before =
                n.storage_record.get_or_insert(EvacuationRecord { before: now, since: Some(since), bytes }).before;
            // Scheduling off and the eviction asked for, as Longhorn's one patch does.
            n.scheduling = false;
            if n.evacuation.is_some() {
                return Ok(EvacuationRequest::Requested { before });
            }
            let n = &w.nodes[i];
            let next_move_at = if n.stuck || n.replicas == 0 {
                None
            } else {
                let k = n.drawn.replica_moves.len().saturating_sub(n.replicas as usize);
                Some(w.now.saturating_add(secs(n.drawn.replica_moves.get(k).copied().unwrap_or(10))))
            };
            let empty = n.replicas == 0;
            w.nodes[i].evacuation = Some(Evacuation { next_move_at });
            w.changed(i);
            w.record(i, TraceKind::EvacuationStart);
            if let Some(started) = w.trace.last_mut() {
                started.bytes = bytes;
            }
            if empty {
                w.record(i, TraceKind::Evacuated);
            }
            Ok(EvacuationRequest::Requested { before })
        })
        .await
        .map_err(storage_error)
    }

    /// Puts `node`'s scheduling back as `before` and drops the kept record: what
    /// [`StorageWrite::RestoreScheduling`] carries out. Idempotent; a node the storage
    /// system no longer has is done.
    ///
    /// # Errors
    /// The API server unreachable (an injected outage).
    pub async fn restore_scheduling(&self, node: &str, before: Scheduling) -> Result<(), StorageError> {
        self.kube(KubeCall::StorageWrite, |w| {
            // A node the storage system no longer has: nothing to put back.
            let Some(i) = w.storage_node(node) else { return Ok(()) };
            let n = &mut w.nodes[i];
            n.scheduling = before.allowed;
            n.storage_record = None;
            let ended = !before.eviction_requested && n.evacuation.take().is_some();
            w.changed(i);
            if ended {
                w.record(i, TraceKind::EvacuationEnd);
            }
            Ok(())
        })
        .await
        .map_err(storage_error)
    }
}

#[async_trait]
impl StorageReads for SimCluster {
    async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError> {
        self.kube(KubeCall::CachedRead, |w| Ok(w.storage_objects.clone())).await.map_err(storage_error)
    }

    async fn evacuation_record(&self, node: &str) -> Result<Option<EvacuationRecord>, StorageError> {
        self.kube(KubeCall::Read, |w| Ok(w.storage_node(node).and_then(|i| w.nodes[i].storage_record)))
            .await
            .map_err(storage_error)
    }

    async fn replicas_on(&self, node: &str) -> Result<u32, StorageError> {
        self.kube(KubeCall::Read, |w| {
            w.storage_node(node)
                .map(|i| w.nodes[i].replicas)
                .ok_or_else(|| KubeError::NotFound(format!("storage node {node}")))
        })
        .await
        .map_err(storage_error)
    }

    async fn backing_images_on(&self, _node: &str) -> Result<u32, StorageError> {
        // Backing images are not modelled: none has a file anywhere (one read, as
        // Longhorn's backend lists them).
        self.kube(KubeCall::Read, |_| Ok(0)).await.map_err(storage_error)
    }
}

#[async_trait]
impl StorageApi for SimCluster {
    async fn write(&self, write: StorageWrite<'_>, _seal: Seal) -> Result<StorageWritten, StorageError> {
        Ok(match write {
            StorageWrite::RequestEvacuation { node, since } => {
                StorageWritten::Requested(self.request_evacuation(node, since).await?)
            }
            StorageWrite::RestoreScheduling { node, before } => {
                self.restore_scheduling(node, before).await?;
                StorageWritten::Restored
            }
        })
    }
}

fn storage_error(e: KubeError) -> StorageError {
    StorageError { transient: e.is_transient(), message: e.to_string() }
}

impl Clock for SimCluster {
    fn now(&self) -> Timestamp {
        let mut w = self.lock();
        w.sync_clock();
        w.now
    }
}
