//! Notifications end to end (issue 55 item 5): two operator replicas on the API server and
//! the simulated fleet, a webhook and a Slack-compatible receiver on loopback that is down
//! for a while, and the leader killed with notices still owed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::operator_e2e::{Scene, leader, upgrade_calls};
use crate::support::eventually;
use ichor_adapters::kubernetes::crd::{TalosCluster, TalosOperation};
use ichor_sim::fleet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request a receiver took: its path, its `Ichor-Event-Id` and its body.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    path: String,
    id: String,
    body: serde_json::Value,
}

/// A receiver on loopback: on a path that is up, answers 200 (and keeps what it got); on
/// one that is down, 503.
pub(crate) struct Receiver {
    port: u16,
    up: Arc<Mutex<BTreeSet<String>>>,
    got: Arc<Mutex<Vec<Got>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub(crate) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, got) = (Arc::new(Mutex::new(BTreeSet::new())), Arc::new(Mutex::new(Vec::new())));
        let task = {
            let (up, got) = (Arc::clone(&up), Arc::clone(&got));
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(answer(stream, Arc::clone(&up), Arc::clone(&got)));
                }
            })
        };
        Self { port, up, got, task }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) fn set_up(&self, path: &str, up: bool) {
        let mut paths = self.up.lock().unwrap();
        if up {
            paths.insert(path.to_owned())
        } else {
            paths.remove(path)
        };
    }

    pub(crate) fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// The ids `path` got, in order.
    pub(crate) fn ids(&self, path: &str) -> Vec<String> {
        self.got().into_iter().filter(|g| g.path == path).map(|g| g.id).collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One HTTP/1.1 request on `stream`, answered and closed.
async fn answer(mut stream: TcpStream, up: Arc<Mutex<BTreeSet<String>>>, got: Arc<Mutex<Vec<Got>>>) {
    let mut read = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => read.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&read[..head_end]).to_string();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
            .unwrap_or_default()
            .to_owned()
    };
    let length: usize = header("content-length").parse().unwrap_or(0);
    while read.len() < head_end + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => read.extend_from_slice(&chunk[..n]),
        }
    }
    let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
    let is_up = up.lock().unwrap().contains(&path);
    let status = if is_up {
        let body = serde_json::from_slice(&read[head_end..head_end + length]).unwrap_or(serde_json::Value::Null);
        got.lock().unwrap().push(Got { path, id: header("ichor-event-id"), body });
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    let reply = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(reply.as_bytes()).await.ok();
    stream.shutdown().await.ok();
}

