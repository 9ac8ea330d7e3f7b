//! `chime`: parse arguments, load settings, set up logging, then run the scheduler
//! ([`chime_scheduler::service::run`]) or the command.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use chime_scheduler::auth::Caller;
use chime_scheduler::cli::{Broker, Cli, Command};
use chime_scheduler::config::Settings;
use chime_scheduler::service;
use chime_scheduler::store::Store;
use clap::{CommandFactory as _, Parser as _};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(matches!(cli.command, Command::Scheduler { .. }));
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chime_scheduler::cli::error_report(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Check { files } = &cli.command {
        let mut out = std::io::stdout().lock();
        let ok = chime_scheduler::check::check(files, chrono::Utc::now(), &mut out)?;
        out.flush()?;
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if let Command::Completions { shell } = cli.command {
        let mut out = std::io::stdout().lock();
        clap_complete::generate(shell, &mut Cli::command(), "chime", &mut out);
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    let settings = Settings::load(cli.config.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    match cli.command {
        Command::Scheduler { jobs, watch } => {
            let mut settings = settings;
            settings.jobs.extend(jobs);
            settings.watch |= watch;
            service::run(settings, stop_on_signal()?).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let created = Store::create_database_if_missing(&settings.database_url).await?;
            let store = Store::connect(&settings.database_url, 2).await?;
            let applied = store.migrate().await?;
            let database = database_name(&settings.database_url);
            let migrations = match applied {
                1 => "1 migration".to_owned(),
                n => format!("{n} migrations"),
            };
            match (created, applied) {
                (true, _) => println!("created database {database}; applied {migrations}"),
                (false, 0) => println!("database {database} is up to date"),
                (false, _) => println!("database {database}: applied {migrations}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Diff { files } => {
            let store = Store::connect(&settings.database_url, 2).await?;
            let mut out = std::io::stdout().lock();
            let json = cli.output == chime_scheduler::cli::Output::Json;
            let code = chime_scheduler::diff::run(&store, &files, json, &mut out).await?;
            out.flush()?;
            Ok(code)
        }
        command => {
            let store = Store::connect(&settings.database_url, 2).await?;
            let broker = Broker::new(settings.amqp_addresses(), &settings.queue_prefix)
                .with_amqp_tls(settings.amqp_tls.clone())
                .with_management_url(settings.management_url.as_deref());
            let caller = Caller::cli_as(cli.actor.as_deref());
            let mut out = std::io::stdout().lock();
            chime_scheduler::cli::operate_as(
                &store,
                Some(&broker),
                &caller,
                cli.output,
                command,
                &mut out,
            )
            .await
        }
    }
}

/// A token cancelled on SIGTERM or Ctrl-C.
fn stop_on_signal() -> anyhow::Result<CancellationToken> {
    let shutdown = CancellationToken::new();
    let mut terminate = signal(SignalKind::terminate())?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        stop.cancel();
    });
    Ok(shutdown)
}

/// The database `url` names, for messages (PostgreSQL's default: the user's name).
fn database_name(url: &str) -> String {
    url.parse::<sqlx::postgres::PgConnectOptions>()
        .ok()
        .and_then(|o| o.get_database().map(str::to_owned))
        .unwrap_or_else(|| "(default)".into())
}

/// Logs go to stderr, coloured only when it is a terminal; `RUST_LOG` filters, `CHIME_LOG_FORMAT=json`
/// switches to JSON lines. The scheduler logs at `info` by default; the other commands print
/// their result to stdout and log only warnings and errors, unless `RUST_LOG` says otherwise.
fn init_tracing(serving: bool) {
    let default = if serving {
        format!(
            "info,sqlx=warn,{}",
            chime_scheduler::amqp::QUIET_CLIENT_LOGS
        )
    } else {
        "warn".to_owned()
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
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
