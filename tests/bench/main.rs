//! `chime-bench`: Chime's benchmark command. Each scenario starts what it needs against the
//! local PostgreSQL and RabbitMQ (its own database and queue prefix, removed at the end), measures
//! what PRODUCT.md §6 promises, and prints a table (or JSON with `--json`). docs/benchmarks.md
//! says what each scenario measures and how.
//!
//! ```text
//! cargo build --release --workspace
//! target/release/chime-bench precision --jobs 1000 --seconds 60 --csv precision.csv
//! target/release/chime-bench all --json
//! ```

mod children;
mod crash;
mod failover;
mod fanout;
mod jobs;
mod precision;
mod raw;
mod recorder;
mod report;
mod runner;
mod sandbox;
mod scale;
mod stats;
mod throughput;
mod worker;
mod workflow;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::report::Report;
use crate::sandbox::Services;

/// Benchmarks of Chime against the local PostgreSQL and RabbitMQ.
#[derive(Debug, Parser)]
#[command(name = "chime-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N jobs due every second for D seconds: delivered, missed, duplicates and lateness
    /// (scheduled instant → handler start) per (job, instant), from the worker side.
    Precision(RunArgs),
    /// As precision, with 10,000 jobs due on the same instant every 10 s and 4 workers.
    Burst(RunArgs),
    /// A ramp of durable runs/s past saturation: the highest rate with lateness p99 ≤ 100 ms,
    /// and nothing lost and no leader change at any rate.
    Throughput(RunArgs),
    /// N registered jobs with mixed schedules: scheduler RSS, start-up time, CPU per tick.
    Scale(RunArgs),
    /// Two schedulers, the leader SIGKILLed: takeover, time to next fire, missed, duplicates.
    Failover(RunArgs),
    /// A worker SIGKILLed mid-run: time until its runs start again on another worker.
    Crash(RunArgs),
    /// N chime-runner shell jobs every second: scheduled instant → the job's process started.
    Runner(RunArgs),
    /// Fires of N tasks: a sharded job of N shards and a map/reduce job mapping N sub-tasks,
    /// 3 each: publishing, last start and the run's end, tasks/s against 3,000.
    Fanout(RunArgs),
    /// Chains of child jobs (on_success) started at once: upstream ended → child started,
    /// p50/p99 against 50 ms, and one child per upstream run.
    Children(RunArgs),
    /// One run of a layered workflow DAG (1,000 nodes): after nodes ended → node started,
    /// p50/p99 against 50 ms, the run's total time, each node once and in order.
    Workflow(RunArgs),
    /// Every scenario in turn.
    All(RunArgs),
    /// A worker process for the crash scenario (internal).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// A Rust SDK worker process following the bench worker environment (docs/benchmarks.md,
    /// "Any worker"): `--worker-cmd "chime-bench env-worker"` measures the Rust SDK out of
    /// process, like any other worker.
    EnvWorker,
}

