//! Maintenance windows through the operator on a real API server (issue 56 item 3): the
//! CRD refuses what a schema can tell at admission; a start waits outside every window,
//! saying until when, in the status and in `kubectl ichor status`, with no machine
//! touched; windows that do not read refuse the upgrade; lifting the rule lets it finish.

use ichor_adapters::kubernetes::crd::TalosCluster;
use ichor_sim::fleet;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::kubectl_plugin::ok;
use crate::operator_e2e::{Scene, all_on_target, upgrade_calls};
use crate::support::eventually;

/// `at` seconds from now, as RFC 3339 (UTC, whole seconds).
fn from_now(seconds: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    ichor_upgrade_core::Timestamp::from_unix_secs(i64::try_from(now).unwrap() + seconds).rfc3339()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_start_waits_for_its_window_and_bad_windows_refuse_touching_nothing() {
    let scene = Scene::new("e2e-windows").await;
    let both = scene.fleet("1+2", &[]);
    scene.fleet_up(3).await;
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let patch = |maintenance: serde_json::Value| {
        let clusters = clusters.clone();
        async move {
            let body = json!({ "spec": { "maintenance": maintenance } });
            clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&body)).await
        }
    };

    // Refused at admission: four cron fields; a blackout that ends before it begins.
    let four_fields = json!({ "windows": [{ "schedule": "0 2 * *", "duration": "4h" }] });
    let refused = patch(four_fields).await.expect_err("four cron fields are refused at admission");
    assert!(refused.to_string().contains("schedule"), "{refused}");
    let backwards = json!({ "blackouts": [{ "start": from_now(3600), "end": from_now(0) }] });
    let refused = patch(backwards).await.expect_err("a backwards blackout is refused at admission");
    assert!(refused.to_string().contains("end is after its start"), "{refused}");

    // A blackout over now: the upgrade waits for its end, touching no machine.
    let ends = from_now(3 * 3600);
    patch(json!({ "blackouts": [{ "start": from_now(-3600), "end": ends, "reason": "freeze" }] })).await.unwrap();
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the upgrade waits outside every window, naming the next", || async {
        let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
        status.reason.as_deref() == Some("OutsideWindow")
            && status.message.as_deref().is_some_and(|m| m.contains(&format!("the next window opens at {ends}")))
    })
    .await;
    let kubeconfig = scene.admin().to_path_buf();
    let shown = ok(&kubeconfig, &scene.ns.name, &["status", "upgrade"]);
    assert!(shown.contains("OutsideWindow") && shown.contains(&ends), "{shown}");
    assert!(upgrade_calls(&both).await.is_empty(), "no machine started outside a window");

    // Windows that do not read (a time zone no database has): refused, nothing touched.
    let mars = json!({ "windows": [{ "schedule": "0 2 * * *", "duration": "4h", "timeZone": "Mars/Olympus" }] });
    patch(mars).await.unwrap();
    eventually("the upgrade is refused, naming the field", || async {
        let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
        status.reason.as_deref() == Some("InvalidMaintenance")
            && status.message.as_deref().is_some_and(|m| m.contains("windows[0].timeZone \"Mars/Olympus\""))
    })
    .await;
    assert!(upgrade_calls(&both).await.is_empty(), "a refusal touches nothing");

    // A window open now for hours: it goes on and completes.
    patch(json!({ "windows": [{ "schedule": "0 * * * *", "duration": "6h" }], "blackouts": null })).await.unwrap();
    eventually("the upgrade completes inside its window", || async { scene.phase("upgrade").await == "Completed" })
        .await;
    assert!(all_on_target(&scene.fleet_nodes().await));
    scene.end().await;
}
