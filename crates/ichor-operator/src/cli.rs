//! The operator's command line: the engine as a Kubernetes controller over `TalosOperation`s, on a real
//! cluster. A program that embeds it adds its own arguments and work beside the
//! controller with [`main_with`] (the `operator` example adds a simulated Talos fleet).
//!
//! ```text
//! ichor-operator [--kubeconfig FILE] [--namespace NS]
//!     [--listen ADDR] [--log-format text|json] [--identity ID] [--lease-namespace NS]
//!     [--longhorn-namespace NS]
//!     [--etcd-snapshot-dir DIR | --etcd-snapshot-s3-bucket B [--etcd-snapshot-s3-prefix P]
//!      [--etcd-snapshot-s3-endpoint URL] [--etcd-snapshot-s3-region R]]
//!     [--trace FILE] [--pass-interval-ms MS]
//! ```
//! Without `--kubeconfig` the configuration is inferred as kubectl does (`KUBECONFIG`,
//! `~/.kube/config`, or the pod's service account). Replicas elect a leader on the Lease
//! `ichor-operator` (in `--lease-namespace`, else `POD_NAMESPACE`, else the namespace);
//! only the leader reconciles. `/metrics`, `/healthz` and `/readyz` listen on `--listen`
//! (default 127.0.0.1:8080). SIGTERM or Ctrl-C: the passes in flight end, the leadership
//! is handed over, the companions stop; exit 0.
//!
//! An upgrade takes an etcd snapshot before its first control plane unless its spec says
//! `etcdSnapshot: Skip`; it goes to `--etcd-snapshot-dir` (a mounted volume) or to the
//! S3-compatible bucket `--etcd-snapshot-s3-bucket`, signed with `AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY` from the environment (in a pod, from a Secret). With neither
//! (and no default from an [`Extension`]), such an operation pauses before its first
//! control plane, naming these flags.
//!
//! `--trace FILE` writes what the controller does and sees as JSON lines, in the records the
//! `rollout` example's `--trace` writes (`upgrade-call`, `install-start`, `shown-not-ready`,
//! `reboot-end`, `ready`, `converged`, ...; see `ichor_operator::trace`), `t` in seconds
//! since the controller started, so that a rollout on a real cluster is drawn as a simulated
//! one is. The file is created (or truncated) at the start; one that cannot be is a bad
//! argument.
//!
//! Exit 0: stopped by a signal. Exit 2: bad arguments or an unusable kubeconfig, named.
//! Exit 1: the endpoints could not listen, or a companion failed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::requests::counted_client;
use crate::{Companion, ElectionConfig, Metrics, OperatorConfig, Plan, TraceFile, TraceSink};
use clap::{Parser, ValueEnum};
use ichor_adapters::snapshot_store::{DirectoryStore, S3Config, S3Store};
use ichor_executor::SnapshotStore;

/// Exit code: an argument could not be parsed.
pub const EXIT_BAD_ARGUMENT: i32 = 2;

/// Parses the command line with clap; on an error, prints one line naming the argument
/// and exits with [`EXIT_BAD_ARGUMENT`]. `--help` and `--version` print and exit 0.
#[must_use]
pub fn parse_args<P: clap::Parser>() -> P {
    match P::try_parse() {
        Ok(parsed) => parsed,
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => e.exit(),
            _ => {
                eprintln!("{}", one_line(&e.render().to_string()));
                std::process::exit(EXIT_BAD_ARGUMENT)
            }
        },
    }
}

/// Folds clap's error text into one line: the message and the arguments it lists, without
/// the usage and help hints that follow.
fn one_line(rendered: &str) -> String {
    rendered
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// On or off, on a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// The Talos executors, on a command line (`--executor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecutorArg {
    /// MachineService.Upgrade.
    Legacy,
    /// LifecycleService.Upgrade and the engine's own cordon, drain and reboot.
    Lifecycle,
    /// Lifecycle from Talos 1.18, legacy before.
    Auto,
}

/// The executor configuration of `--executor` and `--prepull`, the rest default.
#[must_use]
pub fn executor_config(executor: ExecutorArg, prepull: Switch) -> ichor_executor::ExecutorConfig {
    use ichor_upgrade_core::machine::lifecycle::ExecutorChoice;
    let choice = match executor {
        ExecutorArg::Legacy => ExecutorChoice::Legacy,
        ExecutorArg::Lifecycle => ExecutorChoice::Lifecycle,
        ExecutorArg::Auto => ExecutorChoice::Auto,
    };
    ichor_executor::ExecutorConfig::default().with_executor(choice).with_prepull(prepull == Switch::On)
}

