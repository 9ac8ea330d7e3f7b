//! `chime scheduler` with `watch` on, against the real PostgreSQL and RabbitMQ: editing a job
//! file makes its new job appear in the database without SIGHUP, and an invalid edit keeps the
//! jobs there are (the reload is rejected and logged), until the file is fixed.

use std::path::Path;
use std::time::Duration;

use chime_scheduler::config::Settings;
use chime_scheduler::service;
use chime_test_kit::{Setup, capture_logs, done_if, wait_for};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Generous on a loaded machine: start-up (migrations, connections) and a debounced reload.
const WAIT: Duration = Duration::from_secs(60);

fn jobs_text(group: &str, names: &[&str]) -> String {
    names
        .iter()
        .map(|name| {
            format!("[[jobs]]\nname = \"{name}\"\ngroup = \"{group}\"\nschedule = \"0 3 * * *\"\n")
        })
        .collect()
}

/// Replaces `file` as an editor saves it: a new file renamed over the old one.
fn save(file: &Path, text: &str) {
    let new = file.with_extension("toml.new");
    std::fs::write(&new, text).unwrap();
    std::fs::rename(&new, file).unwrap();
}

async fn job_names(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM chime_jobs ORDER BY name")
        .fetch_all(pool)
        .await
        .expect("list jobs")
}

#[sqlx::test(migrations = "../migrations")]
async fn an_edited_job_file_is_applied_without_sighup_and_a_bad_edit_keeps_the_jobs(pool: PgPool) {
    let t = Setup::new(&pool);
    let (_logs, mut logs) = capture_logs("chime_scheduler::service");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.toml");
    std::fs::write(&file, jobs_text(&t.group, &["first"])).unwrap();
    let settings = Settings {
        database_url: t.database_url.clone(),
        amqp_url: t.amqp_url.clone(),
        queue_prefix: t.prefix.clone(),
        bind: "127.0.0.1:0".parse().unwrap(),
        jobs: vec![dir.path().join("*.toml")],
        watch: true,
        ..Settings::default()
    };
    let shutdown = CancellationToken::new();
    let scheduler = tokio::spawn(service::run(settings, shutdown.clone()));
    wait_for(WAIT, "the first job", async || {
        done_if(job_names(&pool).await, |names| *names == ["first"])
    })
    .await;

    save(&file, &jobs_text(&t.group, &["first", "second"]));
    wait_for(WAIT, "the job added to the file", async || {
        done_if(job_names(&pool).await, |names| {
            *names == ["first", "second"]
        })
    })
    .await;

    // Not TOML: the reload is rejected and logged; the jobs stay.
    save(&file, "[[jobs]\nname = ");
    logs.wait_for_message(WAIT, "reload rejected; previous jobs stay")
        .await;
    assert_eq!(job_names(&pool).await, ["first", "second"]);

    // Fixed: applied, the removed job gone.
    save(&file, &jobs_text(&t.group, &["second", "third"]));
    wait_for(WAIT, "the fixed file's jobs", async || {
        done_if(job_names(&pool).await, |names| {
            *names == ["second", "third"]
        })
    })
    .await;

    shutdown.cancel();
    scheduler
        .await
        .expect("scheduler task")
        .expect("scheduler ran cleanly");
    t.finish().await;
}
