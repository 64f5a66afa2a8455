//! A small talosctl for what the engine uses, over the real Talos client.
//!
//! ```text
//! cargo run -q --example talos -- --talosconfig FILE [--context NAME] [--endpoints HOST[:PORT]]
//!     [--nodes NODE] <command>
//! ```
//! Commands: `version`, `upgrade --image REF [--lifecycle]`, `pull --image REF`, `images`,
//! `reboot`, `boot-id`, `etcd-members`, `etcd-status`, `etcd-alarms`, `etcd-snapshot FILE`,
//! `etcd-gate` (over the control planes given with `--nodes A,B,C`).
//! Prints JSON on stdout. Exit 0: success. Exit 1: an error answered by the API (or no
//! answer), or a failed gate, with the message and its whole cause ("connection refused",
//! "invalid peer certificate: UnknownIssuer", "TLS handshake did not complete within 15s").
//! Exit 2: bad input (a talosconfig that is missing, does not parse, or lacks a context,
//! endpoint, certificate or key, or holds PEM or a key that does not parse or does not
//! match its certificate, each named), with no connection attempted.
//!
//! Every endpoint of the context is used (the next is tried when one cannot be reached);
//! connecting, TLS handshake included, ends within 15 s. `etcd-snapshot FILE` writes the
//! file only whole: a stream that fails leaves no file.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ichor_adapters::talos::{ClientOptions, TalosClient};
use ichor_examples::{EXIT_BAD_ARGUMENT, EXIT_OK, parse_args};
use ichor_executor::cause::report;
use ichor_executor::talos_api::{InstallRequest, PullRequest, TalosApi, TalosError, UpgradeRequest};
use ichor_talosconfig::{Overrides, parse};
use ichor_upgrade_core::etcd::gate::{ControlPlaneReport, Member, verdict};
use ichor_upgrade_core::machine::vocabulary::InstallExit;
use ichor_upgrade_core::rollout::EtcdVerdict;
use serde_json::{Value, json};

/// Exit code: the API answered with an error, did not answer, or the gate failed.
const EXIT_FAILED: i32 = 1;
/// The Upgrade call's own bound: the node pulls its installer before answering.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(600);

/// Talk to the Talos machine API as the engine does.
#[derive(Debug, Parser)]
#[command(name = "talos")]
struct Args {
    /// The talosconfig file.
    #[arg(long)]
    talosconfig: PathBuf,
    /// The context to use instead of the file's current one.
    #[arg(long)]
    context: Option<String>,
    /// Endpoints to use instead of the context's (comma-separated HOST[:PORT]).
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Target nodes (comma-separated); the first is the target of single-node commands.
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The node's Talos version.
    Version,
    /// Upgrade the node to the installer image (neither force nor preserve). With
    /// `--lifecycle` (Talos 1.13 and later): pull the image into the `system` containerd
    /// namespace, then install it into the other boot slot with LifecycleService, which
    /// neither drains nor reboots (see `reboot`); exit 1 on a non-zero installer exit code.
    Upgrade {
        /// The installer image, such as factory.talos.dev/metal-installer/<schematic>:v1.14.4.
        #[arg(long)]
        image: String,
        /// Use the client-driven path (ImageService.Pull, LifecycleService.Upgrade) instead
        /// of the legacy MachineService.Upgrade.
        #[arg(long)]
        lifecycle: bool,
    },
    /// Pull an image into the node's `system` containerd namespace (ImageService.Pull).
    Pull {
        /// The image reference.
        #[arg(long)]
        image: String,
    },
    /// The images in the node's `system` containerd namespace (ImageService.List).
    Images,
    /// Reboot the node (the default mode; no drain).
    Reboot,
    /// The node's kernel boot ID (as talosctl reads it to tell a reboot).
    BootId,
    /// The etcd member list.
    EtcdMembers,
    /// The node's etcd member status.
    EtcdStatus,
    /// The etcd alarms.
    EtcdAlarms,
    /// Stream an etcd snapshot to FILE.
    EtcdSnapshot {
        /// Where to write it.
        file: PathBuf,
    },
    /// The engine's etcd gate over the control planes given with --nodes.
    EtcdGate,
}

fn fail(code: i32, message: &str) -> ! {
    if code == EXIT_BAD_ARGUMENT {
        eprintln!("error: {message}");
    } else {
        eprintln!("{}", json!({ "error": message }));
    }
    std::process::exit(code)
}

fn api<T>(result: Result<T, TalosError>) -> T {
    result.unwrap_or_else(|e| fail(EXIT_FAILED, &report(&e)))
}

