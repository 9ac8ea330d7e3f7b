//! Helpers of the failure-handling scenarios: worker child processes, manual triggers through
//! the scheduler's store, attempt rows, and the broker's global `consumer_timeout` (restored by
//! a guard). Names, waits and captured events come from the test kit.

use std::process::Stdio;
use std::time::Duration;

use chime_e2e::{AMQP_URL, done_if, wait_for};
use chime_scheduler::store::Store;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::process::{Child, Command};

use crate::common::rabbitmqctl;

/// How long a condition of these scenarios may take.
pub const WAIT: Duration = Duration::from_secs(30);

/// A `chime-test-worker` child process (`tests/bin/chime_test_worker.rs`), killed if dropped.
pub struct WorkerProcess {
    pub id: String,
    child: Child,
}

impl WorkerProcess {
    /// Starts a worker of `group` with worker id `id`.
    pub fn spawn(
        database_url: &str,
        prefix: &str,
        group: &str,
        id: &str,
        heartbeat_ms: u64,
        capacity: u16,
    ) -> WorkerProcess {
        let verbose = std::env::var_os("RUST_LOG").is_some();
        let child = Command::new(env!("CARGO_BIN_EXE_chime-test-worker"))
            .env("CHIME_TEST_DATABASE_URL", database_url)
            .env("CHIME_TEST_AMQP_URLS", AMQP_URL)
            .env("CHIME_TEST_PREFIX", prefix)
            .env("CHIME_TEST_GROUP", group)
            .env("CHIME_TEST_WORKER_ID", id)
            .env("CHIME_TEST_HEARTBEAT_MS", heartbeat_ms.to_string())
            .env("CHIME_TEST_CAPACITY", capacity.to_string())
            .stdin(Stdio::null())
            .stdout(if verbose {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(if verbose {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()
            .expect("start chime-test-worker");
        WorkerProcess {
            id: id.to_owned(),
            child,
        }
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL the worker");
        self.child.wait().await.expect("reap the worker");
    }

    /// True once the process has exited (it reaps it).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("poll the worker").is_some()
    }
}

/// Triggers job `job` with `params` through the scheduler's store (as `chime jobs trigger`
/// does), once the scheduler has synced its jobs; returns the run id.
pub async fn trigger(pool: &PgPool, job: &str, params: serde_json::Value) -> i64 {
    let store = Store::from_pool(pool.clone());
    wait_for(WAIT, &format!("job {job} to be known"), || {
        let (store, params) = (&store, params.clone());
        async move {
            store
                .trigger(job, Some(params), "failures test")
                .await
                .expect("trigger")
        }
    })
    .await
}

/// A run as these tests look at it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRow {
    pub state: String,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub reason: Option<String>,
}

/// Reads run `id`.
pub async fn run(pool: &PgPool, id: i64) -> RunRow {
    sqlx::query_as("SELECT state, attempt, worker_id, reason FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("read run")
}

/// Waits until run `id` satisfies `done`.
pub async fn run_until(
    pool: &PgPool,
    id: i64,
    what: &str,
    done: impl Fn(&RunRow) -> bool,
) -> RunRow {
    wait_for(WAIT, &format!("run {id} {what}"), || async {
        done_if(run(pool, id).await, &done)
    })
    .await
}

/// An attempt row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRow {
    pub attempt: i32,
    pub worker_id: String,
    pub state: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

/// The attempts of run `id`, in order.
pub async fn attempts(pool: &PgPool, id: i64) -> Vec<AttemptRow> {
    sqlx::query_as(
        "SELECT attempt, worker_id, state, started_at, finished_at, error
           FROM chime_attempts WHERE run_id = $1 ORDER BY attempt",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .expect("read attempts")
}

/// Lowers the broker's global `consumer_timeout` and puts the previous value back when dropped
/// (also when the test fails). Affects channels opened while it is set.
pub struct ConsumerTimeout {
    previous: String,
}

impl ConsumerTimeout {
    /// Sets `consumer_timeout` to `ms`, remembering the current value.
    pub async fn set(ms: u64) -> ConsumerTimeout {
        let previous =
            rabbitmqctl(&["eval", "application:get_env(rabbit, consumer_timeout)."]).await;
        let set = format!("application:set_env(rabbit, consumer_timeout, {ms}).");
        rabbitmqctl(&["eval", &set]).await;
        ConsumerTimeout { previous }
    }

    fn restore_command(previous: &str) -> String {
        // `{ok,1800000}` or `undefined`.
        match previous
            .strip_prefix("{ok,")
            .and_then(|v| v.strip_suffix('}'))
        {
            Some(value) => format!("application:set_env(rabbit, consumer_timeout, {value})."),
            None => "application:unset_env(rabbit, consumer_timeout).".to_owned(),
        }
    }
}

impl Drop for ConsumerTimeout {
    fn drop(&mut self) {
        let restore = Self::restore_command(&self.previous);
        let restored = std::process::Command::new("rabbitmqctl")
            .args(["eval", &restore])
            .output();
        match restored {
            Ok(out) if out.status.success() => {}
            other => eprintln!(
                "COULD NOT RESTORE RabbitMQ's consumer_timeout ({restore}): {other:?}; run \
                 rabbitmqctl eval '{restore}'"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_previous_consumer_timeout_is_restored_as_it_was() {
        assert_eq!(
            ConsumerTimeout::restore_command("{ok,1800000}"),
            "application:set_env(rabbit, consumer_timeout, 1800000)."
        );
        assert_eq!(
            ConsumerTimeout::restore_command("undefined"),
            "application:unset_env(rabbit, consumer_timeout)."
        );
    }
}
