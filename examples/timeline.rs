//! Draws a rollout's trace as an SVG timeline: one row per machine and a bar per phase
//! (a density band per role above `--dense-above` machines), with the faults, the etcd
//! gate and snapshot marked, and the physical bound as a line when given.
//!
//! ```text
//! cargo run --example timeline -- TRACE.jsonl -o FILE.svg [--bound SECONDS] [--title TEXT]
//!     [--width PIXELS] [--dense-above N] [--max-unavailable N]
//! ```
//! The trace is the JSON lines that `rollout --trace FILE` or `operator --trace FILE`
//! writes. Exit 0: drawn. Exit 2: bad arguments, or a trace that cannot be read (named by
//! line); nothing is written then. Exit 1: the picture could not be written.

use std::io::BufReader;
use std::path::PathBuf;

use clap::Parser;
use ichor_examples::{EXIT_BAD_ARGUMENT, EXIT_OK, parse_args};
use ichor_timeline::{Options, Timeline, read_trace, render};

/// Exit code: the picture could not be written.
const EXIT_WRITE_FAILED: i32 = 1;

/// Draw a rollout's trace (JSON lines) as an SVG timeline.
#[derive(Debug, Parser)]
#[command(name = "timeline")]
struct Args {
    /// The trace file (JSON lines, as `rollout --trace` or `operator --trace` writes).
    trace: PathBuf,
    /// Where to write the SVG.
    #[arg(short = 'o', long = "output", value_name = "FILE.svg")]
    output: PathBuf,
    /// The physical bound of the rollout, in seconds, drawn as a line.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    bound: Option<f64>,
    /// The title.
    #[arg(long, default_value = "Rollout timeline")]
    title: String,
    /// The picture's width in pixels.
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u32).range(400..=20000))]
    width: u32,
    /// Above this many machines, a density band per role instead of a row per machine.
    #[arg(long, default_value_t = 1000)]
    dense_above: usize,
    /// The workers' maxUnavailable, drawn as a line on their density band.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_unavailable: Option<u32>,
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(format!("expected a number of seconds, at least 0, got {text:?}")),
    }
}

fn main() {
    let args: Args = parse_args();
    let file = match std::fs::File::open(&args.trace) {
        Ok(file) => file,
        Err(e) => {
            eprintln!("error: {}: {e}", args.trace.display());
            std::process::exit(EXIT_BAD_ARGUMENT);
        }
    };
    let records = match read_trace(BufReader::new(file)) {
        Ok(records) => records,
        Err(e) => {
            eprintln!("error: {}: {e}", args.trace.display());
            std::process::exit(EXIT_BAD_ARGUMENT);
        }
    };
    let timeline = Timeline::from_records(&records);
    let options = Options {
        title: args.title,
        bound_s: args.bound,
        width: f64::from(args.width),
        dense_above: args.dense_above,
        max_unavailable: args.max_unavailable.map(|m| m as usize),
    };
    let document = render(&timeline, &options);
    if let Err(e) = std::fs::write(&args.output, document.to_string()) {
        eprintln!("error: writing {}: {e}", args.output.display());
        std::process::exit(EXIT_WRITE_FAILED);
    }
    println!(
        "{}: {} machines in {} groups, {} records",
        args.output.display(),
        timeline.rows.len(),
        timeline.groups.len(),
        records.len()
    );
    std::process::exit(EXIT_OK);
}
