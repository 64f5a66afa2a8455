//! The operator example as a process, without a Kubernetes API server: bad arguments and
//! unusable kubeconfigs are named with exit 2 before anything connects; an API server that
//! refuses connections leaves it alive (`/healthz`) and not ready (`/readyz`), retrying.

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ichor_testkit::example_binary;
use ichor_testkit::net::refused_endpoint;

fn operator(args: &[&str]) -> Output {
    Command::new(example_binary("operator")).args(args).env("KUBECONFIG", "/nonexistent").output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_arguments_are_named_with_exit_2() {
    let cases: [(&[&str], &str); 5] = [
        (&["--simulate-fleet", "3"], "CONTROL_PLANES+WORKERS"),
        (&["--simulate-fleet", "0+5"], "control plane"),
        (&["--simulate-fleet", "3+5", "--time-scale", "0"], "time scale"),
        (&["--fleet-only"], "--simulate-fleet"),
        (&["--listen", "everywhere"], "--listen"),
    ];
    for (args, named) in cases {
        let output = operator(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let text = stderr(&output);
        assert!(output.stdout.is_empty(), "errors go to stderr: {output:?}");
        assert!(text.contains(named), "{args:?} must name {named}: {text}");
        assert_eq!(text.lines().count(), 1, "one line: {text}");
    }
}

#[test]
fn an_unusable_kubeconfig_is_named_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let output = operator(&["--kubeconfig", missing.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(stderr(&output).contains(missing.to_str().unwrap()), "{}", stderr(&output));

    let garbled = dir.path().join("garbled");
    std::fs::write(&garbled, "clusters: [this is not\n").unwrap();
    let output = operator(&["--kubeconfig", garbled.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(stderr(&output).contains("garbled"), "{}", stderr(&output));

    let output = operator(&[]);
    assert_eq!(output.status.code(), Some(2), "no kubeconfig anywhere: {output:?}");
    assert!(stderr(&output).contains("no kubeconfig"), "{}", stderr(&output));
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split(' ').nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_owned()))
}

#[test]
fn an_unreachable_api_server_leaves_it_alive_and_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            refused_endpoint()
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(example_binary("operator"))
        .args(["--kubeconfig", kubeconfig.to_str().unwrap(), "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut health = None;
    while Instant::now() < deadline {
        health = get(port, "/healthz");
        if health.as_ref().is_some_and(|(code, _)| *code == 200) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let ready = get(port, "/readyz");
    let metrics = get(port, "/metrics");
    let alive = child.try_wait().unwrap().is_none();
    child.kill().ok();
    child.wait().ok();
    assert_eq!(health.map(|h| h.0), Some(200), "alive");
    let (code, text) = ready.expect("/readyz answers");
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("not listed"), "{text}");
    let (code, text) = metrics.expect("/metrics answers");
    assert_eq!(code, 200);
    assert!(text.contains("ichor_leader 0"), "{text}");
    assert!(alive, "it retries rather than exits");
}
