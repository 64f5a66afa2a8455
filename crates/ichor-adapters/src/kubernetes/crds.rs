//! Whether the API server has a custom resource's definition, followed by a watch of that
//! one CRD ([`CrdPresence`]): Longhorn's kinds are looked for once, and again the moment
//! their CRDs appear or go, never per machine.
//!
//! The watch asks for the CRD by name (`fieldSelector=metadata.name=<name>`), which RBAC
//! authorises against a rule's `resourceNames`: the operator reads no other CRD. Until its
//! first list, or while it cannot list (a grant missing), the presence is unknown and its
//! readers ask the API server as they did before it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher;

use super::watches::engine_watcher;

const UNKNOWN: u8 = 0;
const ABSENT: u8 = 1;
const PRESENT: u8 = 2;

/// Whether one CRD exists, as its watch last said.
#[derive(Debug, Clone)]
pub struct CrdPresence {
    name: &'static str,
    state: Arc<AtomicU8>,
}

impl CrdPresence {
    /// The CRD `name` (such as `nodes.longhorn.io`), followed by a watch a task of its own
    /// drives. It carries no authority and writes nothing.
    #[must_use]
    pub fn watch(client: &kube::Client, name: &'static str) -> Self {
        let state = Arc::new(AtomicU8::new(UNKNOWN));
        let api: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let shared = Arc::clone(&state);
        let mut listed_one = false;
        // As every watch of the engine: a 410 relists at once, other errors back off.
        let events = engine_watcher(api, config);
        tokio::spawn(events.for_each(move |event| {
            match event {
                Ok(watcher::Event::Init) => listed_one = false,
                Ok(watcher::Event::InitApply(_)) => listed_one = true,
                Ok(watcher::Event::InitDone) => {
                    shared.store(if listed_one { PRESENT } else { ABSENT }, Ordering::SeqCst)
                }
                Ok(watcher::Event::Apply(_)) => {
                    if shared.swap(PRESENT, Ordering::SeqCst) == ABSENT {
                        tracing::info!(crd = name, "the CRD appeared: its objects are read from now on");
                    }
                }
                Ok(watcher::Event::Delete(_)) => shared.store(ABSENT, Ordering::SeqCst),
                Err(e) => tracing::debug!(crd = name, error = %e, "CRD watch error; retried after its backoff"),
            }
            std::future::ready(())
        }));
        Self { name, state }
    }

    /// A presence that is always `answer` (`None`: unknown), for tests and for clients
    /// that do not watch.
    #[must_use]
    pub fn fixed(name: &'static str, answer: Option<bool>) -> Self {
        let state = match answer {
            None => UNKNOWN,
            Some(false) => ABSENT,
            Some(true) => PRESENT,
        };
        Self { name, state: Arc::new(AtomicU8::new(state)) }
    }

    /// The CRD's name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether the CRD exists: `None` until the watch has listed it once.
    #[must_use]
    pub fn exists(&self) -> Option<bool> {
        match self.state.load(Ordering::SeqCst) {
            ABSENT => Some(false),
            PRESENT => Some(true),
            _ => None,
        }
    }
}
