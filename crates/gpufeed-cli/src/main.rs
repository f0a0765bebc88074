//! `gpufeed`: run the pipeline over a folder, or measure what the u8 upload saves.
//!
//! With no arguments it runs the pipeline over the bundled `assets/` and, when a GPU is present,
//! the u8-vs-f32 upload comparison.

/// `println!` to standard output that ends the program quietly once the reader has gone
/// (`gpufeed run DIR --json | head -1`), where `println!` would panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::stdout_failed(e);
        }
    }};
}

mod npy;
mod run;
mod save;
mod targets;
mod views;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpufeed::Device;
use gpufeed_bench::upload::{self as bench, BenchOptions};

/// The command line's errors: the library's, the bench's, and its own files'.
pub type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

#[derive(Parser, Debug)]
#[command(
    name = "gpufeed",
    version,
    about = "Feed images to a GPU as u8, normalize them there. With no command: `run assets` \
             and, with a GPU, the u8-vs-f32 upload comparison."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the pipeline over every image under DIR and print a summary.
    Run(Box<run::RunArgs>),
    /// Detection or segmentation samples with their targets (`--coco FILE` or `--masks DIR`),
    /// transformed by one of torchvision's reference recipes and batched.
    Targets(Box<targets::TargetArgs>),
    /// Measure bytes and time of u8 vs f32 uploads and of the normalize kernel (needs a GPU).
    Bench(BenchArgs),
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// Batch sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,256")]
    batch_sizes: Vec<usize>,
    /// Image side (images are SIZE x SIZE x 3).
    #[arg(long, default_value_t = 224)]
    size: usize,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Also write the table as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Also draw time per batch against batch size as an SVG chart here.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = run::bare_shuffle(std::env::args_os().collect());
    let json = args.iter().any(|a| a == "--json");
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) if json => {
            // With --json, stdout is one JSON object whatever happens.
            let text = e.render().to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            out!(
                "{}",
                serde_json::json!({"error": first, "usage": text.trim_end()})
            );
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    let outcome = match cli.command {
        Some(Command::Run(args)) => run::run(&args).map(|_| ()),
        Some(Command::Bench(args)) => bench_command(&args),
        Some(Command::Targets(args)) => targets::run(&args),
        None => default_job(),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        // 128 and the signal's number, as a shell reports a program the signal ended.
        Err(e) if e.is::<run::Interrupted>() => {
            eprintln!("gpufeed: {e}");
            let status = e
                .downcast_ref::<run::Interrupted>()
                .map_or(130, |i| i.status());
            ExitCode::from(status)
        }
        Err(e) if e.is::<run::ArgumentError>() => {
            eprintln!("gpufeed: error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("gpufeed: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Standard output failed: a reader that has gone is the end of the program, not an error;
/// anything else is reported.
fn stdout_failed(error: std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("gpufeed: error: writing to standard output: {error}");
    std::process::exit(1);
}

/// `gpufeed` alone: the pipeline over assets/, then the upload comparison if there is a GPU,
/// then what to try next.
fn default_job() -> Result<()> {
    if !std::path::Path::new("assets").is_dir() {
        return Err(run::ArgumentError(
            "`gpufeed` alone runs the photos in assets/ of the repository, and there is no \
             assets/ here: run it from the repository's folder, or give your own images: \
             `gpufeed run DIR` (see `gpufeed run --help`)"
                .into(),
        )
        .into());
    }
    let device = match Cli::parse_from(["gpufeed", "run"]).command {
        Some(Command::Run(args)) => run::run(&args)?,
        _ => return Err("default arguments did not parse".into()),
    };
    if let Device::Cuda(ordinal) = device {
        out!();
        let options = BenchOptions {
            device: ordinal,
            runs: 30,
            ..BenchOptions::default()
        };
        let report = bench::run(&options)?;
        out!("{}", report.table().trim_end());
    }
    out!();
    out!("next: your own images");
    out!("  gpufeed run DIR                      every image under DIR, torchvision's eval transform");
    out!("  gpufeed run DIR --image-folder --train --epochs 2 --save out.npy");
    out!("  gpufeed run --help-all               every option");
    Ok(())
}

fn bench_command(args: &BenchArgs) -> Result<()> {
    let options = BenchOptions {
        batch_sizes: args.batch_sizes.clone(),
        height: args.size,
        width: args.size,
        runs: args.runs,
        device: args.device,
        ..BenchOptions::default()
    };
    if let Err(e) = gpufeed::cuda_status() {
        return Err(format!(
            "the bench measures GPU uploads and kernels, and there is nothing to measure here: {e}"
        )
        .into());
    }
    let report = bench::run(&options)?;
    out!("{}", report.table().trim_end());
    if let Some(path) = &args.csv {
        std::fs::write(path, report.csv())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        out!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        report.write_svg(path)?;
        out!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// `gpufeed run` as clap builds it.
    fn run_command() -> clap::Command {
        let mut cli = Cli::command();
        cli.build();
        cli.find_subcommand("run").expect("run").clone()
    }

    /// `gpufeed run --help` fits on a screen, one line an option, and says where the rest are;
    /// `--help-all` names every option, with its whole description.
    #[test]
    fn run_help_is_short_and_help_all_has_everything() {
        let mut run = run_command();
        let short = run.render_help().to_string();
        let long = run.render_long_help().to_string();
        assert!(short.lines().count() <= 60, "{short}");
        assert!(short.contains("gpufeed run --help-all"), "{short}");
        for arg in run.get_arguments() {
            let Some(name) = arg.get_long() else {
                continue;
            };
            let flag = format!("--{name}");
            assert!(long.contains(&flag), "--help-all lacks {flag}:\n{long}");
            if let Some(full) = arg.get_long_help() {
                let full = full.to_string();
                let first_words: Vec<&str> = full.split_whitespace().take(5).collect();
                let words: Vec<&str> = long.split_whitespace().collect();
                assert!(
                    words.windows(5).any(|w| w == first_words.as_slice()),
                    "--help-all lacks {flag}'s description"
                );
            }
            // An option's line starts with its flags (`-h, --help`), then its value's name.
            let shown = short.lines().any(|l| {
                l.split_whitespace()
                    .take_while(|w| w.starts_with('-'))
                    .any(|w| w.trim_end_matches(',') == flag)
            });
            assert_eq!(shown, !arg.is_hide_short_help_set(), "{flag} in --help");
            if shown {
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                assert!(
                    !help.contains('\n') && help.len() <= 80,
                    "{flag}'s line in --help: {help:?}"
                );
            }
        }
    }
}
