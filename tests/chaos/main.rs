//! `chime-chaos`: the chaos suite at full size. Starts a private PostgreSQL and RabbitMQ (one
//! node, or a cluster with `--rabbit-nodes 3`; TLS on both with `--tls`), runs
//! `chime scheduler` and `chime-test-worker` processes under a steady load of every-second jobs
//! while killing, stopping and freezing the leader, killing a worker, restarting and crashing
//! both services, and on a cluster stopping and SIGKILLing the node that leads the work queue,
//! then prints the reconciliation of expected fires against the
//! database and exits non-zero if a guarantee broke. docs/guarantees.md explains the table.
//!
//! Build the workspace first (`cargo build --release --workspace`): `chime` and
//! `chime-test-worker` are looked up next to this executable.

use std::path::PathBuf;
use std::time::Duration;

use chime_e2e::chaos::{self, ChaosPlan, Fault};
use clap::Parser;

/// Chaos suite: faults under load, then a reconciliation of every fire.
#[derive(Debug, Parser)]
#[command(name = "chime-chaos", version)]
struct Args {
    /// Jobs firing every second (the load, in fires per second).
    #[arg(long, default_value_t = 100)]
    jobs: usize,
    /// Scheduler instances.
    #[arg(long, default_value_t = 3)]
    schedulers: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Concurrent handlers per worker.
    #[arg(long, default_value_t = 64)]
    capacity: u16,
    /// How long each handler runs.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    handler: Duration,
    /// Steady load before, between and after faults.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    calm: Duration,
    /// How long RabbitMQ and PostgreSQL stay down when restarted.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    outage: Duration,
    /// RabbitMQ nodes: 1, or a cluster of 3 to 5, which adds the cluster faults (the node
    /// leading the work queue stopped, then the next leader SIGKILLed).
    #[arg(long, default_value_t = 1)]
    rabbit_nodes: usize,
    /// TLS to PostgreSQL and RabbitMQ, with certificates made for the run.
    #[arg(long)]
    tls: bool,
    /// Keep process logs here.
    #[arg(long)]
    log_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let plan = ChaosPlan {
        jobs: args.jobs,
        schedulers: args.schedulers,
        workers: args.workers,
        capacity: args.capacity,
        handler: args.handler,
        calm: args.calm,
        outage: args.outage,
        rabbit_nodes: args.rabbit_nodes,
        tls: args.tls,
        faults: if args.rabbit_nodes > 1 {
            Fault::ALL.iter().chain(&Fault::CLUSTER).copied().collect()
        } else {
            Fault::ALL.to_vec()
        },
        log_dir: args.log_dir,
    };
    eprintln!("chaos: {plan:?}");
    let report = chaos::run(plan).await?;
    println!("{}", report.table());
    report.check()
}
