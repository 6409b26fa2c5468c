//! The `ferrofeed` command: its subcommands (each domain's flags are that
//! domain's typed settings from [`ferrofeed_jobs`], derived as clap
//! arguments) and the run loop with its progress bar, `--dump` and signals.
//!
//! ```text
//! ferrofeed vision DIR --epochs 2 --report-json run.json --dump out/
//! ```
mod run;

use clap::{Parser, Subcommand};
use ferrofeed_jobs::{audio, text, vision, InspectArgs, MakeArgs};

pub use run::{run, CliError};

#[derive(Parser, Debug)]
#[command(
    name = "ferrofeed",
    version,
    about = "Run, inspect and benchmark ferrofeed input pipelines",
    long_about = "Run, inspect and benchmark ferrofeed input pipelines.\n\nWith no arguments: the vision training pipeline on the embedded default dataset."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Vision pipeline: ImageFolder (DIR/<class>/<file>) or WebDataset shards (*.tar).
    Vision(Box<vision::VisionSettings>),
    /// Text pipeline: .txt/.jsonl lines → tokens → padded or packed batches.
    Text(Box<text::TextSettings>),
    /// Audio pipeline: files → streamed chunks → spectrogram / mel / log-mel.
    Audio(Box<audio::AudioSettings>),
    /// Pull one sample through every stage and print each stage's components.
    Inspect {
        #[command(subcommand)]
        domain: InspectDomain,
    },
    /// Write a deterministic synthetic dataset.
    MakeDataset {
        #[command(subcommand)]
        domain: MakeDomain,
    },
}

#[derive(Subcommand, Debug)]
enum InspectDomain {
    /// Inspect a vision sample.
    Vision(vision::InspectArgs),
    /// Inspect a text sample.
    Text(InspectArgs<text::TextOptions>),
    /// Inspect an audio chunk.
    Audio(InspectArgs<audio::AudioOptions>),
}

#[derive(Subcommand, Debug)]
enum MakeDomain {
    /// ImageNet-like folder: 10 classes of ~500×375 JPEGs (q90).
    Vision(vision::MakeVisionArgs),
    /// Lines of the embedded corpus in .txt and .jsonl files (1,000 lines each).
    Text(MakeArgs),
    /// Tones, chirps and noise as wav/flac files of varied lengths and rates (`--speech`: and three spoken sentences).
    Audio(audio::MakeArgs),
}

/// Runs the command line; returns the exit status.
pub fn main() -> i32 {
    // Warnings (a fallback, a stuck worker) go to stderr, one line each;
    // --quiet keeps stderr to errors.
    let quiet = std::env::args().any(|a| a == "--quiet");
    let level = if quiet { "error" } else { "warn" };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .try_init();
    let cli = Cli::parse();
    let print = |text: Result<String, ferrofeed_jobs::JobError>| -> Result<(), CliError> {
        let text = text?;
        print!("{text}");
        if !text.is_empty() && !text.ends_with('\n') {
            println!();
        }
        Ok(())
    };
    let result = match cli.cmd {
        None => vision::build(vision::VisionSettings::default())
            .map_err(CliError::from)
            .and_then(|j| run(&j)),
        Some(Cmd::Vision(a)) => vision::build(*a)
            .map_err(CliError::from)
            .and_then(|j| run(&j)),
        Some(Cmd::Text(a)) => text::build(*a)
            .map_err(CliError::from)
            .and_then(|j| run(&j)),
        Some(Cmd::Audio(a)) => audio::build(*a)
            .map_err(CliError::from)
            .and_then(|j| run(&j)),
        Some(Cmd::Inspect {
            domain: InspectDomain::Audio(a),
        }) => print(audio::inspect(a)),
        Some(Cmd::MakeDataset {
            domain: MakeDomain::Audio(a),
        }) => print(audio::make_dataset(&a)),
        Some(Cmd::Inspect {
            domain: InspectDomain::Text(a),
        }) => print(text::inspect(a)),
        Some(Cmd::MakeDataset {
            domain: MakeDomain::Text(a),
        }) => print(text::make_dataset(&a)),
        Some(Cmd::Inspect {
            domain: InspectDomain::Vision(a),
        }) => print(vision::inspect(a)),
        Some(Cmd::MakeDataset {
            domain: MakeDomain::Vision(a),
        }) => print(vision::make_dataset(&a)),
    };
    match result {
        Ok(()) => 0,
        Err(e @ CliError::Interrupted { .. }) => {
            eprintln!("ferrofeed: {e}");
            e.exit_code()
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags' defaults are the settings' own `Default`s: a bare
    /// subcommand parses into exactly those.
    #[test]
    fn a_bare_subcommand_is_the_default_settings() {
        let parse = |argv: &[&str]| Cli::try_parse_from(argv).unwrap().cmd;
        let Some(Cmd::Vision(v)) = parse(&["ferrofeed", "vision"]) else {
            panic!("not vision")
        };
        assert_eq!(*v, vision::VisionSettings::default());
        let Some(Cmd::Text(t)) = parse(&["ferrofeed", "text"]) else {
            panic!("not text")
        };
        assert_eq!(*t, text::TextSettings::default());
        let Some(Cmd::Audio(a)) = parse(&["ferrofeed", "audio"]) else {
            panic!("not audio")
        };
        assert_eq!(*a, audio::AudioSettings::default());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