fn main() {
    let args: Args = parse_args();
    let text = match std::fs::read_to_string(&args.talosconfig) {
        Ok(text) => text,
        Err(e) => fail(EXIT_BAD_ARGUMENT, &format!("--talosconfig {}: {e}", args.talosconfig.display())),
    };
    let overrides =
        Overrides { context: args.context.clone(), endpoints: args.endpoints.clone(), nodes: args.nodes.clone() };
    let context = parse(&text, &overrides)
        .unwrap_or_else(|e| fail(EXIT_BAD_ARGUMENT, &format!("--talosconfig {}: {e}", args.talosconfig.display())));
    let client = TalosClient::new(&context, ClientOptions::default()).unwrap_or_else(|e| {
        fail(EXIT_BAD_ARGUMENT, &format!("--talosconfig {}: {}", args.talosconfig.display(), report(&e)))
    });
    let node = context.nodes.first().cloned().unwrap_or_default();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => fail(EXIT_FAILED, &format!("starting the async runtime: {e}")),
    };
    let output = runtime.block_on(run(&client, &node, &context.nodes, args.command));
    println!("{output}");
    std::process::exit(EXIT_OK);
}

async fn run(client: &TalosClient, node: &str, nodes: &[String], command: Command) -> Value {
    match command {
        Command::Version => json!({ "node": node, "version": api(client.version(node).await) }),
        Command::Upgrade { image, lifecycle: false } => {
            let ack =
                api(client.upgrade(node, &UpgradeRequest { image: image.clone(), timeout: UPGRADE_TIMEOUT }).await);
            json!({ "node": node, "image": image, "ack": ack.ack, "actor_id": ack.actor_id })
        }
        Command::Upgrade { image, lifecycle: true } => {
            let pulled =
                api(client.image_pull(node, &PullRequest { image: image.clone(), timeout: UPGRADE_TIMEOUT }).await);
            let install = InstallRequest { image: pulled.clone(), timeout: UPGRADE_TIMEOUT };
            let outcome = api(client.lifecycle_upgrade(node, &install).await);
            let exit = InstallExit::from_code(outcome.exit_code);
            let result = json!({ "node": node, "image": pulled, "exit_code": outcome.exit_code,
                                 "meaning": exit.meaning(), "output": outcome.output });
            if exit != InstallExit::Success {
                println!("{result}");
                std::process::exit(EXIT_FAILED)
            }
            result
        }
        Command::Pull { image } => {
            let name =
                api(client.image_pull(node, &PullRequest { image: image.clone(), timeout: UPGRADE_TIMEOUT }).await);
            json!({ "node": node, "image": name })
        }
        Command::Images => {
            let images = api(client.image_list(node).await);
            json!(
                images
                    .iter()
                    .map(|i| json!({ "name": i.name, "digest": i.digest, "size": i.size }))
                    .collect::<Vec<_>>()
            )
        }
        Command::Reboot => json!({ "node": node, "actor_id": api(client.reboot(node).await) }),
        Command::BootId => json!({ "node": node, "boot_id": api(client.boot_id(node).await) }),
        Command::EtcdMembers => {
            let members = api(client.etcd_members(node).await);
            json!(members
                .iter()
                .map(|m| json!({ "id": format!("{:016x}", m.id), "hostname": m.hostname, "is_learner": m.is_learner }))
                .collect::<Vec<_>>())
        }
        Command::EtcdStatus => {
            let s = api(client.etcd_status(node).await);
            json!({ "node": node, "member_id": format!("{:016x}", s.member_id), "leader": format!("{:016x}", s.leader),
                    "is_learner": s.is_learner, "errors": s.errors })
        }
        Command::EtcdAlarms => {
            let alarms = api(client.etcd_alarms(node).await);
            json!(
                alarms
                    .iter()
                    .map(|a| json!({ "member_id": format!("{:016x}", a.member_id), "alarm": a.kind }))
                    .collect::<Vec<_>>()
            )
        }
        Command::EtcdSnapshot { file } => {
            let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
            if !dir.is_dir() {
                fail(
                    EXIT_BAD_ARGUMENT,
                    &format!("etcd-snapshot {}: {} is not a directory", file.display(), dir.display()),
                );
            }
            let snapshot =
                client.etcd_snapshot_to_file(node, &file).await.unwrap_or_else(|e| fail(EXIT_FAILED, &report(&e)));
            json!({ "file": file, "size": snapshot.size, "sha256": snapshot.sha256 })
        }
        Command::EtcdGate => {
            if nodes.is_empty() {
                fail(EXIT_BAD_ARGUMENT, "etcd-gate needs the control planes: --nodes A,B,C");
            }
            let mut reports = Vec::new();
            for n in nodes {
                let name = client.nodename(n).await.unwrap_or_else(|_| n.clone());
                let members = client.etcd_members(n).await.map_err(|e| report(&e)).map(|list| {
                    list.into_iter().map(|m| Member { id: m.id, name: m.hostname, is_learner: m.is_learner }).collect()
                });
                let status = client.etcd_status(n).await.map_err(|e| report(&e));
                let alarms = client.etcd_alarms(n).await.map_err(|e| report(&e));
                reports.push(ControlPlaneReport { node: name, members, status, alarms });
            }
            match verdict(&reports) {
                EtcdVerdict::Healthy => json!({ "healthy": true, "control_planes": nodes }),
                EtcdVerdict::Unhealthy { reason } => {
                    println!("{}", json!({ "healthy": false, "reason": reason, "control_planes": nodes }));
                    std::process::exit(EXIT_FAILED)
                }
                EtcdVerdict::NotChecked => unreachable!("the verdict is always checked here"),
            }
        }
    }
}
