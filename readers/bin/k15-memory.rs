//! `k15-memory`: reads the JSON leak reports the tracker writes (show, diff, merge, html, export).

use clap::{Args, Parser, Subcommand};
use k15_memory_readers::{diff, folded, html, merge, pprof, sarif, show, Report};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "k15-memory",
    version,
    about = "Read k15-memory's JSON leak reports"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The text report of a JSON report.
    Show {
        report: String,
        /// Only these kinds (comma-separated or repeated).
        #[arg(long, value_delimiter = ',', value_parser = ["direct", "indirect", "reachable", "errors", "profile"])]
        kind: Vec<String>,
        /// Only sites of this tag and of its children.
        #[arg(long)]
        tag: Option<String>,
        /// Only the N largest sites.
        #[arg(long, value_name = "N", default_value_t = 0)]
        top: usize,
    },
    /// Leak and error sites new, gone and grown from BASE to NEW; exit status 1 when NEW has a
    /// leak or error site BASE has not.
    Diff {
        base: String,
        new: String,
        /// Print {"new": [...], "gone": [...], "grown": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Many processes' reports as one, by site.
    Merge {
        #[arg(required = true)]
        reports: Vec<String>,
        #[arg(short, long, value_name = "OUT.json")]
        output: PathBuf,
    },
    /// The report as one self-contained HTML page.
    Html {
        report: String,
        /// Default: the report's path with .html for .json.
        #[arg(short, long, value_name = "OUT.html")]
        output: Option<PathBuf>,
    },
    /// The report in another tool's format.
    Export {
        #[command(flatten)]
        to: ExportTo,
        report: String,
    },
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct ExportTo {
    /// gzip'd pprof profile (go tool pprof).
    #[arg(long, value_name = "OUT.pb.gz")]
    pprof: Option<PathBuf>,
    /// Folded stacks of leaked bytes (flamegraph.pl, inferno, speedscope).
    #[arg(long, value_name = "OUT.txt")]
    folded: Option<PathBuf>,
    /// SARIF 2.1.0 (GitHub code scanning); paths under the current directory relative to it.
    #[arg(long, value_name = "OUT.sarif")]
    sarif: Option<PathBuf>,
}

/// A failure to report in one line; exit status 2.
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprintln!("k15-memory: a command is required: show, diff, merge, html or export (see k15-memory --help)");
            return ExitCode::from(2);
        }
        Err(e) => {
            // clap's first paragraph (an error and the arguments it names), on one line.
            let rendered = e.render().to_string();
            let first: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            eprintln!("k15-memory: {first} (see k15-memory --help)");
            return ExitCode::from(2);
        }
    };
    match run(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(Failure(why)) => {
            eprintln!("k15-memory: {why}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<u8, Failure> {
    match command {
        Command::Show {
            report,
            kind,
            tag,
            top,
        } => {
            let filter = show::Filter {
                kinds: kind,
                tag,
                top,
            };
            print(&show::text(&Report::load(&report)?, &filter))?;
        }
        Command::Diff { base, new, json } => {
            let changes = diff::diff(&Report::load(&base)?, &Report::load(&new)?);
            if json {
                print(&(serde_json::to_string_pretty(&changes)? + "\n"))?;
            } else {
                print(&diff::text(&changes))?;
            }
            return Ok(changes.exit_code() as u8);
        }
        Command::Merge { reports, output } => {
            let reports = reports
                .iter()
                .map(|r| Report::load(r))
                .collect::<Result<Vec<_>, _>>()?;
            let merged = serde_json::to_string(&merge::merge(&reports))?;
            write(&output, merged.as_bytes())?;
        }
        Command::Html { report, output } => {
            let page = html::page(&Report::load(&report)?);
            let output = output
                .unwrap_or_else(|| format!("{}.html", report.trim_end_matches(".json")).into());
            write(&output, page.as_bytes())?;
            eprintln!("k15-memory: wrote {}", output.display());
        }
        Command::Export { to, report } => {
            let report = Report::load(&report)?;
            if let Some(out) = to.pprof {
                let mut bytes = Vec::new();
                pprof::write(&report, &mut bytes)?;
                write(&out, &bytes)?;
            } else if let Some(out) = to.folded {
                write(&out, folded::text(&report).as_bytes())?;
            } else if let Some(out) = to.sarif {
                let root = std::env::current_dir()?;
                write(
                    &out,
                    serde_json::to_string_pretty(&sarif::log(&report, &root))?.as_bytes(),
                )?;
            }
        }
    }
    Ok(0)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, bytes)
        .map_err(|e| Failure(format!("{}: cannot write: {e}", path.display())))
}

/// Standard output, where a closed pipe (`| head`) is not an error worth a message.
fn print(text: &str) -> Result<(), Failure> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
