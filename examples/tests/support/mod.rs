//! What the tests of the operator example share: the example as a process, and waiting
//! for a condition within a bound.
#![allow(dead_code, unreachable_pub, reason = "not every test uses every helper")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ichor_operator::metrics::sample;
use ichor_testkit::example_binary;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Virtual seconds per second: a machine's upgrade (about 2-5 virtual minutes) in 1-2 s.
pub const TIME_SCALE: &str = "150";
/// The most any scenario may take.
pub const BOUND: Duration = Duration::from_secs(240);

/// A process of the operator example; killed when dropped, its log printed when the test
/// failed. Its `RUST_LOG` is `info`, or `$ICHOR_TEST_RUST_LOG` when set.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    port: u16,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Process {
    pub fn start(name: &str, dir: &Path, kubeconfig: &Path, args: &[&str]) -> Self {
        Self::start_with_env(name, dir, kubeconfig, args, &[])
    }

    /// As [`Self::start`], with `env` set (such as the `NODE_NAME` a pod gets).
    pub fn start_with_env(name: &str, dir: &Path, kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_command(name, Command::new(example_binary("operator")), dir, kubeconfig, args, env)
    }

    /// As [`Self::start_with_env`], with `command` in place of the operator example (such
    /// as the binary of the operator's image, through the image's own loader).
    pub fn start_command(
        name: &str,
        mut command: Command,
        dir: &Path,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--log-format", "json"])
            .args(args)
            .env("RUST_LOG", std::env::var("ICHOR_TEST_RUST_LOG").unwrap_or_else(|_| "info".to_owned()))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Self { name: name.to_owned(), child, log, port }
    }

    pub async fn metrics(&self) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
    }

    pub async fn value(&self, series: &str) -> Option<f64> {
        sample(&self.metrics().await?, series)
    }

    /// The process's ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }

    /// SIGTERM, then its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{} did not stop within 60 s of SIGTERM", self.name);
    }

    pub fn log_lines(&self) -> Vec<String> {
        std::fs::File::open(&self.log)
            .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
            .unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let lines = self.log_lines();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!("----- last lines of {} ({})\n{}", self.name, self.log.display(), tail.join("\n"));
        }
    }
}

/// Waits until `check` holds, at most [`BOUND`].
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(BOUND, what, check).await;
}

/// Waits until `check` holds, at most `bound`.
pub async fn eventually_within<F, Fut>(bound: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + bound;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {bound:?}: {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Process {
    /// The process's peak resident memory (`VmHWM` in `/proc/PID/status`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }
}

impl Process {
    /// The port of its `/metrics` (and health) listener on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

pub mod monitoring;
