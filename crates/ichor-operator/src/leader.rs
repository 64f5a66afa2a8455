//! Leader election between replicas on a `coordination.k8s.io/v1` Lease, fenced.
//!
//! Only the leader reconciles. The rules are client-go's: the holder renews every
//! `renew_every`; another replica takes the Lease over only after it has seen the same
//! record (resourceVersion) unchanged for a whole `duration` of its own clock (no
//! comparison of clocks between machines), and only by a write under that
//! resourceVersion, so of two replicas racing for it one gets a conflict.
//!
//! What client-go leaves to the caller, and kube-rs's lease crates leave out, is the
//! fence: a leader whose renewals fail keeps believing it leads. Here leadership is a
//! deadline, not a flag: [`Leadership::is_leader`] is true only until `duration - margin`
//! after the start of the last renewal that succeeded. A replica cut off from the API
//! server stops starting passes before any other can have taken over, because the other
//! waits a whole `duration` from when it first saw that renewal. A pass already running
//! when the deadline passes runs to its end; the engine's own writes are all under
//! resourceVersion preconditions, so a pass that raced a new leader fails on a conflict
//! rather than acting twice.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

/// The field manager of the leader Lease's writes.
const FIELD_MANAGER: &str = "ichor-leader";

/// How the election runs.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (its pod name, or host and process).
    pub identity: String,
    /// How long a Lease not renewed stays with its holder.
    pub duration: Duration,
    /// How often the leader renews.
    pub renew_every: Duration,
    /// How often a follower looks at the Lease, and a failed renewal is retried.
    pub retry_every: Duration,
    /// How much before the Lease could be taken over the leader stops starting passes.
    pub margin: Duration,
}

impl ElectionConfig {
    /// The defaults: a 15 s Lease renewed every 5 s, looked at every 2 s, the leader
    /// stepping down 3 s before it could be taken over.
    #[must_use]
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            retry_every: Duration::from_secs(2),
            margin: Duration::from_secs(3),
        }
    }
}

/// This replica's part in the election, run by a task of its own until [`Leadership::step_down`].
#[derive(Debug)]
pub struct Leadership {
    /// Until when this replica leads (`None`: it does not).
    until: watch::Receiver<Option<Instant>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Starts taking part in the election.
    #[must_use]
    pub fn start(client: Client, config: ElectionConfig) -> Self {
        let (until_tx, until) = watch::channel(None);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(elect(Api::namespaced(client, &config.namespace), config, until_tx, stopped));
        Self { until, stop, task }
    }

    /// Whether this replica leads now.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        leads(*self.until.borrow())
    }

    /// The leadership's deadline, to watch for changes.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Option<Instant>> {
        self.until.clone()
    }

    /// Stops taking part without releasing anything, as a process that dies does: the
    /// Lease stays with this replica until it expires.
    pub fn abandon(self) {
        self.task.abort();
    }

    /// Leaves the election: stops renewing and, when leading, releases the Lease so that
    /// another replica takes over at its next look rather than after the Lease expires.
    pub async fn step_down(self) {
        self.stop.send(true).ok();
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "the election task ended badly");
        }
    }
}

/// Whether a deadline is still ahead.
#[must_use]
pub fn leads(until: Option<Instant>) -> bool {
    until.is_some_and(|t| Instant::now() < t)
}

/// What a follower last saw of the Lease: its resourceVersion and since when.
struct Seen {
    version: String,
    since: Instant,
}

enum Look {
    /// The Lease is ours, renewed by a write that started at this instant.
    Ours(Instant),
    /// Another replica holds it.
    Theirs(String),
}

async fn elect(
    api: Api<Lease>,
    config: ElectionConfig,
    until: watch::Sender<Option<Instant>>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut seen: Option<Seen> = None;
    let mut leading = false;
    loop {
        let pause = match look(&api, &config, &mut seen).await {
            Ok(Look::Ours(started)) => {
                let deadline = started + config.duration.saturating_sub(config.margin);
                until.send_replace(Some(deadline));
                if !leading {
                    tracing::info!(identity = %config.identity, lease = %config.name, "leading");
                    leading = true;
                }
                config.renew_every
            }
            Ok(Look::Theirs(holder)) => {
                until.send_replace(None);
                if leading {
                    tracing::warn!(identity = %config.identity, %holder, "no longer leading: the Lease is another's");
                    leading = false;
                }
                config.retry_every
            }
            Err(e) => {
                // The deadline stands: leadership runs out by itself if this goes on.
                tracing::warn!(identity = %config.identity, error = %e, "leader election: the Lease could not be read or written");
                config.retry_every
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stopped.changed() => break,
        }
    }
    until.send_replace(None);
    if leading {
        match release(&api, &config).await {
            Ok(()) => tracing::info!(identity = %config.identity, "released the leader Lease"),
            Err(e) => {
                tracing::warn!(identity = %config.identity, error = %e, "the leader Lease was not released; it expires")
            }
        }
    }
}

fn now_micro() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

fn record(config: &ElectionConfig, version: Option<String>, acquire: Option<MicroTime>) -> Lease {
    let seconds = i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX);
    Lease {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            namespace: Some(config.namespace.clone()),
            resource_version: version,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(acquire.unwrap_or_else(now_micro)),
            renew_time: Some(now_micro()),
            ..LeaseSpec::default()
        }),
    }
}

fn params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PostParams::default() }
}

/// One look at the Lease: renew it when ours, take it when free or expired.
async fn look(api: &Api<Lease>, config: &ElectionConfig, seen: &mut Option<Seen>) -> Result<Look, kube::Error> {
    let started = Instant::now();
    let Some(lease) = api.get_opt(&config.name).await? else {
        return match api.create(&params(), &record(config, None, None)).await {
            Ok(_) => Ok(Look::Ours(started)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Look::Theirs("(created meanwhile)".to_owned())),
            Err(e) => Err(e),
        };
    };
    let version = lease.resource_version().unwrap_or_default();
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let ours = holder.as_deref() == Some(config.identity.as_str());
    if !ours && let Some(holder) = &holder {
        // Expired only after the same record was seen for a whole duration of our clock.
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(config.duration, Duration::from_secs);
        let since = match seen {
            Some(s) if s.version == version => s.since,
            _ => {
                *seen = Some(Seen { version: version.clone(), since: started });
                started
            }
        };
        if started.duration_since(since) < duration {
            return Ok(Look::Theirs(holder.clone()));
        }
        tracing::info!(identity = %config.identity, previous = %holder, "the leader Lease expired; taking it over");
    }
    let acquire = if ours { spec.acquire_time.clone() } else { None };
    match api.replace(&config.name, &params(), &record(config, Some(version), acquire)).await {
        Ok(_) => {
            *seen = None;
            Ok(Look::Ours(started))
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            Ok(Look::Theirs(holder.unwrap_or_else(|| "(taken meanwhile)".to_owned())))
        }
        Err(e) => Err(e),
    }
}

/// Gives the Lease up: no holder, so that the next look of any replica takes it.
async fn release(api: &Api<Lease>, config: &ElectionConfig) -> Result<(), kube::Error> {
    let Some(lease) = api.get_opt(&config.name).await? else { return Ok(()) };
    let spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    let released = Lease {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            namespace: Some(config.namespace.clone()),
            resource_version: lease.resource_version(),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(now_micro()),
            ..LeaseSpec::default()
        }),
    };
    api.replace(&config.name, &params(), &released).await.map(drop)
}
