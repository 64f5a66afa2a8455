//! How the engine runs every watch: a quick backoff, a "410 Gone" not backed off, errors
//! logged and dropped from trigger streams.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::Resource;
use kube::api::Api;
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::{WatchStreamExt, watcher};

/// The backoff of every watch of the engine: 100 ms doubling to at most 2 s, back to
/// 100 ms after 10 s without an error. kube-rs's default climbs to 30 s, and a 410 Gone
/// after the API server comes back is one more error waited out: a rollout resumed 44 to
/// 56 s after its API server restarted (on Talos, the API server the operator talks to
/// restarts with every control-plane reboot). The cost while the server is down: about one
/// request per watch every 2 s.
#[must_use]
pub fn watch_backoff() -> impl Backoff {
    ResetTimerBackoff::new(QuickBackoff::new(), Duration::from_secs(10))
}

/// A watch of `api` as the engine runs all of its watches. A "410 Gone" (the watch's
/// resourceVersion expired, as every watch's does across an API server restart) is not
/// backed off: the watcher has already dropped its place, and relists at once. Every
/// other error is retried after [`watch_backoff`]. (kube-runtime logs each at debug.)
pub fn engine_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, config).filter(|event| std::future::ready(!is_expired(event))).backoff(watch_backoff())
}

/// Whether `event` is a watch's "410 Gone", after which kube-runtime's watcher starts over
/// with a fresh list (only that error resets it: a 410 answered to a watch's start leaves
/// it where it was, and is backed off like any other).
pub(crate) fn is_expired<K>(event: &watcher::Result<watcher::Event<K>>) -> bool {
    matches!(event, Err(watcher::Error::WatchError(status)) if status.code == 410)
}

/// `stream` without its errors, each logged: every watch retries after its own backoff
/// ([`engine_watcher`]), and a consumer that backs its merged streams off once more (a
/// controller's trigger backoff) would hold every watch for the error of one. After an
/// API server restart that added 2 s per watch's 410, one after another: 9 to 10 s.
pub fn without_errors<K: Send + 'static>(
    stream: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) -> BoxStream<'static, Result<K, watcher::Error>> {
    stream
        .filter(|event| {
            if let Err(e) = event {
                tracing::debug!(error = %e, "watch error; retried after its backoff");
            }
            std::future::ready(event.is_ok())
        })
        .boxed()
}

/// 100 ms doubling to 2 s, for ever ([`watch_backoff`]).
#[derive(Debug, Clone)]
pub(crate) struct QuickBackoff {
    next: Duration,
}

impl QuickBackoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(2);

    pub(crate) fn new() -> Self {
        Self { next: Self::MIN }
    }
}

impl Iterator for QuickBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(delay)
    }
}

impl Backoff for QuickBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}
