//! Says whether a Talos upgrade is allowed, on one line.
//!
//! ```text
//! cargo run -q --example upgrade-path -- --from <talos version> --to <talos version> [--kubernetes <version>]
//! ```
//! Exit 0: allowed. Exit 3: refused, saying why (the minor lines to go through, or the
//! supported Kubernetes range). Exit 2: an argument that does not parse, named.

use clap::Parser;
use ichor_examples::{EXIT_OK, EXIT_REFUSED, parse_args};
use ichor_upgrade_core::versions::{
    KubernetesVersion, TalosVersion, UpgradeStep, check_kubernetes_pairing, check_upgrade_path,
};

/// Is the upgrade from one Talos version to another allowed, with this Kubernetes?
#[derive(Debug, Parser)]
#[command(name = "upgrade-path")]
struct Args {
    /// The Talos version the node runs now, such as v1.14.3.
    #[arg(long, value_parser = TalosVersion::parse)]
    from: TalosVersion,
    /// The Talos version to upgrade to, such as v1.14.4.
    #[arg(long, value_parser = TalosVersion::parse)]
    to: TalosVersion,
    /// The cluster's Kubernetes version, such as 1.34.1; checked against the target's range.
    #[arg(long, value_parser = KubernetesVersion::parse)]
    kubernetes: Option<KubernetesVersion>,
}

fn main() {
    let args: Args = parse_args();
    let (line, code) = verdict(&args);
    println!("{line}");
    std::process::exit(code);
}

fn verdict(args: &Args) -> (String, i32) {
    let step = match check_upgrade_path(&args.from, &args.to) {
        Ok(step) => step,
        Err(refusal) => return (format!("refused: {refusal}"), EXIT_REFUSED),
    };
    let what = match step {
        UpgradeStep::AlreadyOnTarget => format!("already on {} (nothing to do)", args.to),
        UpgradeStep::WithinMinor | UpgradeStep::NextMinor => format!("{} -> {}", args.from, args.to),
    };
    let Some(kubernetes) = &args.kubernetes else {
        return (format!("allowed: {what}"), EXIT_OK);
    };
    match check_kubernetes_pairing(&args.to, kubernetes) {
        Ok(support) => (
            format!(
                "allowed: {what} with Kubernetes {kubernetes} (Talos {} supports {support})",
                args.to.minor_line().talos()
            ),
            EXIT_OK,
        ),
        Err(refusal) => (format!("refused: {refusal}"), EXIT_REFUSED),
    }
}
