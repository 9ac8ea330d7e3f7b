//! Runtime control without restart: the `chime jobs …` and `chime runs …` commands and config
//! reloads, against a running scheduler.

use std::process::ExitCode;
use std::time::Duration;

use chime_e2e::{AMQP_URL, Scheduler, Setup, service_config, wait_for};
use chime_scheduler::cli::{Command, JobsCommand, Output, RunsCommand, control};
use chime_scheduler::store::Store;
use serde_json::json;
use sqlx::PgPool;

use crate::common::{RecordingWorker, job, runs};

async fn run_cli(store: &Store, output: Output, command: Command) -> (ExitCode, String) {
    let mut out = Vec::new();
    let code = control(store, output, command, &mut out)
        .await
        .expect("command runs");
    (code, String::from_utf8(out).expect("utf-8 output"))
}

#[sqlx::test(migrations = "../migrations")]
async fn trigger_pause_resume_and_inspect_runs_through_the_cli(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["ops"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let store = Store::from_pool(pool.clone());
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, "ops", &["report", "beat"]);
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![
            job(json!({"name": "report", "group": "ops", "params": {"format": "csv"}})),
            job(json!({"name": "beat", "group": "ops", "every": "1s"})),
        ],
    );
    wait_for(Duration::from_secs(10), "beat to fire", || async {
        (!runs(&pool, "beat").await.is_empty()).then_some(())
    })
    .await;

    // jobs list: both jobs, as a table and as JSON.
    let (code, table) = run_cli(&store, Output::Table, Command::Jobs(JobsCommand::List)).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(
        table.contains("report") && table.contains("manual"),
        "{table}"
    );
    assert!(table.contains("every 1s"), "{table}");
    let (_, listed) = run_cli(&store, Output::Json, Command::Jobs(JobsCommand::List)).await;
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("JSON output");
    let names: Vec<&str> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|j| j["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["beat", "report"]);

    // trigger a manual-only job with params: it runs once, with those params.
    let (code, out) = run_cli(
        &store,
        Output::Json,
        Command::Jobs(JobsCommand::Trigger {
            name: "report".into(),
            params: Some(r#"{"format": "pdf"}"#.into()),
            at: None,
            idempotency_key: None,
        }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    let run_id = serde_json::from_str::<serde_json::Value>(&out).expect("JSON")["run_id"]
        .as_i64()
        .expect("run id");
    wait_for(
        Duration::from_secs(10),
        "the manual run to succeed",
        || async {
            runs(&pool, "report")
                .await
                .into_iter()
                .find(|r| r.id == run_id && r.state == "succeeded")
        },
    )
    .await;
    let (_, shown) = run_cli(
        &store,
        Output::Json,
        Command::Runs(RunsCommand::Show {
            id: run_id,
            tasks_after: None,
            task_state: None,
            task_limit: 100,
        }),
    )
    .await;
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
    assert_eq!(shown["trigger"], "manual");
    assert_eq!(shown["params"], json!({"format": "pdf"}));
    assert_eq!(shown["attempts"].as_array().expect("attempts").len(), 1);
    assert_eq!(shown["attempts"][0]["state"], "succeeded");
    assert_eq!(shown["logs"][0]["message"], "recorded");
    let (_, table) = run_cli(
        &store,
        Output::Table,
        Command::Runs(RunsCommand::Show {
            id: run_id,
            tasks_after: None,
            task_state: None,
            task_limit: 100,
        }),
    )
    .await;
    assert!(
        table.contains("succeeded") && table.contains("recorded"),
        "{table}"
    );

    // pause: no new scheduled runs while paused; resume: they come back.
    let (code, _) = run_cli(
        &store,
        Output::Table,
        Command::Jobs(JobsCommand::Pause {
            name: "beat".into(),
        }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    let paused_at = chrono::Utc::now();
    let (_, listed) = run_cli(&store, Output::Json, Command::Jobs(JobsCommand::List)).await;
    assert!(listed.contains(r#""paused": true"#), "{listed}");
    wait_for(Duration::from_secs(5), "3 s of pause", || async {
        (chrono::Utc::now() > paused_at + chrono::Duration::seconds(3)).then_some(())
    })
    .await;
    let during = runs(&pool, "beat").await;
    // A fire already written ahead of the pause may still land in its first second.
    assert!(
        during
            .iter()
            .all(|r| r.scheduled_at <= paused_at + chrono::Duration::seconds(1)),
        "fired while paused: {during:?}"
    );
    run_cli(
        &store,
        Output::Table,
        Command::Jobs(JobsCommand::Resume {
            name: "beat".into(),
        }),
    )
    .await;
    let resumed = during.len();
    wait_for(
        Duration::from_secs(5),
        "beat to fire again after resume",
        || async { (runs(&pool, "beat").await.len() > resumed).then_some(()) },
    )
    .await;

    // runs list filters by job and limits.
    let (_, listed) = run_cli(
        &store,
        Output::Json,
        Command::Runs(RunsCommand::List {
            job: Some("report".into()),
            state: None,
            limit: 5,
            tasks: false,
            backfill: None,
        }),
    )
    .await;
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    assert_eq!(listed.as_array().expect("array").len(), 1);
    assert_eq!(listed[0]["id"], run_id);

    // Unknown names fail with exit 1.
    let (code, _) = run_cli(
        &store,
        Output::Table,
        Command::Jobs(JobsCommand::Pause {
            name: "nope".into(),
        }),
    )
    .await;
    assert_eq!(code, ExitCode::FAILURE);
    let (code, _) = run_cli(
        &store,
        Output::Table,
        Command::Jobs(JobsCommand::Trigger {
            name: "nope".into(),
            params: None,
            at: None,
            idempotency_key: None,
        }),
    )
    .await;
    assert_eq!(code, ExitCode::FAILURE);

    scheduler.stop().await.expect("graceful stop");
    worker.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn reload_applies_added_changed_and_removed_jobs(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["reload"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![
            job(json!({"name": "keep", "group": "reload", "every": "1s"})),
            job(json!({"name": "drop", "group": "reload", "every": "1s"})),
        ],
    );
    wait_for(Duration::from_secs(10), "both jobs to fire", || async {
        (!runs(&pool, "keep").await.is_empty() && !runs(&pool, "drop").await.is_empty())
            .then_some(())
    })
    .await;

    scheduler
        .reload(vec![
            job(json!({"name": "keep", "group": "reload", "every": "2s"})),
            job(json!({"name": "new", "group": "reload", "every": "1s"})),
        ])
        .await;
    wait_for(Duration::from_secs(10), "the added job to fire", || async {
        (!runs(&pool, "new").await.is_empty()).then_some(())
    })
    .await;
    let reloaded = chrono::Utc::now() + chrono::Duration::seconds(1);
    wait_for(Duration::from_secs(10), "three more seconds", || async {
        (chrono::Utc::now() > reloaded + chrono::Duration::seconds(4)).then_some(())
    })
    .await;
    scheduler.stop().await.expect("graceful stop");

    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM chime_jobs ORDER BY name")
        .fetch_all(&pool)
        .await
        .expect("jobs");
    assert_eq!(names, ["keep", "new"]);
    assert!(
        runs(&pool, "drop")
            .await
            .iter()
            .all(|r| r.scheduled_at < reloaded),
        "a removed job kept firing"
    );
    let keep_after: Vec<_> = runs(&pool, "keep")
        .await
        .into_iter()
        .filter(|r| r.scheduled_at > reloaded)
        .collect();
    assert!(!keep_after.is_empty(), "the changed job still fires");
    for pair in keep_after.windows(2) {
        assert_eq!(
            pair[1].scheduled_at - pair[0].scheduled_at,
            chrono::Duration::seconds(2)
        );
    }
    t.finish().await;
}
