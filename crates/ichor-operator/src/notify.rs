//! The notifier: sends each operation's notices ([`crate::notices`]) to its cluster's
//! receivers (`spec.notifications`), keeping its outbox in the operation's status
//! (`status.notifications`, field manager [`FIELD_MANAGER`]; decision 0019).
//!
//! **Authority.** The leader's, like every write of the operator: a loop beside the
//! passes, [`INTERVAL`] apart, that does nothing on a replica that does not lead, re-checks
//! the fence before each write of the outbox and again before each request to a receiver,
//! and forgets what it remembers once the lease lapses. It never touches a machine, a
//! Node, a lock or anything of the engine's: what it reads is the operation's status as
//! the passes wrote it, so a hold, a pause or a deletion made at any instant is told at
//! the next tick (a deleted operation's outbox goes with it).
//!
//! **Once, in order.** A notice's record goes `Pending` → `Sending` (written before the
//! request) → `Delivered` (written after a 2xx) or `Pending` again after a backoff, and
//! `GaveUp` after `giveUpAfterSeconds` (with a Warning Event on the operation). A receiver
//! gets a sink's notices one at a time, in order, each with the header `Ichor-Event-Id`. A
//! leader that dies between the receiver's 2xx and the `Delivered` write leaves `Sending`:
//! the next one sends that notice again, with the same id, for the receiver to drop. That
//! is the one window; nothing owed is ever lost.
//!
//! **The URL** is read from its Secret at each attempt, never logged, never written: an
//! error names the Secret, and an HTTP client's error is said without its URL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ichor_adapters::kubernetes::crd::{
    NotificationRecord, NotificationSink, NotificationsSpec, NotificationsStatus, TalosCluster, TalosOperation,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};

use crate::fence::Fence;
use crate::notices::{self, DELIVERED, GAVE_UP};

/// The field manager of `status.notifications`.
pub const FIELD_MANAGER: &str = "ichor-notify";

/// How often the notifier looks for notices owed and due.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How long one request to a receiver may take.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The header that carries a notice's id, for a receiver to drop one it got already.
pub const EVENT_ID_HEADER: &str = "Ichor-Event-Id";

/// What the notifier reads and writes with.
pub struct Notifier {
    client: Client,
    operations: Store<TalosOperation>,
    clusters: Store<TalosCluster>,
    fence: Fence,
    http: reqwest::Client,
    /// Each operation's outbox (by uid) as this replica last wrote it, or read it fresh
    /// when it first met the operation while leading: never the watch's copy, which may
    /// be behind its own last write.
    outboxes: Mutex<HashMap<String, NotificationsStatus>>,
}

/// Why a tick of one operation stopped early (it goes on at the next).
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("this replica no longer leads")]
    NotLeading,
    #[error("the operation is gone")]
    Gone,
    #[error("the API server: {0}")]
    Api(kube::Error),
}

