//! README.md's worker, as a reader runs it: the built `worker-sdk/examples/quickstart.rs`
//! (which `worker-sdk/tests/readme.rs` keeps identical to the README's text) as its own process,
//! configured only through `CHIME_DATABASE_URL`, `CHIME_AMQP_URL` and `CHIME_QUEUE_PREFIX`, runs
//! a triggered run of its job to success and drains on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use chime_e2e::process::{Process, sibling_binary};
use chime_e2e::{AMQP_URL, Scheduler, Setup, service_config, unique, wait_for};
use chime_scheduler::auth::Caller;
use chime_scheduler::ops::Operations;
use chime_scheduler::store::Store;
use serde_json::json;
use sqlx::PgPool;

use crate::common::{job, runs};

/// Generous for a shared two-core machine; every wait ends as soon as its condition holds.
const PATIENCE: Duration = Duration::from_secs(30);

/// Issue 12: the README's worker failed with "no database" as written.
#[sqlx::test(migrations = "../migrations")]
async fn the_readme_quickstart_worker_runs_a_job_configured_by_environment(pool: PgPool) {
    // The quickstart's group and job, as written in the README.
    let (group, name) = ("orders", "close-unpaid-orders");
    let t = Setup::new(&pool).with_groups(&[group]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, &unique("qs-sched"), &prefix),
        vec![job(json!({"name": name, "group": group}))],
    );
    let dir = tempfile::tempdir().expect("temporary directory");
    let binary = sibling_binary("chime-quickstart").expect("chime-quickstart is built");
    let mut command = tokio::process::Command::new(binary);
    command
        .env("CHIME_DATABASE_URL", &db)
        .env("CHIME_AMQP_URL", AMQP_URL)
        .env("CHIME_QUEUE_PREFIX", &prefix);
    let log = dir.path().join("quickstart.log");
    let mut worker = Process::spawn("quickstart", command, &log).expect("quickstart starts");

    // The worker is up once it has registered in the test's own database.
    wait_for(PATIENCE, "the quickstart worker to register", || async {
        let online: i64 =
            sqlx::query_scalar("SELECT count(*) FROM chime_workers WHERE group_name = $1")
                .bind(group)
                .fetch_one(&pool)
                .await
                .ok()?;
        (online == 1).then_some(())
    })
    .await;
    let ops = Operations::new(Store::from_pool(pool.clone()), None);
    let run_id = wait_for(PATIENCE, "the job to be loaded and triggered", || async {
        ops.trigger(&Caller::cli(), name, Some(json!({"batch": 5})))
            .await
            .ok()
            .map(|t| t.run_id)
    })
    .await;
    wait_for(PATIENCE, "the run to succeed", || async {
        runs(&pool, name)
            .await
            .into_iter()
            .find(|r| r.id == run_id && r.state == "succeeded")
    })
    .await;
    let lines: Vec<String> =
        sqlx::query_scalar("SELECT message FROM chime_run_logs WHERE run_id = $1 ORDER BY id")
            .bind(run_id)
            .fetch_all(&pool)
            .await
            .expect("log lines");
    assert_eq!(lines, ["closing up to 5 orders"]);

    // SIGTERM to its PID: it drains and exits cleanly, having printed what it did (the README
    // promises a subscriber that shows the run and its log line).
    worker.ensure_running().expect("still running");
    assert!(
        worker.stop(PATIENCE).await.expect("stopped"),
        "the quickstart did not exit cleanly on SIGTERM; its log: {}",
        log.display()
    );
    let printed = std::fs::read_to_string(&log).expect("its log");
    assert!(printed.contains("closing up to 5 orders"), "{printed}");
    scheduler.stop().await.expect("scheduler stops");
    t.finish().await;
}

/// Issue 16: README's first command on a machine without RabbitMQ (its commands are hidden from
/// `PATH` here). As root on Debian it installs the distribution's package (dry run: it prints the
/// commands and changes nothing); as another user it exits non-zero, printing the exact install
/// command and the containers alternative, instead of failing on a missing `rabbitmqctl`.
#[test]
fn the_services_script_installs_a_missing_broker_or_prints_how() {
    let script = chime_test_kit::deploy_path("local/services.sh");
    // PATH without the directories holding RabbitMQ's commands (/sbin and /usr/sbin alike).
    let path: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .filter(|d| {
            !["rabbitmq-server", "rabbitmqctl"]
                .iter()
                .any(|c| d.join(c).exists())
        })
        .collect();
    let path = std::env::join_paths(path).expect("a PATH");
    // Found on the whole PATH: a command's own PATH is where its program is looked up, and
    // runuser is in /usr/sbin, beside RabbitMQ's commands.
    let (bash, runuser) = (on_path("bash"), on_path("runuser"));
    let run = |as_nobody: bool| {
        let mut command = if as_nobody {
            let mut c = Command::new(&runuser);
            c.args(["-u", "nobody", "--"]).arg(&bash);
            c
        } else {
            Command::new(&bash)
        };
        command
            .arg(&script)
            .env("PATH", &path)
            .env("CHIME_SERVICES_DRY_RUN", "1")
            .output()
            .expect("running deploy/local/services.sh")
    };
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.uid() == 0
    });
    let debian = Path::new("/etc/debian_version").exists();

    if root && debian {
        let out = run(false);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("would run: apt-get update -q")
                && stdout.contains(
                    "would run: env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                     rabbitmq-server"
                ),
            "{stdout}"
        );
        assert!(
            !stdout.contains("postgresql"),
            "PostgreSQL is installed: {stdout}"
        );
    }
    // Not root (nobody, when this test runs as root): nothing can be installed.
    let out = run(root);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not installed: rabbitmq-server")
            && stderr.contains("sudo apt-get install -y rabbitmq-server")
            && stderr.contains("docker compose -f deploy/compose.yaml up"),
        "{stderr}"
    );
}

/// `command`'s path on this process's `PATH`; panics naming it when it is not there.
fn on_path(command: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(command))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{command} is not on PATH"))
}
