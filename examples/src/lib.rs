//! Shared pieces of the Ichor examples: how they report argument errors.
//!
//! The examples' command lines are contracts used by checks outside the repository, so
//! their output and exit codes are kept here in one place.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// Exit code: the request was carried out or allowed.
pub const EXIT_OK: i32 = 0;
/// Exit code: an argument could not be parsed.
pub const EXIT_BAD_ARGUMENT: i32 = 2;
/// Exit code: the request was understood and refused.
pub const EXIT_REFUSED: i32 = 3;

/// Parses the command line with clap; on an error, prints one line naming the argument
/// and exits with [`EXIT_BAD_ARGUMENT`]. `--help` and `--version` print and exit 0.
#[must_use]
pub fn parse_args<P: clap::Parser>() -> P {
    match P::try_parse() {
        Ok(parsed) => parsed,
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => e.exit(),
            _ => {
                println!("{}", one_line(&e.render().to_string()));
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

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn clap_errors_fold_to_one_line_that_names_the_argument() {
        let rendered = "error: the following required arguments were not provided:\n  --to <TO>\n\nUsage: upgrade-path --from <FROM> --to <TO>\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line(rendered), "error: the following required arguments were not provided: --to <TO>");
    }
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
pub fn executor_config(executor: ExecutorArg, prepull: Switch) -> ichor_talos_executor::ExecutorConfig {
    use ichor_upgrade_core::lifecycle_step::ExecutorChoice;
    let choice = match executor {
        ExecutorArg::Legacy => ExecutorChoice::Legacy,
        ExecutorArg::Lifecycle => ExecutorChoice::Lifecycle,
        ExecutorArg::Auto => ExecutorChoice::Auto,
    };
    ichor_talos_executor::ExecutorConfig::default().with_executor(choice).with_prepull(prepull == Switch::On)
}