/// Exit code: the endpoints could not listen, or a companion failed.
const EXIT_FAILED: i32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The executor's configuration with the pass interval of the command line, divided by the
/// extension's time scale.
fn pass_interval<X: Extension>(
    config: ichor_executor::ExecutorConfig,
    args: &Args<X>,
) -> ichor_executor::ExecutorConfig {
    let interval = args.pass_interval_ms.map_or(config.pass_interval, Duration::from_millis);
    config.with_pass_interval(interval.div_f64(args.extension.time_scale()))
}

/// What a program that embeds the operator's command line adds to it: its own arguments
/// (flattened into the operator's) and the work it runs beside the controller. The
/// `operator` example's simulated fleet is one.
pub trait Extension: clap::Args + std::fmt::Debug {
    /// Whether the controller runs in this process (it may run only the companions).
    fn controller(&self) -> bool {
        true
    }

    /// How many of the cluster's seconds pass in one of the process's: the engine's
    /// pass interval is divided by it, so that the controller meets a sped-up cluster's
    /// changes as it would a real one's.
    fn time_scale(&self) -> f64 {
        1.0
    }

    /// Where etcd snapshots go when the command line names no store.
    fn default_snapshots(&self) -> Option<Arc<dyn SnapshotStore>> {
        None
    }

    /// What runs beside the controller, in the namespace `home` (the watched one, else
    /// the kubeconfig's).
    ///
    /// # Errors
    /// A message naming the argument that cannot be used; the process exits 2.
    fn companions(&self, home: &str) -> Result<Vec<Companion>, String> {
        let _ = home;
        Ok(Vec::new())
    }
}

/// No extension: the production binary's command line.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct NoExtension {}

impl Extension for NoExtension {}

/// Run the Ichor operator against a Kubernetes API server.
#[derive(Debug, Parser)]
#[command(name = "ichor-operator", version)]
struct Args<X: Extension> {
    /// The kubeconfig to use (default: as kubectl infers it).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Watch this namespace only (default: every namespace).
    #[arg(long)]
    namespace: Option<String>,
    #[command(flatten)]
    extension: X,
    /// Where /metrics, /healthz and /readyz listen.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// This replica's identity in the election (default: POD_NAME, else host and process).
    #[arg(long)]
    identity: Option<String>,
    /// The namespace of the leader Lease.
    #[arg(long)]
    lease_namespace: Option<String>,
    /// Where Longhorn runs.
    #[arg(long, default_value = ichor_adapters::longhorn::DEFAULT_NAMESPACE)]
    longhorn_namespace: String,
    /// Keep etcd snapshots in this directory (a mounted volume).
    #[arg(long, value_name = "DIR", conflicts_with = "etcd_snapshot_s3_bucket")]
    etcd_snapshot_dir: Option<PathBuf>,
    /// Keep etcd snapshots in this S3-compatible bucket (credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long, value_name = "BUCKET")]
    etcd_snapshot_s3_bucket: Option<String>,
    /// The key prefix in the bucket.
    #[arg(long, value_name = "PREFIX", default_value = "", requires = "etcd_snapshot_s3_bucket")]
    etcd_snapshot_s3_prefix: String,
    /// The S3 service's URL (default: AWS, from the region); `http://` is allowed.
    #[arg(long, value_name = "URL", requires = "etcd_snapshot_s3_bucket")]
    etcd_snapshot_s3_endpoint: Option<String>,
    /// The bucket's region.
    #[arg(long, value_name = "REGION", default_value = "us-east-1", requires = "etcd_snapshot_s3_bucket")]
    etcd_snapshot_s3_region: String,
    /// Which Talos executor upgrades the machines: `legacy` (MachineService.Upgrade),
    /// `lifecycle` (ImageService.Pull, LifecycleService.Upgrade, the operator's own cordon,
    /// drain and Reboot; Talos 1.13 and later) or `auto` (lifecycle from Talos 1.18, where
    /// the legacy call is gone).
    #[arg(long, value_enum, default_value_t = ExecutorArg::Auto)]
    executor: ExecutorArg,
    /// Pull the installer image onto the machines expected to start next while the current
    /// ones upgrade (`on`), or only in each machine's own turn (`off`).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    prepull: Switch,
    /// The least time between the starts of two passes of an operation woken from outside,
    /// in milliseconds (default: the engine's, 2,000). With a simulated fleet (the
    /// `operator` example's `--simulate-fleet`) it is divided by the time scale, as the
    /// fleet's durations are: the controller meets the fleet's changes as it would a real
    /// cluster's.
    #[arg(long, value_name = "MS")]
    pass_interval_ms: Option<u64>,
    /// Write the controller's trace to this file, as JSON lines (the rollout example's
    /// records).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// The snapshot store the arguments name; with none named, the extension's default.
fn snapshot_store<X: Extension>(args: &Args<X>) -> Result<Option<Arc<dyn SnapshotStore>>, String> {
    if let Some(dir) = &args.etcd_snapshot_dir {
        return Ok(Some(Arc::new(DirectoryStore::new(dir.clone()))));
    }
    let Some(bucket) = &args.etcd_snapshot_s3_bucket else {
        return Ok(if args.extension.controller() { args.extension.default_snapshots() } else { None });
    };
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("--etcd-snapshot-s3-bucket needs {name} in the environment"))
    };
    let mut config =
        S3Config::new(bucket, &args.etcd_snapshot_s3_region, env("AWS_ACCESS_KEY_ID")?, env("AWS_SECRET_ACCESS_KEY")?)
            .with_prefix(&args.etcd_snapshot_s3_prefix);
    if let Some(endpoint) = &args.etcd_snapshot_s3_endpoint {
        config = config.with_allow_http(endpoint.starts_with("http://")).with_endpoint(endpoint);
    }
    let store = S3Store::new(&config).map_err(|e| format!("--etcd-snapshot-s3-bucket {bucket}: {e}"))?;
    Ok(Some(Arc::new(store)))
}

