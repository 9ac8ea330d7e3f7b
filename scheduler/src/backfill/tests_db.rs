//! Backfills against a real database (`#[sqlx::test]`): requested through the operations
//! (as the API and the CLI do), advanced by the leader's duty one pass at a time.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use sqlx::PgPool;

use super::{Bucket, pass};
use crate::auth::Caller;
use crate::config::{SourceFormat, parse_job_file};
use crate::job::ConcurrencyPolicy;
use crate::ops::{BackfillRequest, Operations, OpsError};
use crate::store::{Fence, NewFire, Store, TriggerKind};

/// The start of the hour `hours` before the one the tests began in (one instant for all, so a
/// test running across the hour sees the same ranges).
fn hours_ago(hours: i64) -> DateTime<Utc> {
    static HOUR: std::sync::OnceLock<DateTime<Utc>> = std::sync::OnceLock::new();
    *HOUR.get_or_init(|| {
        Utc::now()
            .duration_trunc(TimeDelta::hours(1))
            .expect("truncated")
    }) - TimeDelta::hours(hours)
}

/// Loads the job files' jobs `text` declares, as a reload does.
async fn load(store: &Store, text: &str) {
    let specs = parse_job_file("jobs.toml", text, SourceFormat::Toml).expect("valid job file");
    store.sync_config_jobs(&specs).await.expect("synced");
}

const HOURLY: &str = "[[jobs]]\nname = \"hourly\"\ngroup = \"g\"\nschedule = \"0 0 * * * *\"\n";

struct Setup {
    store: Store,
    ops: Operations,
    fence: Fence,
    buckets: HashMap<i64, Bucket>,
}

impl Setup {
    async fn new(pool: PgPool, jobs: &str) -> Setup {
        let store = Store::from_pool(pool);
        load(&store, jobs).await;
        let term = store
            .acquire_lease("leader", Duration::from_secs(60))
            .await
            .expect("lease")
            .expect("leading");
        Setup {
            ops: Operations::new(store.clone(), None),
            fence: Fence {
                holder: "leader".into(),
                term,
            },
            store,
            buckets: HashMap::new(),
        }
    }

    /// One pass of the duty, which must keep the lease.
    async fn pass(&mut self) {
        assert!(
            pass(&self.store, &self.fence, &mut self.buckets)
                .await
                .expect("pass"),
            "the lease holds"
        );
    }

    async fn start(&self, from: DateTime<Utc>, to: DateTime<Utc>, parallel: u32) -> i64 {
        self.ops
            .start_backfill(&Caller::cli(), "hourly", &request(from, to, parallel))
            .await
            .expect("started")
            .backfill
            .id
    }

    /// `(scheduled_at, trigger, backfill)` of the job's runs, by instant.
    async fn runs(&self) -> Vec<(DateTime<Utc>, String, Option<i64>)> {
        sqlx::query_as(
            "SELECT scheduled_at, trigger, backfill_id FROM chime_runs
             WHERE job_name = 'hourly' ORDER BY scheduled_at",
        )
        .fetch_all(self.store.pool())
        .await
        .expect("runs")
    }

    async fn finish_all(&self) {
        sqlx::query(
            "UPDATE chime_runs SET state = 'succeeded', finished_at = now()
             WHERE state IN ('pending', 'queued', 'running', 'retrying')",
        )
        .execute(self.store.pool())
        .await
        .expect("finished");
    }

    async fn state(&self, id: i64) -> (String, i32, i32, i32) {
        let b = self
            .store
            .backfill(id)
            .await
            .expect("read")
            .expect("exists");
        (b.state, b.fires_total, b.fires_made, b.fires_existing)
    }
}