impl Notifier {
    /// A notifier over the operator's stores, writing under `fence`.
    ///
    /// # Panics
    /// If the HTTP client cannot be built (no TLS root store on the machine).
    #[must_use]
    pub fn new(client: Client, operations: Store<TalosOperation>, clusters: Store<TalosCluster>, fence: Fence) -> Self {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Ring is the only provider in this build; losing a race to install it is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let http = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .connect_timeout(SEND_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client for the notifications");
        Self { client, operations, clusters, fence, http, outboxes: Mutex::new(HashMap::new()) }
    }

    /// Runs for ever, a tick each [`INTERVAL`].
    pub async fn run(mut self) {
        loop {
            tokio::time::sleep(INTERVAL).await;
            self.tick().await;
        }
    }

    /// One look at every operation whose cluster has receivers: the operations side by
    /// side, and each one's receivers side by side, so that a receiver that never answers
    /// delays the others by one attempt's bound at most.
    pub async fn tick(&mut self) {
        if !self.fence.leads() {
            self.outboxes.lock().unwrap_or_else(PoisonError::into_inner).clear();
            return;
        }
        let operations = self.operations.state();
        let mut tended = Vec::new();
        for op in &operations {
            let namespace = op.namespace().unwrap_or_default();
            let cluster = ObjectRef::<TalosCluster>::new(&op.spec.cluster).within(&namespace);
            let Some(cluster) = self.clusters.get(&cluster) else { continue };
            let Some(spec) = cluster.spec.notifications.clone().filter(|n| !n.sinks.is_empty()) else { continue };
            let Some(uid) = op.uid().filter(|_| !op.spec.dry_run) else { continue };
            let neighbours: Vec<Arc<TalosOperation>> =
                operations.iter().filter(|o| o.namespace().as_deref() == Some(&namespace)).cloned().collect();
            tended.push((Arc::clone(op), uid, neighbours, spec));
        }
        let this = &*self;
        futures::future::join_all(tended.iter().map(|(op, uid, neighbours, spec)| async move {
            if let Err(stop) = this.tend(op, uid, neighbours, spec).await {
                // Read fresh next time: what was written is not known.
                this.outboxes.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
                if !matches!(stop, Stop::NotLeading | Stop::Gone) {
                    let namespace = op.namespace().unwrap_or_default();
                    tracing::warn!(%namespace, operation = %op.name_any(), error = %stop, "notifications: tick stopped");
                }
            }
        }))
        .await;
        let seen: Vec<&String> = tended.iter().map(|(_, uid, _, _)| uid).collect();
        self.outboxes.lock().unwrap_or_else(PoisonError::into_inner).retain(|uid, _| seen.contains(&uid));
    }

    /// `op`'s notices owed recorded, then its due ones sent, each sink's in order.
    async fn tend(
        &self,
        op: &Arc<TalosOperation>,
        uid: &str,
        neighbours: &[Arc<TalosOperation>],
        spec: &NotificationsSpec,
    ) -> Result<(), Stop> {
        let namespace = op.namespace().unwrap_or_default();
        let api: Api<TalosOperation> = Api::namespaced(self.client.clone(), &namespace);
        let remembered = self.outboxes.lock().unwrap_or_else(PoisonError::into_inner).get(uid).cloned();
        let (op, kept) = match remembered {
            Some(outbox) => (Arc::clone(op), outbox),
            None => {
                let fresh = api.get_opt(&op.name_any()).await.map_err(Stop::Api)?.ok_or(Stop::Gone)?;
                if fresh.uid().as_deref() != Some(uid) {
                    return Err(Stop::Gone);
                }
                let outbox = fresh.status.as_ref().and_then(|s| s.notifications.clone()).unwrap_or_default();
                self.outboxes.lock().unwrap_or_else(PoisonError::into_inner).insert(uid.to_owned(), outbox.clone());
                (Arc::new(fresh), outbox)
            }
        };
        let now = Timestamp::now();
        let waiting = notices::waiting(&op, kept.waiting.as_ref(), now);
        let waiting_after = spec.waiting_after_seconds.unwrap_or(notices::DEFAULT_WAITING_AFTER_SECONDS);
        let owed = notices::owed(&op, neighbours, waiting.as_ref(), waiting_after, now);
        let outbox = notices::merged(&kept, &owed, spec, waiting, now);
        if outbox != kept {
            self.write(&api, &op, uid, &outbox).await?;
        }
        // One outbox, its writes one at a time; the requests side by side.
        let outbox = tokio::sync::Mutex::new(outbox);
        let sent = spec.sinks.iter().map(|sink| self.drain(&api, &op, uid, &outbox, sink, spec));
        futures::future::join_all(sent).await.into_iter().collect()
    }

    /// Sends `sink`'s due notices of `op`, in order, until one fails (its next attempt is
    /// due later) or none is due.
    async fn drain(
        &self,
        api: &Api<TalosOperation>,
        op: &TalosOperation,
        uid: &str,
        outbox: &tokio::sync::Mutex<NotificationsStatus>,
        sink: &NotificationSink,
        spec: &NotificationsSpec,
    ) -> Result<(), Stop> {
        let give_up = spec.give_up_after_seconds.unwrap_or(notices::DEFAULT_GIVE_UP_AFTER_SECONDS);
        loop {
            let (i, record) = {
                let mut outbox = outbox.lock().await;
                let Some(i) = notices::due(&outbox, &sink.name, Timestamp::now()) else { return Ok(()) };
                outbox.records[i] = notices::sending(&outbox.records[i]);
                self.write(api, op, uid, &outbox).await?;
                (i, outbox.records[i].clone())
            };
            if !self.fence.leads() {
                // Left Sending: the next leader sends it.
                return Err(Stop::NotLeading);
            }
            let answer = self.post(&op.namespace().unwrap_or_default(), sink, &record, op).await;
            let record = notices::answered(&record, answer, give_up, Timestamp::now());
            {
                let mut outbox = outbox.lock().await;
                outbox.records[i] = record.clone();
                self.write(api, op, uid, &outbox).await?;
            }
            match record.state.as_str() {
                DELIVERED => {}
                GAVE_UP => self.gave_up(op, &record).await,
                // Its next attempt is due later; the notices after it wait.
                _ => return Ok(()),
            }
        }
    }

    /// Writes `outbox` as `op`'s `status.notifications`, under the fence.
    async fn write(
        &self,
        api: &Api<TalosOperation>,
        op: &TalosOperation,
        uid: &str,
        outbox: &NotificationsStatus,
    ) -> Result<(), Stop> {
        if !self.fence.leads() {
            return Err(Stop::NotLeading);
        }
        let patch = serde_json::json!({
            "apiVersion": "ichor.dev/v1alpha1",
            "kind": "TalosOperation",
            // Only this operation: a namesake made since is not written.
            "metadata": { "name": op.name_any(), "uid": uid },
            "status": { "notifications": outbox },
        });
        match api.patch_status(&op.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await
        {
            Ok(_) => {
                self.outboxes.lock().unwrap_or_else(PoisonError::into_inner).insert(uid.to_owned(), outbox.clone());
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Err(Stop::Gone),
            Err(e) => Err(Stop::Api(e)),
        }
    }

    /// One attempt to send `record` to `sink`: `Ok` for a 2xx, else why not (never the
    /// URL).
    async fn post(
        &self,
        namespace: &str,
        sink: &NotificationSink,
        record: &NotificationRecord,
        op: &TalosOperation,
    ) -> Result<(), String> {
        let url = self.url(namespace, sink).await?;
        let body = serde_json::to_vec(&notices::body(sink.type_, record, op)).map_err(|e| e.to_string())?;
        let sent = self
            .http
            .post(url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(EVENT_ID_HEADER, record.id.as_str())
            .body(body)
            .send()
            .await;
        match sent {
            Ok(answer) if answer.status().is_success() => Ok(()),
            Ok(answer) => Err(format!("the receiver answered {}", answer.status())),
            Err(e) => Err(format!("not sent: {}", chain(&e.without_url()))),
        }
    }

    /// The receiver's URL, from its Secret.
    async fn url(&self, namespace: &str, sink: &NotificationSink) -> Result<String, String> {
        let secret = &sink.url_secret;
        let named = format!("Secret {namespace}/{} (sink {})", secret.name, sink.name);
        let found = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(&secret.name)
            .await
            .map_err(|e| format!("reading {named}: {e}"))?
            .ok_or_else(|| format!("{named} not found"))?;
        let bytes = found
            .data
            .as_ref()
            .and_then(|d| d.get(&secret.key))
            .ok_or_else(|| format!("{named} has no key {}", secret.key))?;
        let url = String::from_utf8(bytes.0.clone()).map_err(|_| format!("{named}: key {} is not text", secret.key))?;
        let url = url.trim().to_owned();
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(format!("{named}: key {} is not an http(s) URL", secret.key));
        }
        Ok(url)
    }

    /// A Warning Event on `op`: a notice was given up.
    async fn gave_up(&self, op: &TalosOperation, record: &NotificationRecord) {
        tracing::warn!(
            namespace = %op.namespace().unwrap_or_default(),
            operation = %op.name_any(),
            id = %record.id,
            sink = %record.sink,
            attempts = record.attempts,
            "notification given up"
        );
        let reporter = Reporter { controller: "ichor-operator".to_owned(), instance: None };
        let recorder = Recorder::new(self.client.clone(), reporter);
        let event = Event {
            type_: EventType::Warning,
            reason: "NotificationGivenUp".to_owned(),
            note: Some(
                format!(
                    "{} notice {} to sink {} given up after {} attempts: {}",
                    record.event,
                    record.id,
                    record.sink,
                    record.attempts,
                    record.last_error.as_deref().unwrap_or_default()
                )
                .chars()
                .take(1000)
                .collect(),
            ),
            action: "Notify".to_owned(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &op.object_ref(&())).await {
            tracing::warn!(error = %e, "could not record the Event of a notice given up");
        }
    }
}

/// `error` and its sources, `: `-separated.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}
