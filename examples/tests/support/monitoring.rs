//! Real Prometheus and Alertmanager peers (`ICHOR_TEST_PROMETHEUS`,
//! `ICHOR_TEST_ALERTMANAGER`: `bash scripts/monitoring.sh build`, then `env`), each a
//! process on a loopback port of its own, stopped by process ID when dropped; and the bit
//! of HTTP the tests speak to them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::free_port;

/// A server process on `127.0.0.1:port`; killed when dropped, its log printed when the
/// test failed.
pub struct Peer {
    name: &'static str,
    child: Child,
    log: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

fn binary(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var}: bash scripts/monitoring.sh build, then env"))
}

impl Peer {
    /// A Prometheus with `config` (its `prometheus.yml`), its data in `dir`, that
    /// evaluates its rules and scrapes as often as the config says.
    pub async fn prometheus(dir: &Path, config: &str) -> Self {
        let port = free_port();
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let mut command = Command::new(binary("ICHOR_TEST_PROMETHEUS"));
        command
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("prometheus-data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        Self::start("prometheus", command, dir, port).await
    }

    /// An Alertmanager with no receiver that notifies (a test reads its API), its data in
    /// `dir`, not clustered.
    pub async fn alertmanager(dir: &Path) -> Self {
        let port = free_port();
        let config_file = dir.join("alertmanager.yml");
        std::fs::write(&config_file, "route:\n  receiver: none\nreceivers:\n  - name: none\n").unwrap();
        let mut command = Command::new(binary("ICHOR_TEST_ALERTMANAGER"));
        command
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.path={}", dir.join("alertmanager-data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=");
        Self::start("alertmanager", command, dir, port).await
    }

    async fn start(name: &'static str, mut command: Command, dir: &Path, port: u16) -> Self {
        let log = dir.join(format!("{name}.log"));
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        let peer = Self { name, child, log, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while peer.get("/-/ready").await.is_none_or(|(code, _)| code != 200) {
            assert!(Instant::now() < deadline, "{name} not ready within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        peer
    }

    /// `GET path` (with its query, percent-encoded by [`encode`]): the status code and body.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        self.request("GET", path, None).await
    }

    /// `method path` with a JSON body: the status code and body.
    pub async fn request(&self, method: &str, path: &str, json: Option<&serde_json::Value>) -> Option<(u16, String)> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
        let body = json.map(serde_json::Value::to_string).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.ok()?;
        stream.write_all(body.as_bytes()).await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        let (status, body) = text.split_once("\r\n\r\n")?;
        let code = status.split(' ').nth(1)?.parse().ok()?;
        Some((code, body.to_owned()))
    }

    /// `GET path` as JSON, which must answer 200.
    pub async fn json(&self, path: &str) -> serde_json::Value {
        let (code, body) = self.get(path).await.unwrap_or_else(|| panic!("{} does not answer {path}", self.name));
        assert_eq!(code, 200, "{} {path}: {body}", self.name);
        serde_json::from_str(&body).unwrap()
    }

    /// Prometheus: the instant vector of `query` (`data.result`).
    pub async fn query(&self, query: &str) -> Vec<serde_json::Value> {
        let answer = self.json(&format!("/api/v1/query?query={}", encode(query))).await;
        answer["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The process's ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!("----- last lines of {} ({})\n{}", self.name, self.log.display(), tail.join("\n"));
        }
    }
}

/// `text` percent-encoded for a URL's query (every byte but the unreserved ones).
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