fn request(from: DateTime<Utc>, to: DateTime<Utc>, parallel: u32) -> BackfillRequest {
    BackfillRequest {
        from: from.to_rfc3339(),
        to: to.to_rfc3339(),
        parallel: Some(parallel),
        rate: Some(1000),
        dry_run: false,
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn each_fire_of_a_range_becomes_one_run_and_an_overlapping_backfill_makes_none_again(
    pool: PgPool,
) {
    let mut s = Setup::new(pool, HOURLY).await;
    // The schedule ran one fire of the range already, and skipped another (an outage).
    let scheduled = NewFire {
        job: "hourly".into(),
        group: "g".into(),
        scheduled_at: hours_ago(8),
        kind: TriggerKind::Schedule,
        params: serde_json::json!({}),
        skip: None,
        concurrency: ConcurrencyPolicy::Allow,
    };
    let skipped = NewFire {
        scheduled_at: hours_ago(9),
        skip: Some("missed by 2h; misfire policy skip".into()),
        ..scheduled.clone()
    };
    s.store
        .insert_fires(&s.fence, None, &[skipped, scheduled])
        .await
        .expect("inserted")
        .expect("fenced");

    let first = s.start(hours_ago(10), hours_ago(4), 100).await;
    s.pass().await;
    let runs = s.runs().await;
    let instants: Vec<_> = runs.iter().map(|r| r.0).collect();
    assert_eq!(instants, (5..=10).rev().map(hours_ago).collect::<Vec<_>>());
    let made: Vec<_> = runs.iter().filter(|r| r.2 == Some(first)).collect();
    assert_eq!(made.len(), 5, "four new, and the skipped one: {runs:?}");
    assert!(made.iter().all(|r| r.1 == "backfill"), "{runs:?}");
    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, reason FROM chime_runs WHERE scheduled_at = $1")
            .bind(hours_ago(9))
            .fetch_one(s.store.pool())
            .await
            .unwrap();
    assert_eq!(state, "pending", "the skipped fire runs now");
    assert_eq!(
        reason.as_deref(),
        Some(&*format!(
            "skipped before (missed by 2h; misfire policy skip); run by backfill {first}"
        ))
    );
    assert_eq!(
        s.state(first).await,
        ("running".into(), 6, 5, 1),
        "every run unfinished"
    );

    // Overlapping, wider: only the fires without a run become runs.
    let second = s.start(hours_ago(12), hours_ago(6), 100).await;
    s.pass().await;
    assert_eq!(s.state(second).await, ("running".into(), 6, 2, 4));
    let runs = s.runs().await;
    assert_eq!(runs.len(), 8, "hours 12 to 5 ago, one run each: {runs:?}");

    // Done once every run has ended.
    s.finish_all().await;
    s.pass().await;
    assert_eq!(s.state(first).await.0, "done");
    assert_eq!(s.state(second).await.0, "done");
    let record = s.store.backfill(first).await.unwrap().unwrap();
    assert_eq!(record.runs.get("succeeded"), Some(&5), "{record:?}");
    assert_eq!(
        record.progress,
        "6/6 fires handled (5 made, 1 existing); 5 succeeded"
    );

    // The same again: every fire has a run, none is made.
    let again = s.start(hours_ago(12), hours_ago(4), 100).await;
    s.pass().await;
    s.pass().await;
    assert_eq!(s.state(again).await, ("done".into(), 8, 0, 8));
    assert_eq!(s.runs().await.len(), 8);
}

#[sqlx::test(migrations = "../migrations")]
async fn parallel_bounds_the_runs_unfinished_at_once(pool: PgPool) {
    let mut s = Setup::new(pool, HOURLY).await;
    let id = s.start(hours_ago(10), hours_ago(4), 2).await;
    s.pass().await;
    assert_eq!(s.state(id).await.2, 2, "two at once");
    s.pass().await;
    assert_eq!(
        s.state(id).await.2,
        2,
        "none more while both are unfinished"
    );
    sqlx::query(
        "UPDATE chime_runs SET state = 'failed', finished_at = now()
         WHERE id = (SELECT min(id) FROM chime_runs WHERE backfill_id = $1)",
    )
    .bind(id)
    .execute(s.store.pool())
    .await
    .unwrap();
    s.pass().await;
    assert_eq!(s.state(id).await.2, 3, "one ended: one more");
    let runs = s.runs().await;
    let instants: Vec<_> = runs.iter().map(|r| r.0).collect();
    assert_eq!(
        instants,
        [hours_ago(10), hours_ago(9), hours_ago(8)],
        "in order of their instants"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn the_rate_bounds_the_runs_made_per_second(pool: PgPool) {
    let mut s = Setup::new(pool, HOURLY).await;
    let mut req = request(hours_ago(20), hours_ago(0), 100);
    req.rate = Some(3);
    let id = s
        .ops
        .start_backfill(&Caller::cli(), "hourly", &req)
        .await
        .unwrap()
        .backfill
        .id;
    let began = std::time::Instant::now();
    s.pass().await;
    assert_eq!(s.state(id).await.2, 3, "one second's worth at first");
    // Then as many as the time passed refilled: 3 per second.
    s.pass().await;
    let refilled = (began.elapsed().as_secs_f64() * 3.0).floor() as i32;
    let made = s.state(id).await.2;
    assert!(made <= 3 + refilled, "{made} made, {refilled} refilled");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_cancelled_backfill_cancels_its_waiting_runs_and_makes_no_more(pool: PgPool) {
    let mut s = Setup::new(pool, HOURLY).await;
    let id = s.start(hours_ago(10), hours_ago(4), 3).await;
    s.pass().await;
    assert_eq!(s.state(id).await.2, 3);
    let done = s
        .ops
        .cancel_backfill(&Caller::cli(), id)
        .await
        .expect("cancelled");
    assert_eq!((done.runs_cancelled, done.cancel_requested.len()), (3, 0));
    let states: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT state, reason FROM chime_runs WHERE backfill_id = $1")
            .bind(id)
            .fetch_all(s.store.pool())
            .await
            .unwrap();
    let with = format!("cancelled by {} with backfill {id}", Caller::cli().actor);
    assert!(
        states
            .iter()
            .all(|(state, reason)| state == "cancelled" && reason.as_deref() == Some(&*with)),
        "{states:?}"
    );
    s.pass().await;
    let b = s.store.backfill(id).await.unwrap().unwrap();
    assert_eq!((b.state.as_str(), b.fires_made), ("cancelled", 3));
    assert!(
        b.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("cancelled by ")),
        "{b:?}"
    );
    let again = s.ops.cancel_backfill(&Caller::cli(), id).await;
    assert!(matches!(again, Err(OpsError::Conflict(_))), "{again:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_pass_under_a_lost_fence_writes_nothing(pool: PgPool) {
    let mut s = Setup::new(pool, HOURLY).await;
    let id = s.start(hours_ago(10), hours_ago(4), 100).await;
    let stale = Fence {
        holder: "leader".into(),
        term: s.fence.term - 1,
    };
    let kept = pass(&s.store, &stale, &mut s.buckets).await.expect("pass");
    assert!(!kept, "the fence is lost");
    assert_eq!(s.state(id).await, ("running".into(), 6, 0, 0));
    assert!(s.runs().await.is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn a_backfill_of_a_deleted_job_is_cancelled_with_the_reason(pool: PgPool) {
    let mut s = Setup::new(pool, HOURLY).await;
    let id = s.start(hours_ago(10), hours_ago(4), 100).await;
    s.store.sync_config_jobs(&[]).await.expect("removed");
    s.pass().await;
    let b = s.store.backfill(id).await.unwrap().unwrap();
    assert_eq!(b.state, "cancelled");
    assert_eq!(b.reason.as_deref(), Some("its job \"hourly\" was deleted"));
    assert_eq!(b.cancelled_by.as_deref(), Some("scheduler"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_preview_lists_the_fires_and_their_runs_and_changes_nothing(pool: PgPool) {
    let mut s = Setup::new(pool, HOURLY).await;
    let id = s.start(hours_ago(10), hours_ago(8), 100).await;
    s.pass().await;
    let mut req = request(hours_ago(11), hours_ago(7), 100);
    req.dry_run = true;
    let preview = s
        .ops
        .preview_backfill(
            &Caller::token("eyes", crate::auth::Role::Viewer),
            "hourly",
            &req,
        )
        .await
        .expect("a viewer may preview");
    assert_eq!(
        (
            preview.fires_total,
            preview.fires_existing,
            preview.fires_to_make
        ),
        (4, 2, 2)
    );
    let runs: Vec<_> = preview.fires.iter().map(|f| f.run.is_some()).collect();
    assert_eq!(runs, [false, true, true, false]);
    assert_eq!(preview.fires[1].run.as_ref().unwrap().trigger, "backfill");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_backfills")
        .fetch_one(s.store.pool())
        .await
        .unwrap();
    assert_eq!(count, 1, "only the first backfill");
    assert_eq!(s.state(id).await.2, 2);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_request_out_of_bounds_is_refused_naming_the_field(pool: PgPool) {
    let others = "[[jobs]]\nname = \"by-hand\"\ngroup = \"g\"\n\n[[jobs]]\nname = \"minutely\"\n\
                  group = \"g\"\nschedule = \"0 * * * * *\"\n";
    let s = Setup::new(pool, &format!("{HOURLY}{others}")).await;
    let admin = Caller::cli();
    let refused = |result: Result<_, OpsError>| match result {
        Err(OpsError::Invalid(problems)) => problems
            .into_iter()
            .map(|p| (p.field.unwrap_or_default(), p.message))
            .collect::<Vec<_>>(),
        other => panic!("not refused as invalid: {other:?}"),
    };
    let now = Utc::now();
    let cases: Vec<(BackfillRequest, &str, &str)> = vec![
        (
            request(now, now + TimeDelta::hours(2), 1),
            "to",
            "is in the future",
        ),
        (
            request(hours_ago(2), hours_ago(3), 1),
            "to",
            "must be after `from`",
        ),
        (request(hours_ago(9), hours_ago(3), 0), "parallel", "use 1"),
        (
            request(hours_ago(9), hours_ago(3), 101),
            "parallel",
            "MAX_BACKFILL_PARALLEL",
        ),
        (
            BackfillRequest {
                rate: Some(1001),
                ..request(hours_ago(9), hours_ago(3), 1)
            },
            "rate",
            "MAX_BACKFILL_RATE",
        ),
        (
            BackfillRequest {
                from: "last tuesday".into(),
                ..request(hours_ago(9), hours_ago(3), 1)
            },
            "from",
            "not an instant",
        ),
        (
            request(hours_ago(24 * 3700), hours_ago(3), 1),
            "to",
            "MAX_BACKFILL_RANGE",
        ),
        (
            request(hours_ago(24 * 365 * 12), hours_ago(3), 1),
            "to",
            "MAX_BACKFILL_RANGE",
        ),
        (
            request(
                hours_ago(3) + TimeDelta::minutes(1),
                hours_ago(3) + TimeDelta::minutes(2),
                1,
            ),
            "from",
            "has no fire",
        ),
    ];
    for (req, field, message) in cases {
        let problems = refused(s.ops.start_backfill(&admin, "hourly", &req).await);
        assert!(
            problems
                .iter()
                .any(|(f, m)| f == field && m.contains(message)),
            "{req:?}: want {field} {message:?}, got {problems:?}"
        );
    }
    // A minutely job has more than 100000 fires in 80 days.
    let too_many = request(hours_ago(24 * 80), hours_ago(3), 1);
    let problems = refused(s.ops.start_backfill(&admin, "minutely", &too_many).await);
    assert!(
        problems
            .iter()
            .any(|(f, m)| f == "to" && m.contains("more than 100000 fires")),
        "{problems:?}"
    );
    let req = request(hours_ago(9), hours_ago(3), 1);
    let manual = s.ops.start_backfill(&admin, "by-hand", &req).await;
    assert!(
        matches!(&manual, Err(OpsError::Conflict(m)) if m.contains("manual only")),
        "{manual:?}"
    );
    let unknown = s.ops.start_backfill(&admin, "nope", &req).await;
    assert!(matches!(unknown, Err(OpsError::NotFound(_))), "{unknown:?}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_backfills")
        .fetch_one(s.store.pool())
        .await
        .unwrap();
    assert_eq!(count, 0, "nothing recorded");
}

/// A backfill's runs are outside the job's concurrency policy: a `forbid` job's scheduled fire
/// is not skipped for them, and a `queue` job's backfill runs are all published at once.
#[sqlx::test(migrations = "../migrations")]
async fn a_backfills_runs_neither_hold_nor_are_held_by_the_jobs_policy(pool: PgPool) {
    let forbid = "[[jobs]]\nname = \"hourly\"\ngroup = \"g\"\nschedule = \"0 0 * * * *\"\n\
                  concurrency = \"queue\"\n";
    let mut s = Setup::new(pool, forbid).await;
    let id = s.start(hours_ago(10), hours_ago(4), 100).await;
    s.pass().await;
    let outbox = s.store.outbox(Utc::now(), 100).await.expect("outbox");
    assert_eq!(outbox.len(), 6, "all six published at once: {outbox:?}");
    assert!(
        outbox
            .iter()
            .all(|r| r.concurrency == ConcurrencyPolicy::Allow),
        "{outbox:?}"
    );
    // A scheduled fire of the job is not held behind them either.
    let fire = NewFire {
        job: "hourly".into(),
        group: "g".into(),
        scheduled_at: hours_ago(0),
        kind: TriggerKind::Schedule,
        params: serde_json::json!({}),
        skip: None,
        concurrency: ConcurrencyPolicy::Forbid,
    };
    let created = s
        .store
        .insert_fires(&s.fence, None, &[fire])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(created.len(), 1, "not skipped for the backfill's runs");
    assert!(!created[0].blocked);
    let outbox = s.store.outbox(Utc::now(), 100).await.unwrap();
    assert_eq!(
        outbox.len(),
        7,
        "the queue job's own run is not held back by them"
    );
    assert_eq!(s.state(id).await.2, 6);
}

/// Fires with runs cost a serial backfill nothing: one pass goes through all 48 of them.
#[sqlx::test(migrations = "../migrations")]
async fn a_serial_backfill_goes_past_fires_with_runs_in_one_pass(pool: PgPool) {
    let mut s = Setup::new(pool, HOURLY).await;
    let filled = s.start(hours_ago(50), hours_ago(2), 100).await;
    s.pass().await;
    assert_eq!(s.state(filled).await.2, 48);
    s.finish_all().await;
    // One free fire among them: the serial backfill makes it, and then none more at once.
    sqlx::query("DELETE FROM chime_runs WHERE scheduled_at = $1")
        .bind(hours_ago(20))
        .execute(s.store.pool())
        .await
        .unwrap();
    let again = s.start(hours_ago(50), hours_ago(2), 1).await;
    s.pass().await;
    let b = s.store.backfill(again).await.unwrap().unwrap();
    assert_eq!((b.fires_made, b.fires_existing), (1, 30), "{b:?}");
    assert_eq!(b.cursor_at, Some(hours_ago(20)), "stopped at its one run");
    s.finish_all().await;
    s.pass().await;
    let b = s.store.backfill(again).await.unwrap().unwrap();
    assert_eq!((b.fires_made, b.fires_existing), (1, 47), "{b:?}");
    assert!(b.cursor_at.is_some_and(|at| at >= hours_ago(2)), "{b:?}");
    s.pass().await;
    assert_eq!(s.state(again).await.0, "done");
}
