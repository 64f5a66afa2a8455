//! The simulated installer pull: a legacy Upgrade call pulls its image before it answers,
//! and concurrent pulls share the registry's bandwidth (issue 13).

use std::time::Duration;

use futures::future::join_all;
use ichor_executor::talos_api::UpgradeRequest;
use ichor_sim::{SimCluster, SimConfig, TraceKind};
use ichor_upgrade_core::versions::TalosVersion;

const IMAGE: &str =
    "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";

fn sim(workers: usize) -> SimCluster {
    let v = |t| TalosVersion::parse(t).unwrap();
    let sim = SimCluster::new(SimConfig::new(1, workers, v("v1.14.3"), v("v1.14.4")).with_storage(false));
    sim.with_world(|w| w.start_clock());
    sim
}

fn address(sim: &SimCluster, name: &str) -> String {
    sim.with_world(|w| w.node(name).unwrap().address.clone())
}

async fn upgrade(sim: &SimCluster, name: &str) {
    let request = UpgradeRequest { image: IMAGE.to_owned(), timeout: Duration::from_secs(600) };
    sim.upgrade(&address(sim, name), &request).await.unwrap();
}

/// `(pull start, pulled)` of `name`, in seconds from the start.
fn pull(sim: &SimCluster, name: &str) -> (f64, f64) {
    sim.with_world(|w| {
        let at = |k| w.trace.iter().find(|e| e.node == name && e.event == k).map(|e| e.t).unwrap();
        (at(TraceKind::ImagePullStart), at(TraceKind::ImagePulled))
    })
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() < 0.005
}

#[tokio::test(start_paused = true)]
async fn pulls_under_way_share_the_registry_and_speed_up_when_one_ends() {
    let sim = sim(3);
    // 100 MB, 50 MB/s for one node, 125 MB/s shared (the defaults).
    let registry = sim.with_world(|w| w.config.registry.clone());
    assert_eq!(
        (registry.image_bytes, registry.node_bytes_per_s, registry.shared_bytes_per_s),
        (100_000_000, 50_000_000, 125_000_000)
    );
    let staggered = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        join_all(["worker-2", "worker-3"].map(|n| upgrade(&sim, n))).await;
    };
    tokio::join!(upgrade(&sim, "worker-1"), staggered);
    // worker-1 alone for 1 s (50 MB at its node's 50 MB/s), then three share 125 MB/s: its
    // last 50 MB at 41.7 MB/s take 1.2 s. The other two then have 50 MB left, at 50 MB/s
    // each: 1 s more.
    let (start, end) = pull(&sim, "worker-1");
    assert!(near(end - start, 2.2), "worker-1 pulled in {} s", end - start);
    for name in ["worker-2", "worker-3"] {
        let (start, end) = pull(&sim, name);
        assert!(near(end - start, 2.2), "{name} pulled from {start} to {end}");
        assert!(end > pull(&sim, "worker-1").1 + 0.9, "{name} ended after worker-1");
    }
    assert_eq!(sim.with_world(|w| w.pulls_under_way()), 0);
}

#[tokio::test(start_paused = true)]
async fn an_upgrade_call_answers_only_after_its_pull_and_a_node_with_the_image_pulls_nothing() {
    let sim = sim(6);
    let begin = tokio::time::Instant::now();
    let names: Vec<String> = (1..=5).map(|i| format!("worker-{i}")).collect();
    join_all(names.iter().map(|n| upgrade(&sim, n))).await;
    // Five pulls at once: 25 MB/s each (125 shared), 4 s; then the call's own latency.
    let took = begin.elapsed().as_secs_f64();
    assert!((4.0..4.1).contains(&took), "five concurrent calls took {took} s");
    for i in 1..=5 {
        let (start, end) = pull(&sim, &format!("worker-{i}"));
        assert!(near(end - start, 4.0), "worker-{i}: {} s", end - start);
    }
    // A node whose store has the image already (a pre-pull) is called without a pull.
    sim.with_world(|w| {
        let i = w.nodes.iter().position(|n| n.name == "worker-6").unwrap();
        w.nodes[i].pulled = Some(IMAGE.to_owned());
    });
    let begin = tokio::time::Instant::now();
    upgrade(&sim, "worker-6").await;
    assert!(begin.elapsed() <= Duration::from_millis(50), "only the call's latency");
    sim.with_world(|w| {
        assert!(!w.trace.iter().any(|e| e.node == "worker-6" && e.event == TraceKind::ImagePullStart));
        assert!(w.trace.iter().any(|e| e.node == "worker-6" && e.event == TraceKind::UpgradeCall));
    });
}