#[derive(Debug, Clone, Args)]
struct RunArgs {
    /// precision: jobs every second (default 1000); burst: jobs every 10 s (10000); scale:
    /// registered jobs (100000); failover: jobs every second (100); crash: runs in flight on
    /// the killed worker (4); runner: chime-runner shell jobs every second (20); fanout: tasks
    /// per fire, shards and mapped sub-tasks (10000); children: chains of 10 jobs started at
    /// once (50); workflow: the DAG's nodes (1000).
    #[arg(long)]
    jobs: Option<usize>,
    /// precision: seconds of firing (default 60); burst: seconds of firing (40); throughput:
    /// seconds per step (10); scale:
    /// seconds of steady CPU measurement (60); failover: seconds from the first fire to the
    /// stop (30); runner: seconds of firing (30). Unused by crash.
    #[arg(long)]
    seconds: Option<u64>,
    /// Print JSON (one object, an array for `all`) instead of tables.
    #[arg(long)]
    json: bool,
    /// precision: write every execution as `job_id,intended_at_unix_ms,started_at_unix_ms`.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// throughput: the rates to climb, runs per second, multiples of 100.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,2000,3000,4000,5000,6000,8000,10000,12000,15000,20000"
    )]
    rates: Vec<u32>,
    /// scale: executor groups the jobs are spread over.
    #[arg(long, default_value_t = 10)]
    groups: usize,
    /// workflow: layers of the DAG (default 20), each of nodes / layers nodes.
    #[arg(long)]
    layers: Option<usize>,
    /// In-process workers (precision, burst, throughput, failover, fanout, children,
    /// workflow); default 4
    /// for burst,
    /// 2 for fanout, 1 for the others.
    #[arg(long)]
    workers: Option<usize>,
    /// precision, burst, throughput: start each worker as `sh -c "exec CMD"` with the bench worker
    /// environment (docs/benchmarks.md, "Any worker") instead of in this process: any
    /// implementation of the protocol, measured from the starts it records.
    #[arg(long, value_name = "CMD")]
    worker_cmd: Option<String>,
    /// Handlers each worker runs at once; each in-process worker holds capacity + 2 database
    /// connections.
    #[arg(long, default_value_t = 32)]
    capacity: u16,
    /// Deliveries each in-process worker may hold beyond its handlers: triggers published
    /// ahead of their instant wait there. At least the triggers of one instant per worker.
    #[arg(long, default_value_t = 4096)]
    hold: u16,
    /// PostgreSQL server URL, without a database: each scenario creates its own.
    #[arg(
        long,
        env = "CHIME_BENCH_POSTGRES",
        default_value = "postgres://postgres@127.0.0.1:5432"
    )]
    postgres: String,
    /// RabbitMQ URL.
    #[arg(long, env = "CHIME_BENCH_AMQP", default_value = chime_e2e::AMQP_URL)]
    amqp: String,
    /// The `chime` binary for scale and failover (default: next to chime-bench).
    #[arg(long, env = "CHIME_BENCH_CHIME", value_name = "PATH")]
    chime: Option<PathBuf>,
    /// Keep each scenario's database and temporary files for inspection.
    #[arg(long)]
    keep: bool,
}

/// The scenarios, in the order `all` runs them.
const SCENARIOS: [&str; 10] = [
    "precision",
    "burst",
    "throughput",
    "scale",
    "failover",
    "crash",
    "runner",
    "fanout",
    "children",
    "workflow",
];

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Worker(_) | Command::EnvWorker => "info,sqlx=warn,lapin=warn",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let (scenarios, args): (Vec<&str>, RunArgs) = match cli.command {
        Command::Worker(args) => {
            return match worker::run(args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::EnvWorker => {
            return match worker::run_from_env().await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Precision(args) => (vec!["precision"], args),
        Command::Burst(args) => (vec!["burst"], args),
        Command::Throughput(args) => (vec!["throughput"], args),
        Command::Scale(args) => (vec!["scale"], args),
        Command::Failover(args) => (vec!["failover"], args),
        Command::Crash(args) => (vec!["crash"], args),
        Command::Runner(args) => (vec!["runner"], args),
        Command::Fanout(args) => (vec!["fanout"], args),
        Command::Children(args) => (vec!["children"], args),
        Command::Workflow(args) => (vec!["workflow"], args),
        Command::All(args) => (SCENARIOS.to_vec(), args),
    };
    let services = Services {
        postgres_url: args.postgres.clone(),
        amqp_url: args.amqp.clone(),
        chime: args.chime.clone(),
        keep: args.keep,
        interrupt: interrupt_on_signals(),
    };
    let mut outputs = Vec::new();
    let (mut errors, mut incorrect) = (0, 0);
    for scenario in &scenarios {
        if services.interrupt.is_cancelled() {
            break;
        }
        match run(scenario, &args, &services).await {
            Ok(report) => {
                if !report.correct {
                    incorrect += 1;
                }
                if !args.json {
                    println!("{}", report.render());
                }
                outputs.push(serde_json::to_value(&report).unwrap_or_default());
            }
            Err(e) => {
                errors += 1;
                eprintln!("error: {scenario}: {e:#}");
                outputs.push(serde_json::json!({"scenario": scenario, "error": format!("{e:#}")}));
            }
        }
    }
    if args.json {
        let document = if outputs.len() == 1 {
            outputs.pop().unwrap_or_default()
        } else {
            serde_json::Value::Array(outputs)
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&document).unwrap_or_default()
        );
    }
    if errors > 0 {
        ExitCode::FAILURE
    } else if incorrect > 0 {
        // Ran, but a correctness check (missed, duplicates, rerun) failed.
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// A token fired by the first SIGINT or SIGTERM.
fn interrupt_on_signals() -> tokio_util::sync::CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let token = tokio_util::sync::CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        let Ok(mut terminate) = signal(SignalKind::terminate()) else {
            let _ = tokio::signal::ctrl_c().await;
            fire.cancel();
            return;
        };
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        eprintln!("interrupted: stopping the scenario and cleaning up");
        fire.cancel();
    });
    token
}

