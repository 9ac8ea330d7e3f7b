//! The `chime-runner` binary against the real PostgreSQL and RabbitMQ: a trigger published as
//! the scheduler does runs a shell handler, whose stdout lines land in `chime_run_logs`; SIGTERM
//! drains, stopping a running job's process group. A sharded job's task sees its shard; an http
//! handler's JSON response lands in `chime_runs.output`.
//!
//! Needs `DATABASE_URL` (`#[sqlx::test]` gives the test its own database) and RabbitMQ at
//! `AMQP_URL` (default the local one); the test uses its own queue prefix and group and deletes
//! them at the end.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chime_protocol::Trigger;
use chime_protocol::topology::{Topology, WORK_KEY};
use chime_protocol::wire::{CONTENT_TYPE, HEADER_ATTEMPT, PROTOCOL_VERSION, Shard, Task, TaskKind};
use chime_test_kit::{Setup, done_if, wait_for};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sqlx::PgPool;

const WAIT: Duration = Duration::from_secs(30);

/// The runner process; killed if the test fails before stopping it.
struct Runner(Option<Child>);

impl Runner {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.0.as_ref().unwrap().id() as i32)
    }

    /// SIGTERM, then waits for the exit; returns whether it exited with success.
    async fn terminate(mut self) -> bool {
        kill(self.pid(), Signal::SIGTERM).unwrap();
        let mut child = self.0.take().unwrap();
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        status.success()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn insert_run(pool: &PgPool, group: &str, job: &str, params: &Value) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state)
         VALUES ($1, $2, now(), 'manual', $3, 'queued') RETURNING id",
    )
    .bind(job)
    .bind(group)
    .bind(params)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Inserts a run and publishes its trigger as the scheduler does (persistent, mandatory,
/// confirmed; retried while unroutable).
async fn submit(
    setup: &Setup,
    channel: &Channel,
    topology: &Topology,
    job: &str,
    params: Value,
) -> i64 {
    let run_id = insert_run(&setup.pool, &setup.group, job, &params).await;
    publish(setup, channel, topology, run_id, job, params, None).await;
    run_id
}

/// Publishes the trigger of run `run_id` (task `task` of its parent, if any) as the scheduler
/// does.
async fn publish(
    setup: &Setup,
    channel: &Channel,
    topology: &Topology,
    run_id: i64,
    job: &str,
    params: Value,
    task: Option<Task>,
) {
    let scheduled_at = sqlx::query_scalar("SELECT scheduled_at FROM chime_runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(&setup.pool)
        .await
        .unwrap();
    let trigger = Trigger {
        v: PROTOCOL_VERSION,
        run_id,
        job: job.to_owned(),
        group: setup.group.clone(),
        attempt: 1,
        scheduled_at,
        params,
        timeout_ms: None,
        retry: None,
        task,
    };
    let mut headers = FieldTable::default();
    headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(1));
    let properties = BasicProperties::default()
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_message_id(run_id.to_string().into())
        .with_headers(headers);
    let body = trigger.to_body();
    chime_test_kit::publish_routed(channel, &topology.exchange(), WORK_KEY, &body, &properties)
        .await;
}

async fn state(pool: &PgPool, run_id: i64) -> (String, Option<String>) {
    sqlx::query_as("SELECT state, error FROM chime_runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn wait_state(pool: &PgPool, run_id: i64, wanted: &str) -> Option<String> {
    wait_for(
        WAIT,
        &format!("run {run_id} to be {wanted}"),
        || async move { done_if(state(pool, run_id).await, |(s, _)| s == wanted) },
    )
    .await
    .1
}

async fn logs(pool: &PgPool, run_id: i64) -> Vec<(String, String)> {
    sqlx::query_as("SELECT level, message FROM chime_run_logs WHERE run_id = $1 ORDER BY id")
        .bind(run_id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Writes `runner.toml` in `dir`: the `[worker]` table of `setup`'s group, queue prefix and
/// services (`extra` adds keys to it), then `handlers`.
fn write_config(
    dir: &std::path::Path,
    setup: &Setup,
    extra: &str,
    handlers: &str,
) -> std::path::PathBuf {
    let config = dir.join("runner.toml");
    std::fs::write(
        &config,
        format!(
            r#"[worker]
group = "{group}"
{extra}database_url = "{database_url}"
amqp_url = "{amqp_url}"
queue_prefix = "{prefix}"
drain_timeout = "1s"

{handlers}"#,
            group = setup.group,
            database_url = setup.database_url,
            amqp_url = setup.amqp_url,
            prefix = setup.prefix,
        ),
    )
    .unwrap();
    config
}

/// Starts the runner binary on `config`.
fn start_runner(config: &std::path::Path) -> Runner {
    Runner(Some(
        Command::new(env!("CARGO_BIN_EXE_chime-runner"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    ))
}

#[sqlx::test(migrations = "../migrations")]
async fn a_shard_task_sees_its_shard_and_an_http_response_becomes_the_run_output(pool: PgPool) {
    let setup = Setup::new(&pool);
    let topology = Topology::new(setup.prefix.as_str(), setup.group.as_str());
    let (connection, channel) = chime_test_kit::confirm_channel(&setup.amqp_url).await;
    topology.declare(&channel).await.unwrap();

    // The endpoint: answers JSON naming the run it was called for.
    let app = axum::Router::new().route(
        "/jobs/settle/{run}",
        axum::routing::post(
            |axum::extract::Path(run): axum::extract::Path<i64>| async move {
                axum::Json(json!({"settled": run, "rows": [1, 2, 3]}))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &setup,
        "",
        &format!(
            r#"[[handlers]]
name = "per-region"
kind = "shell"
argv = ["sh", "-c", "echo \"shard $1 of region $2; env $CHIME_SHARD_INDEX/$CHIME_SHARD_TOTAL $CHIME_SHARD_PARAM\"", "sh", "{{ctx:shard_index}}/{{ctx:shard_total}}", "{{ctx:shard_param}}"]

[[handlers]]
name = "settle"
kind = "http"
url = "{base}/jobs/settle/{{ctx:run_id}}"
allow = ["{base}/jobs/"]
method = "POST"
"#
        ),
    );
    let runner = start_runner(&config);

    // A sharded job's fire as the leader expands it: a parent run (never published) and its
    // task `shard/1` of 2, whose trigger carries the shard. The parent counts one task, so it
    // ends with it.
    let parent: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                 tasks_total)
         VALUES ('per-region', $1, now(), 'manual', 'null', 'queued', 1) RETURNING id",
    )
    .bind(&setup.group)
    .fetch_one(&pool)
    .await
    .unwrap();
    let task_run: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                 parent_id, task_key, task_kind, shard_index, shard_total,
                                 shard_param)
         SELECT job_name, group_name, scheduled_at, trigger, params, 'queued', id, 'shard/1',
                'shard', 1, 2, '\"eu-west\"'
           FROM chime_runs WHERE id = $1 RETURNING id",
    )
    .bind(parent)
    .fetch_one(&pool)
    .await
    .unwrap();
    let task = Task {
        parent_run_id: parent,
        key: "shard/1".into(),
        kind: TaskKind::Shard,
        shard: Some(Shard {
            index: 1,
            total: 2,
            param: Some(json!("eu-west")),
        }),
        worker: None,
        step: None,
        depth: None,
    };
    publish(
        &setup,
        &channel,
        &topology,
        task_run,
        "per-region",
        Value::Null,
        Some(task),
    )
    .await;
    assert_eq!(wait_state(&pool, task_run, "succeeded").await, None);
    assert_eq!(
        logs(&pool, task_run).await,
        [(
            "info".to_owned(),
            "shard 1/2 of region eu-west; env 1/2 eu-west".to_owned()
        )]
    );
    assert_eq!(wait_state(&pool, parent, "succeeded").await, None);

    let settle = submit(&setup, &channel, &topology, "settle", Value::Null).await;
    assert_eq!(wait_state(&pool, settle, "succeeded").await, None);
    let output: Option<Value> = sqlx::query_scalar("SELECT output FROM chime_runs WHERE id = $1")
        .bind(settle)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(output, Some(json!({"settled": settle, "rows": [1, 2, 3]})));

    assert!(runner.terminate().await, "the runner did not exit cleanly");
    let _ = connection.close(200, "test done".into()).await;
    setup.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_runner_binary_runs_a_triggered_shell_job_and_stores_its_output(pool: PgPool) {
    let setup = Setup::new(&pool);
    let topology = Topology::new(setup.prefix.as_str(), setup.group.as_str());
    let (connection, channel) = chime_test_kit::confirm_channel(&setup.amqp_url).await;
    topology.declare(&channel).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &setup,
        "capacity = 2\n",
        r#"[[handlers]]
name = "greet"
kind = "shell"
argv = ["sh", "-c", "echo \"hello, $1\"; echo \"run $CHIME_RUN_ID\"; echo warned >&2", "sh", "{name}"]

[[handlers]]
name = "long"
kind = "shell"
argv = ["sh", "-c", "trap '' TERM; echo $$; exec sleep 100"]
kill_grace = "1s"
"#,
    );
    let runner = start_runner(&config);

    let run_id = submit(
        &setup,
        &channel,
        &topology,
        "greet",
        json!({"name": "Ada; rm -rf /"}),
    )
    .await;
    assert_eq!(wait_state(&pool, run_id, "succeeded").await, None);
    // Each stream's lines keep their order; stdout and stderr are two pipes, read as they come.
    let (stdout, stderr): (Vec<_>, Vec<_>) = logs(&pool, run_id)
        .await
        .into_iter()
        .partition(|(level, _)| level == "info");
    assert_eq!(
        stdout,
        [
            ("info".to_owned(), "hello, Ada; rm -rf /".to_owned()),
            ("info".to_owned(), format!("run {run_id}")),
        ]
    );
    assert_eq!(stderr, [("warn".to_owned(), "warned".to_owned())]);

    // A job still running at SIGTERM, ignoring SIGTERM itself: after the drain timeout its
    // process group gets SIGTERM, then SIGKILL after kill_grace, within the SDK's cancel grace;
    // the run is recorded as interrupted, and the runner exits cleanly.
    let long = submit(&setup, &channel, &topology, "long", Value::Null).await;
    let pool_ref = &pool;
    let pid: i32 = wait_for(WAIT, "the long job's pid in its log", || async move {
        logs(pool_ref, long)
            .await
            .first()
            .and_then(|(_, m)| m.parse().ok())
    })
    .await;
    assert!(runner.terminate().await, "the runner did not exit cleanly");
    let (state, error) = wait_for(WAIT, "the long run to be recorded", || async move {
        done_if(state(pool_ref, long).await, |(s, _)| {
            s != "running" && s != "queued"
        })
    })
    .await;
    let error = error.unwrap_or_default();
    assert!(
        error.starts_with("interrupted by worker shutdown"),
        "{state}: {error}"
    );
    assert!(
        error.contains("the process group got SIGTERM, then SIGKILL after 1s"),
        "{error}"
    );
    assert!(
        logs(&pool, long)
            .await
            .iter()
            .any(|(_, m)| m == "still running 1s after SIGTERM: sent SIGKILL to the process group"),
        "{:?}",
        logs(&pool, long).await
    );
    wait_for(WAIT, "the long job's process to be gone", || async move {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        done_if(stat, |s| {
            s.as_ref().map_or(true, |s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
        })
        .map(|_| ())
        .map_err(|s| s.ok())
    })
    .await;
    let _ = connection.close(200, "test done".into()).await;
    setup.finish().await;
}