fn bad(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(EXIT_BAD_ARGUMENT)
}

async fn kube_config(path: Option<&PathBuf>) -> Result<kube::Config, String> {
    match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {}", path.display(), ichor_executor::report(&e)))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {}", path.display(), ichor_executor::report(&e)))
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no kubeconfig given and none found: {}", ichor_executor::report(&e))),
    }
}

fn identity() -> String {
    if let Ok(name) = std::env::var("POD_NAME")
        && !name.is_empty()
    {
        return name;
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "ichor".to_owned());
    format!("{host}-{}", std::process::id())
}

async fn signalled() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            tokio::signal::ctrl_c().await.ok();
        }
    }
}

/// The process: parses the command line, runs until a signal, exits with the codes above.
pub fn main() {
    main_with::<NoExtension>();
}

/// As [`main`], with the arguments and companions of `X`.
pub fn main_with<X: Extension>() {
    let args: Args<X> = parse_args();
    crate::init_logging(args.log_format == LogFormat::Json);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: no async runtime: {e}");
            std::process::exit(EXIT_FAILED);
        }
    };
    let code = runtime.block_on(run(args));
    std::process::exit(code);
}

async fn run<X: Extension>(args: Args<X>) -> i32 {
    let trace = args.trace.as_ref().map(|path| match TraceFile::create(path) {
        Ok(file) => Arc::new(file) as Arc<dyn TraceSink>,
        Err(e) => bad(&format!("--trace {}: {e}", path.display())),
    });
    let config = kube_config(args.kubeconfig.as_ref()).await.unwrap_or_else(|e| bad(&e));
    let default_namespace = config.default_namespace.clone();
    let metrics = Arc::new(Metrics::new());
    let client = counted_client(config, &metrics.requests).unwrap_or_else(|e| bad(&format!("kubeconfig: {e}")));
    let namespace = args.namespace.clone();
    let home = namespace.clone().unwrap_or_else(|| default_namespace.clone());
    let identity = args.identity.clone().unwrap_or_else(identity);
    let lease_namespace = args
        .lease_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|n| !n.is_empty()))
        .unwrap_or_else(|| home.clone());
    let companions = args.extension.companions(&home).unwrap_or_else(|e| bad(&e));
    let snapshots = snapshot_store(&args).unwrap_or_else(|e| bad(&e));
    let operator = args.extension.controller().then(|| {
        let config = OperatorConfig {
            snapshots,
            trace,
            namespace,
            identity: identity.clone(),
            executor: pass_interval(executor_config(args.executor, args.prepull), &args),
            talos: ichor_adapters::talos::ClientOptions::default(),
            longhorn_namespace: args.longhorn_namespace.clone(),
            own_node: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
            operator_namespace: lease_namespace.clone(),
            time_scale: args.extension.time_scale(),
        };
        (config, ElectionConfig::new(&lease_namespace, crate::rbac::LEADER_LEASE, &identity))
    });
    tracing::info!(
        %identity,
        namespace = args.namespace.as_deref().unwrap_or("(all)"),
        lease_namespace = %lease_namespace,
        companions = ?companions.iter().map(|c| c.name).collect::<Vec<_>>(),
        controller = operator.is_some(),
        "starting"
    );
    let plan = Plan { operator, companions, listen: args.listen };
    match crate::run(client, plan, metrics, signalled()).await {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %ichor_executor::report(&e), "stopped");
            eprintln!("error: {}", ichor_executor::report(&e));
            EXIT_FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn clap_errors_fold_to_one_line_that_names_the_argument() {
        let rendered = "error: the following required arguments were not provided:\n  --to <TO>\n\nUsage: upgrade-path --from <FROM> --to <TO>\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line(rendered), "error: the following required arguments were not provided: --to <TO>");
    }
}
