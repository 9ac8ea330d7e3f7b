//! `chime-runner`: parse the arguments, load the config, init tracing, run the worker until
//! SIGTERM or Ctrl-C (then drain).
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// A Chime worker for jobs that need no code: runs the commands and calls the HTTP endpoints
/// its config file declares, bound to job names.
#[derive(Debug, Parser)]
#[command(name = "chime-runner", version)]
struct Args {
    /// The runner's config file (TOML; see docs/runner.md).
    #[arg(long, env = "CHIME_RUNNER_CONFIG")]
    config: PathBuf,
    /// Check the config file, print the worker and its handlers, and exit.
    #[arg(long)]
    check: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = match chime_runner::config::load(&args.config) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    if args.check {
        print!("{}", chime_runner::describe(&config));
        println!("ok: {} handlers", config.handlers.len());
        return ExitCode::SUCCESS;
    }
    init_tracing();
    let worker = match chime_runner::worker(&config).build() {
        Ok(worker) => worker,
        Err(e) => {
            eprintln!("{}: {e}", args.config.display());
            return ExitCode::from(2);
        }
    };
    tracing::info!(
        group = config.worker.group,
        handlers = config.handlers.len(),
        "runner starting"
    );
    match worker.run_until_signal().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "runner failed");
            eprintln!("chime-runner: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr: `RUST_LOG` or info (AMQP and SQL clients at warn); JSON with
/// `CHIME_LOG_FORMAT=json`, as the `chime` binary.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,lapin=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if std::env::var("CHIME_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
