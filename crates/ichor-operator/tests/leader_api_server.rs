//! Leader election against a real API server (`ICHOR_TEST_KUBECONFIG`; skipped with one
//! line without it), with short Leases: one leader at a time, takeover after a leader dies,
//! at once after it steps down, and the fence: a leader cut off from the API server stops
//! leading before anyone could take over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ichor_operator::leader::{ElectionConfig, Leadership};
use ichor_testkit::kube::TestNamespace;
use kube::config::{KubeConfigOptions, Kubeconfig};

fn election(ns: &str, identity: &str) -> ElectionConfig {
    ElectionConfig {
        duration: Duration::from_secs(4),
        renew_every: Duration::from_millis(1000),
        retry_every: Duration::from_millis(300),
        margin: Duration::from_millis(1000),
        ..ElectionConfig::new(ns, "leader-test", identity)
    }
}

async fn until(bound: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < bound, "not within {bound:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn one_leads_another_takes_over_after_death_and_at_once_after_a_step_down() {
    let ns = TestNamespace::create("leader").await;
    let a = Leadership::start(ns.client.clone(), election(&ns.name, "a"));
    let b = Leadership::start(ns.client.clone(), election(&ns.name, "b"));
    until(Duration::from_secs(10), "a leader", || a.is_leader() || b.is_leader()).await;
    for _ in 0..20 {
        assert!(a.is_leader() != b.is_leader(), "exactly one leader at a time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (leader, follower) = if a.is_leader() { (a, b) } else { (b, a) };

    // Death: the Lease is taken over once a whole duration passed without a renewal.
    leader.abandon();
    let waited = until(Duration::from_secs(10), "takeover after death", || follower.is_leader()).await;
    assert!(waited >= Duration::from_secs(2), "not before the Lease could expire: {waited:?}");
    assert!(waited < Duration::from_secs(4) + Duration::from_millis(300) + Duration::from_secs(1), "{waited:?}");

    // A clean stop hands over at the next look.
    let c = Leadership::start(ns.client.clone(), election(&ns.name, "c"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!c.is_leader(), "the Lease is the follower's");
    follower.step_down().await;
    let waited = until(Duration::from_secs(5), "takeover after a step-down", || c.is_leader()).await;
    assert!(waited < Duration::from_secs(2), "a released Lease is taken at the next look: {waited:?}");
    c.step_down().await;
    ns.delete().await;
}

/// A loopback TCP proxy that can be cut: every connection is dropped and new ones are
/// accepted and never answered, as an API server behind a partition.
struct Cuttable {
    addr: std::net::SocketAddr,
    cut: Arc<AtomicBool>,
}

impl Cuttable {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&cut);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let upstream = upstream.clone();
                let flag = Arc::clone(&flag);
                tokio::spawn(async move {
                    if flag.load(Ordering::Relaxed) {
                        // Accept and never answer.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        return;
                    }
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else { return };
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    let watch = async {
                        while !flag.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    };
                    tokio::select! { _ = copy => {}, () = watch => {} }
                });
            }
        });
        Self { addr, cut }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_leader_cut_off_from_the_api_server_stops_leading_before_its_lease_can_expire() {
    let ns = TestNamespace::create("fence").await;
    let kubeconfig = Kubeconfig::read_from(&ns.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
    let upstream = config.cluster_url.authority().unwrap().to_string();
    let proxy = Cuttable::start(upstream).await;
    // The server's certificate names 127.0.0.1, which the proxy's address also is.
    config.cluster_url = format!("https://{}", proxy.addr).parse().unwrap();
    config.read_timeout = Some(Duration::from_secs(2));
    config.connect_timeout = Some(Duration::from_secs(2));
    let client = ichor_adapters::kubernetes::client(config).unwrap();

    let cut_off = Leadership::start(client, election(&ns.name, "cut-off"));
    until(Duration::from_secs(10), "the proxied replica leads", || cut_off.is_leader()).await;
    proxy.cut.store(true, Ordering::Relaxed);
    let cut_at = Instant::now();
    let other = Leadership::start(ns.client.clone(), election(&ns.name, "other"));
    until(Duration::from_secs(10), "the cut-off leader steps down by itself", || !cut_off.is_leader()).await;
    let fenced = cut_at.elapsed();
    until(Duration::from_secs(15), "the other takes over", || other.is_leader()).await;
    let taken = cut_at.elapsed();
    eprintln!("cut at 0: the cut-off leader stopped at {fenced:?}, the other led at {taken:?}");
    assert!(fenced < taken, "two leaders at once: fenced at {fenced:?}, taken over at {taken:?}");
    other.step_down().await;
    cut_off.abandon();
    ns.delete().await;
}