/// Runs one scenario with the defaults of docs/benchmarks.md, overridden by the arguments.
async fn run(scenario: &str, args: &RunArgs, services: &Services) -> anyhow::Result<Report> {
    let worker = match &args.worker_cmd {
        Some(command) => recorder::WorkerKind::Command(command.clone()),
        None => recorder::WorkerKind::InProcess,
    };
    match scenario {
        "precision" => {
            let params = precision::Params {
                scenario: "precision",
                jobs: args.jobs.unwrap_or(1000),
                period: 1,
                p99_limit_ms: 10.0,
                seconds: args.seconds.unwrap_or(60),
                workers: args.workers.unwrap_or(1),
                worker: worker.clone(),
                capacity: args.capacity,
                hold: args.hold,
                csv: args.csv.clone(),
            };
            precision::run(services, &params).await
        }
        "burst" => {
            let params = precision::Params {
                scenario: "burst",
                jobs: args.jobs.unwrap_or(10_000),
                period: 10,
                p99_limit_ms: 100.0,
                seconds: args.seconds.unwrap_or(40),
                workers: args.workers.unwrap_or(4),
                worker: worker.clone(),
                capacity: args.capacity,
                hold: args.hold,
                csv: args.csv.clone(),
            };
            precision::run(services, &params).await
        }
        "throughput" => {
            let params = throughput::Params {
                rates: args.rates.clone(),
                seconds: args.seconds.unwrap_or(10),
                workers: args.workers.unwrap_or(1),
                worker,
                capacity: args.capacity,
                hold: args.hold,
            };
            throughput::run(services, &params).await
        }
        "scale" => {
            let params = scale::Params {
                jobs: args.jobs.unwrap_or(100_000),
                seconds: args.seconds.unwrap_or(60),
                groups: args.groups,
            };
            scale::run(services, &params).await
        }
        "failover" => {
            let params = failover::Params {
                jobs: args.jobs.unwrap_or(100),
                seconds: args.seconds.unwrap_or(30),
                workers: args.workers.unwrap_or(1),
                capacity: args.capacity,
                hold: args.hold,
            };
            failover::run(services, &params).await
        }
        "crash" => {
            let params = crash::Params {
                runs: args.jobs.unwrap_or(4),
            };
            crash::run(services, &params).await
        }
        "runner" => {
            let params = runner::Params {
                jobs: args.jobs.unwrap_or(20),
                seconds: args.seconds.unwrap_or(30),
            };
            runner::run(services, &params).await
        }
        "fanout" => {
            let params = fanout::Params {
                shards: args.jobs.unwrap_or(10_000),
                fires: 3,
                workers: args.workers.unwrap_or(2),
                capacity: args.capacity,
                hold: args.hold,
            };
            fanout::run(services, &params).await
        }
        "children" => {
            let params = children::Params {
                chains: args.jobs.unwrap_or(50),
                length: 10,
                workers: args.workers.unwrap_or(1),
                capacity: args.capacity,
            };
            children::run(services, &params).await
        }
        "workflow" => {
            let params = workflow::Params {
                nodes: args.jobs.unwrap_or(1_000),
                layers: args.layers.unwrap_or(workflow::DEFAULT_LAYERS),
                workers: args.workers.unwrap_or(1),
                capacity: args.capacity,
            };
            workflow::run(services, &params).await
        }
        other => anyhow::bail!("unknown scenario {other:?}"),
    }
}
