//! `kubectl-ichor`: the kubectl plugin ([`ichor_operator::plugin`]). On `PATH`, kubectl
//! runs it as `kubectl ichor ...`.

use clap::Parser;
use ichor_operator::plugin::{Args, EXIT_BAD_ARGUMENT, EXIT_FINDINGS, PluginError, run};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if e.use_stderr() => {
            eprint!("{e}");
            std::process::exit(EXIT_BAD_ARGUMENT);
        }
        Err(e) => {
            print!("{e}");
            std::process::exit(0);
        }
    };
    match run(&args).await {
        Ok(text) => print!("{text}"),
        Err(PluginError::Found(report)) => {
            print!("{report}");
            std::process::exit(EXIT_FINDINGS);
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}
