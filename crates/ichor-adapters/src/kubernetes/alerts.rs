//! The monitoring stack an alert gate names, over HTTP: Alertmanager's API v2 (its alerts,
//! its silences, a silence created or extended) and Prometheus's `/api/v1/alerts`. Each
//! call is bounded by the caller (the executor's call timeout); an answer that cannot be
//! read, a connection refused and a 5xx are [`KubeError::Unreachable`] (the gate waits),
//! any other refusal [`KubeError::Refused`] with what the server said.

use std::sync::OnceLock;

use ichor_executor::kube_api::{Alert, KubeError, Metadata, Silence, SilenceMatcher};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::gate::AlertSelector;
use k8s_openapi::jiff;
use serde::{Deserialize, Serialize};

/// One client for every monitoring call (its connections pooled).
fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        crate::snapshot_store::ensure_tls_provider();
        reqwest::Client::builder().user_agent(concat!("ichor/", env!("CARGO_PKG_VERSION"))).build().unwrap_or_default()
    })
}

/// The alerts of `source`, unfiltered: Alertmanager's active, silenced and inhibited ones
/// (with the silences that cover each), or Prometheus's firing ones.
///
/// # Errors
/// The source unreachable or its answer unreadable ([`KubeError::Unreachable`]), or a
/// refusal.
pub async fn alerts(source: &AlertSelector) -> Result<Vec<Alert>, KubeError> {
    if let Some(base) = &source.alertmanager {
        let url = format!("{}/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true", trim(base));
        let found: Vec<AmAlert> = get(&url).await?;
        return Ok(found
            .into_iter()
            .map(|a| Alert { labels: a.labels, silenced_by: a.status.silenced_by, since: a.starts_at })
            .collect());
    }
    if let Some(base) = &source.prometheus {
        let url = format!("{}/api/v1/alerts", trim(base));
        let found: PromAnswer = get(&url).await?;
        return Ok(found
            .data
            .alerts
            .into_iter()
            .filter(|a| a.state == "firing")
            .map(|a| Alert { labels: a.labels, silenced_by: Vec::new(), since: a.active_at.unwrap_or_default() })
            .collect());
    }
    Err(KubeError::Refused("an alert gate names no source".to_owned()))
}

/// Every silence of the Alertmanager at `base`, expired ones included.
///
/// # Errors
/// As [`alerts`]; a silence whose times do not read.
pub async fn silences(base: &str) -> Result<Vec<Silence>, KubeError> {
    let found: Vec<AmSilence> = get(&format!("{}/api/v2/silences", trim(base))).await?;
    found
        .into_iter()
        .map(|s| {
            Ok(Silence {
                id: Some(s.id),
                matchers: s
                    .matchers
                    .into_iter()
                    .map(|m| SilenceMatcher {
                        name: m.name,
                        value: m.value,
                        is_regex: m.is_regex,
                        is_equal: m.is_equal.unwrap_or(true),
                    })
                    .collect(),
                starts_at: time(&s.starts_at)?,
                ends_at: time(&s.ends_at)?,
                created_by: s.created_by,
                comment: s.comment,
                active: s.status.state == "active",
            })
        })
        .collect()
}

/// Creates `silence` (no ID) or updates it in place (its ID): the ID Alertmanager gives.
///
/// # Errors
/// As [`alerts`].
pub async fn put_silence(base: &str, silence: &Silence) -> Result<String, KubeError> {
    let body = PostSilence {
        id: silence.id.clone(),
        matchers: silence
            .matchers
            .iter()
            .map(|m| AmMatcher {
                name: m.name.clone(),
                value: m.value.clone(),
                is_regex: m.is_regex,
                is_equal: Some(m.is_equal),
            })
            .collect(),
        starts_at: silence.starts_at.rfc3339(),
        ends_at: silence.ends_at.rfc3339(),
        created_by: silence.created_by.clone(),
        comment: silence.comment.clone(),
    };
    let url = format!("{}/api/v2/silences", trim(base));
    let body = serde_json::to_vec(&body).map_err(|e| KubeError::Refused(format!("a silence does not encode: {e}")))?;
    let answer = client()
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| unreachable(&url, &e))?;
    let posted: PostedSilence = read(&url, answer).await?;
    Ok(posted.silence_id)
}

fn trim(base: &str) -> &str {
    base.trim_end_matches('/')
}

fn time(text: &str) -> Result<Timestamp, KubeError> {
    let parsed: jiff::Timestamp =
        text.parse().map_err(|e| KubeError::Unreachable(format!("a silence's time {text:?} does not read: {e}")))?;
    Ok(Timestamp::from_unix_millis(parsed.as_millisecond()))
}

async fn get<T: serde::de::DeserializeOwned>(url: &str) -> Result<T, KubeError> {
    let answer = client().get(url).send().await.map_err(|e| unreachable(url, &e))?;
    read(url, answer).await
}

async fn read<T: serde::de::DeserializeOwned>(url: &str, answer: reqwest::Response) -> Result<T, KubeError> {
    let status = answer.status();
    let body = answer.bytes().await.map_err(|e| unreachable(url, &e))?;
    if !status.is_success() {
        let said = String::from_utf8_lossy(&body).chars().take(300).collect::<String>();
        let message = format!("{url} answered {status}: {}", said.trim());
        return Err(if status.is_server_error() || status.as_u16() == 429 {
            KubeError::Unreachable(message)
        } else {
            KubeError::Refused(message)
        });
    }
    serde_json::from_slice(&body).map_err(|e| KubeError::Unreachable(format!("{url}: the answer does not read: {e}")))
}

fn unreachable(url: &str, error: &reqwest::Error) -> KubeError {
    KubeError::Unreachable(format!("{url}: {}", ichor_executor::report(error)))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AmAlert {
    #[serde(default)]
    labels: Metadata,
    #[serde(default)]
    starts_at: String,
    status: AmAlertStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AmAlertStatus {
    #[serde(default)]
    silenced_by: Vec<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct AmMatcher {
    name: String,
    value: String,
    is_regex: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    is_equal: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AmSilence {
    id: String,
    matchers: Vec<AmMatcher>,
    starts_at: String,
    ends_at: String,
    #[serde(default)]
    created_by: String,
    #[serde(default)]
    comment: String,
    status: AmSilenceStatus,
}

#[derive(Deserialize)]
struct AmSilenceStatus {
    state: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PostSilence {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    matchers: Vec<AmMatcher>,
    starts_at: String,
    ends_at: String,
    created_by: String,
    comment: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PostedSilence {
    #[serde(rename = "silenceID")]
    silence_id: String,
}

#[derive(Deserialize)]
struct PromAnswer {
    data: PromData,
}

#[derive(Deserialize)]
struct PromData {
    #[serde(default)]
    alerts: Vec<PromAlert>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromAlert {
    #[serde(default)]
    labels: Metadata,
    state: String,
    #[serde(default)]
    active_at: Option<String>,
}
