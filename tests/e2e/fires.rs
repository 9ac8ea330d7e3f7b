//! A job every second fires on the instant, exactly once per instant, and every run is executed
//! once and recorded with its timestamps.

use std::time::Duration;

use chime_e2e::{
    AMQP_URL, Scheduler, database_url, init_tracing, percentile, service_config, unique, wait_for,
};
use serde_json::json;
use sqlx::PgPool;

use crate::common::{RecordingWorker, assert_consecutive, attempts, delete_topology, job, runs};

#[sqlx::test(migrations = "../migrations")]
async fn every_second_job_fires_ten_times_in_ten_seconds_each_once(pool: PgPool) {
    init_tracing();
    let db = database_url(&pool);
    let prefix = unique("t");
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, "ticks", &["tick"]);
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![job(
            json!({"name": "tick", "group": "ticks", "every": "1s"}),
        )],
    );

    // Measure a 10 s window starting at the first whole second after the scheduler leads.
    wait_for("the first run", Duration::from_secs(15), || async {
        (!runs(&pool, "tick").await.is_empty()).then_some(())
    })
    .await;
    let window_start = runs(&pool, "tick").await[0].scheduled_at + chrono::Duration::seconds(1);
    let window_end = window_start + chrono::Duration::seconds(10);
    wait_for(
        "the 10 s window to pass",
        Duration::from_secs(20),
        || async {
            (chrono::Utc::now() > window_end + chrono::Duration::milliseconds(200)).then_some(())
        },
    )
    .await;
    scheduler.stop().await.expect("graceful stop");

    let in_window =
        |r: &crate::common::Run| r.scheduled_at >= window_start && r.scheduled_at < window_end;
    let finished = wait_for(
        "every run in the window to finish",
        Duration::from_secs(15),
        || async {
            let all = runs(&pool, "tick").await;
            let window: Vec<_> = all.into_iter().filter(in_window).collect();
            window
                .iter()
                .all(|r| r.state == "succeeded")
                .then_some(window)
        },
    )
    .await;
    let executions = worker.counts();
    let handler_lateness = worker.lateness_ms();
    worker.stop().await;

    assert!(
        (9..=11).contains(&finished.len()),
        "expected 10 runs (±1) in 10 s, got {}",
        finished.len()
    );
    assert_consecutive(&finished, Duration::from_secs(1));
    for run in &finished {
        assert_eq!(run.trigger, "schedule");
        assert!(
            run.published_at.is_some(),
            "run {} has no published_at",
            run.id
        );
        assert!(
            run.started_at.is_some() && run.finished_at.is_some(),
            "run {} timestamps",
            run.id
        );
        assert_eq!(
            executions.get(&run.id),
            Some(&1),
            "run {} executed once",
            run.id
        );
        assert_eq!(
            attempts(&pool, run.id).await,
            1,
            "run {} has one attempt row",
            run.id
        );
    }

    let mut lateness: Vec<f64> = finished
        .iter()
        .map(|r| {
            (r.started_at.expect("started") - r.scheduled_at)
                .num_microseconds()
                .expect("small") as f64
                / 1000.0
        })
        .collect();
    lateness.sort_by(f64::total_cmp);
    let mut publish: Vec<f64> = finished
        .iter()
        .map(|r| {
            (r.published_at.expect("published") - r.scheduled_at)
                .num_microseconds()
                .expect("small") as f64
                / 1000.0
        })
        .collect();
    publish.sort_by(f64::total_cmp);
    println!(
        "every-second job, handler clock: lateness scheduled->handler start p50 {:.1} ms, p99 {:.1} ms over {} executions",
        percentile(&handler_lateness, 50.0),
        percentile(&handler_lateness, 99.0),
        handler_lateness.len()
    );
    println!(
        "every-second job, {} runs: lateness scheduled->started p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; scheduled->published p50 {:.1} ms, p99 {:.1} ms",
        lateness.len(),
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness.last().copied().unwrap_or(f64::NAN),
        percentile(&publish, 50.0),
        percentile(&publish, 99.0),
    );
    assert!(
        percentile(&lateness, 50.0) < 1000.0,
        "a second late is XXL-Job's resolution, not ours: {lateness:?}"
    );
    delete_topology(&prefix, "ticks").await;
}