/// Each record of `name`'s outbox: (id, sink, event, state).
pub(crate) async fn records(scene: &Scene, name: &str) -> Vec<(String, String, String, String)> {
    let op = scene.operation(name).await;
    let outbox = op.and_then(|o| o.status).and_then(|s| s.notifications).unwrap_or_default();
    outbox.records.into_iter().map(|r| (r.id, r.sink, r.event, r.state)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn every_notice_reaches_a_webhook_and_a_slack_receiver_once_across_a_leader_kill() {
    let scene = Scene::new("e2e-notify").await;
    let receiver = Receiver::start().await;
    let fleet = scene.fleet("1+3", &["--fleet-only"]);
    scene.fleet_up(4).await;
    let ns = scene.ns.name.clone();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "receivers" },
        "stringData": { "hook": receiver.url("/hook"), "slack": receiver.url("/slack") },
    }))
    .unwrap();
    Api::<Secret>::namespaced(scene.ns.client.clone(), &ns).create(&PostParams::default(), &secret).await.unwrap();
    let notifications = json!({ "spec": { "notifications": {
        "waitingAfterSeconds": 2,
        "sinks": [
            { "name": "hook", "type": "Webhook", "urlSecret": { "name": "receivers", "key": "hook" } },
            { "name": "chat", "type": "Slack", "urlSecret": { "name": "receivers", "key": "slack" } },
        ],
    } } });
    Api::<TalosCluster>::namespaced(scene.ns.client.clone(), &ns)
        .patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&notifications))
        .await
        .unwrap();

    let kubeconfig = scene.operator_kubeconfig().await;
    let mut a = scene.operator("replica-a", &kubeconfig, &["--identity", "replica-a"]);
    let mut b = scene.operator("replica-b", &kubeconfig, &["--identity", "replica-b"]);
    eventually("one replica leads", || async { leader(&a).await || leader(&b).await }).await;
    let a_leads = leader(&a).await;
    let (leading, following) = if a_leads { (&mut a, &mut b) } else { (&mut b, &mut a) };

    // Both receivers are down as the upgrade starts: its notices are retried. A person
    // pauses it after its first call, and a second operation waits on its lock.
    scene.create_operation("upgrade", "talos", None).await;
    eventually("an Upgrade call", || async { upgrade_calls(&fleet).await.iter().map(|(_, n)| n).sum::<f64>() >= 1.0 })
        .await;
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &ns);
    let pause = json!({ "metadata": { "annotations": { "ichor.dev/pause": "e2e: a look at the dashboards" } } });
    ops.patch("upgrade", &PatchParams::default(), &Patch::Merge(&pause)).await.unwrap();
    eventually("the upgrade paused", || async { scene.phase("upgrade").await == "Paused" }).await;
    scene.create_operation("second", "talos", None).await;
    eventually("the start, the pause and the wait owed, and attempts failed", || async {
        let mut all = records(&scene, "upgrade").await;
        all.extend(records(&scene, "second").await);
        let owed = |event: &str| all.iter().filter(|r| r.2 == event).count() == 2;
        let failed = scene.operation("upgrade").await.and_then(|o| o.status).and_then(|s| s.notifications);
        let failed = failed
            .is_some_and(|o| o.records.iter().any(|r| r.last_error.as_deref().is_some_and(|e| e.contains("503"))));
        owed("Started") && owed("Paused") && owed("Waiting") && failed
    })
    .await;
    // The webhook comes back and gets them from the first leader; the Slack receiver stays
    // down until that leader is dead.
    receiver.set_up("/hook", true);
    eventually("the webhook told by the first leader", || async { receiver.ids("/hook").len() == 3 }).await;
    leading.kill();
    eventually("the follower takes over", || async { leader(following).await }).await;
    receiver.set_up("/slack", true);
    eventually("the Slack receiver told by the new leader", || async { receiver.ids("/slack").len() == 3 }).await;
    let lift = json!({ "metadata": { "annotations": { "ichor.dev/pause": null } } });
    ops.patch("upgrade", &PatchParams::default(), &Patch::Merge(&lift)).await.unwrap();
    eventually("both complete", || async {
        scene.phase("upgrade").await == "Completed" && scene.phase("second").await == "Completed"
    })
    .await;
    eventually("every record delivered", || async {
        let mut all = records(&scene, "upgrade").await;
        all.extend(records(&scene, "second").await);
        all.iter().filter(|r| r.2 == "Completed").count() == 4 && all.iter().all(|r| r.3 == "Delivered")
    })
    .await;

    // Every notice once, in each operation's order, to each receiver.
    let mut owed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in ["upgrade", "second"] {
        for (id, sink, _, _) in records(&scene, name).await {
            owed.entry(sink).or_default().push(id);
        }
    }
    for (sink, path) in [("hook", "/hook"), ("chat", "/slack")] {
        let got = receiver.ids(path);
        let mut once = got.clone();
        once.sort();
        once.dedup();
        assert_eq!(once.len(), got.len(), "{sink}: a notice came twice: {got:?}");
        let mut expected = owed[sink].clone();
        expected.sort();
        assert_eq!(once, expected, "{sink}: what it got against what was owed");
        for name in ["upgrade", "second"] {
            let uid = scene.operation(name).await.unwrap().metadata.uid.unwrap();
            let of = |ids: &[String]| ids.iter().filter(|i| i.starts_with(&uid)).cloned().collect::<Vec<_>>();
            assert_eq!(of(&got), of(&owed[sink]), "{sink}: {name}'s notices in order");
        }
    }
    let events: Vec<String> =
        records(&scene, "upgrade").await.into_iter().filter(|r| r.1 == "hook").map(|r| r.2).collect();
    let told: Vec<&str> = events.iter().map(String::as_str).filter(|e| *e != "Waiting").collect();
    assert_eq!(told, ["Started", "Paused", "Completed"], "a wait of its own is the only other notice: {events:?}");
    let got = receiver.got();
    let hook = |event: &str| got.iter().find(|g| g.path == "/hook" && g.body["event"] == event).unwrap().clone();
    let paused = hook("Paused");
    assert_eq!(paused.body["id"], paused.id.as_str(), "the body's id is the header's");
    let said = paused.body["message"].as_str().unwrap();
    assert!(said.contains(&format!("kubectl ichor resume upgrade -n {ns}")), "{said}");
    let waited = hook("Waiting").body["message"].as_str().unwrap().to_owned();
    assert!(waited.contains("second") && waited.contains("upgrade"), "what it waits on: {waited}");
    let completed = hook("Completed").body["message"].as_str().unwrap().to_owned();
    assert!(completed.contains("completed in"), "{completed}");
    for slack in got.iter().filter(|g| g.path == "/slack") {
        let text = slack.body["text"].as_str().unwrap_or_default();
        assert!(text.starts_with("[ichor] "), "{:?}", slack.body);
        assert_eq!(slack.body.as_object().map(serde_json::Map::len), Some(1), "{:?}", slack.body);
    }
    // The URL is never logged.
    let url = format!("127.0.0.1:{}", receiver.port);
    for replica in [&*leading, &*following] {
        assert!(!replica.log_lines().iter().any(|l| l.contains(&url)), "a replica logged the receiver's URL");
    }
    scene.only_allowed_requests(following).await;
    drop(fleet);
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_receiver_that_never_answers_is_given_up_after_its_bound_with_a_warning_event() {
    let scene = Scene::new("e2e-notify-lost").await;
    // A black hole: accepts and never answers.
    let hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hole.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((stream, _)) = hole.accept().await {
            kept.push(stream);
        }
    });
    let _both = scene.fleet("1+1", &[]);
    scene.fleet_up(2).await;
    let ns = scene.ns.name.clone();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "receivers" },
        "stringData": { "hole": format!("http://127.0.0.1:{port}/hook") },
    }))
    .unwrap();
    Api::<Secret>::namespaced(scene.ns.client.clone(), &ns).create(&PostParams::default(), &secret).await.unwrap();
    let notifications = json!({ "spec": { "notifications": {
        "giveUpAfterSeconds": 12,
        "sinks": [
            { "name": "hole", "type": "Webhook", "urlSecret": { "name": "receivers", "key": "hole" } },
            { "name": "lost", "type": "Slack", "urlSecret": { "name": "receivers", "key": "no-such-key" } },
        ],
    } } });
    Api::<TalosCluster>::namespaced(scene.ns.client.clone(), &ns)
        .patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&notifications))
        .await
        .unwrap();
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the upgrade completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    eventually("every notice given up", || async {
        let all = records(&scene, "upgrade").await;
        all.len() == 4 && all.iter().all(|r| r.3 == "GaveUp")
    })
    .await;
    let outbox = scene.operation("upgrade").await.and_then(|o| o.status).and_then(|s| s.notifications).unwrap();
    for record in &outbox.records {
        let error = record.last_error.clone().unwrap_or_default();
        assert!(!error.contains(&port.to_string()), "the URL in a status: {error}");
        match record.sink.as_str() {
            // Each attempt bounded (10 s): few attempts in 12 s.
            "hole" => assert!(record.attempts >= 1 && record.attempts <= 3, "{record:?}"),
            _ => {
                assert!(error.contains("receivers") && error.contains("no-such-key"), "{error}");
                // The first retried within its bound (2, 4, 8 s apart: three attempts on
                // an idle machine, two on a loaded one); those behind it aged meanwhile,
                // and go after one attempt.
                let least = if record.event == "Started" { 2 } else { 1 };
                assert!(record.attempts >= least, "retried: {record:?}");
            }
        }
    }
    let hole_error = outbox.records.iter().find(|r| r.sink == "hole").and_then(|r| r.last_error.clone());
    assert!(hole_error.as_deref().is_some_and(|e| e.starts_with("not sent:")), "{hole_error:?}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(scene.ns.client.clone(), &ns);
    eventually("a Warning Event per notice given up", || async {
        let listed = events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        listed.iter().filter(|e| e.reason.as_deref() == Some("NotificationGivenUp")).count() == 4
    })
    .await;
    held.abort();
    scene.end().await;
}
