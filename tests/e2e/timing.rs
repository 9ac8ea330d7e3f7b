//! A job's calendar kept by a running leader: excluded fires recorded skipped with the
//! calendar's reason, or moved to the next allowed instant as one fire.
//!
//! A job's timing fields under a leader failover: jittered fires land on the same instants
//! whichever leader writes them, `max_runs` counts across leaders, and a `start_at`–`end_at`
//! window fires exactly its instants.

use std::time::{Duration, Instant};

use chime_e2e::{AMQP_URL, Scheduler, Setup, service_config, wait_for};
use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use serde_json::json;
use sqlx::{PgPool, Row as _};

use crate::common::{assert_consecutive, job, leader, runs};

#[sqlx::test(migrations = "../migrations")]
async fn jittered_fires_limits_and_windows_hold_across_a_killed_leader(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["timing"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let start = Utc::now().duration_trunc(TimeDelta::seconds(1)).unwrap() + TimeDelta::seconds(5);
    let end = start + TimeDelta::seconds(5);
    let missed = json!({"misfire": "fire_all", "misfire_grace": "500ms"});
    let define = |fields: serde_json::Value| {
        let mut definition = json!({"group": "timing"});
        definition
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        definition
            .as_object_mut()
            .unwrap()
            .extend(missed.as_object().unwrap().clone());
        job(definition)
    };
    let jobs = vec![
        define(json!({"name": "spread-a", "every": "2s", "jitter": "1500ms"})),
        define(json!({"name": "spread-b", "every": "2s", "jitter": "1500ms"})),
        define(json!({"name": "limited", "every": "1s", "max_runs": 8})),
        define(json!({"name": "window", "every": "1s",
                      "start_at": start.to_rfc3339(), "end_at": end.to_rfc3339()})),
    ];
    let a = Scheduler::start(service_config(&db, AMQP_URL, "a", &prefix), jobs.clone());
    // Before the kill, a has written fires of every job but not all of `limited`'s.
    wait_for(Duration::from_secs(10), "a to lead and fire", || async {
        let mut fired = true;
        for name in ["spread-a", "spread-b", "limited"] {
            fired &= !runs(&pool, name).await.is_empty();
        }
        fired.then_some(())
    })
    .await;
    let b = Scheduler::start(service_config(&db, AMQP_URL, "b", &prefix), jobs.clone());
    let (_, a_term) = leader(&pool).await.expect("a leads");
    a.kill().await;
    let killed = Instant::now();
    let (_, b_term) = wait_for(Duration::from_secs(10), "b to take over", || async {
        leader(&pool).await.filter(|(holder, _)| holder == "b")
    })
    .await;
    assert!(b_term > a_term);
    println!(
        "killed leader: b leads {:?} after the kill",
        killed.elapsed()
    );
    // Past the window's end and 8 s of jittered fires after the kill, all written by b.
    let settled: DateTime<Utc> = Utc::now().max(end) + TimeDelta::seconds(8);
    wait_for(
        Duration::from_secs(30),
        "fires after the window",
        || async {
            let spread = runs(&pool, "spread-a").await;
            (spread.last().is_some_and(|r| r.scheduled_at > settled)).then_some(())
        },
    )
    .await;
    b.stop().await.expect("graceful stop");
    println!(
        "killed leader: b leads {:?} after the kill",
        killed.elapsed()
    );

    // Jitter: every run sits at the instant the job's timing gives, before and after the
    // failover, each instant once, and the instants really are spread off the 2 s grid.
    for (name, spec) in [("spread-a", &jobs[0]), ("spread-b", &jobs[1])] {
        let all = runs(&pool, name).await;
        let timing = spec.timing().expect("a valid schedule");
        let first = all.first().expect("runs").scheduled_at;
        let expected = timing.upcoming(first - TimeDelta::milliseconds(1), all.len());
        let got: Vec<DateTime<Utc>> = all.iter().map(|r| r.scheduled_at).collect();
        assert_eq!(got, expected, "job {name}: runs at the jittered instants");
        assert!(
            got.iter()
                .any(|at| at.timestamp_subsec_millis() != 0 || at.timestamp() % 2 != 0),
            "job {name}: no fire moved: {got:?}"
        );
        for term in [a_term, b_term] {
            assert!(
                all.iter().any(|r| r.term == Some(term)),
                "job {name}: runs under term {term}: {all:?}"
            );
        }
    }
    // max_runs: eight fires in all, counted across both leaders, then nothing.
    let limited = runs(&pool, "limited").await;
    assert_eq!(limited.len(), 8, "{limited:?}");
    assert_consecutive(&limited, Duration::from_secs(1));
    let made: i64 = sqlx::query("SELECT scheduled_runs FROM chime_jobs WHERE name = 'limited'")
        .fetch_one(&pool)
        .await
        .expect("read the count")
        .get(0);
    assert_eq!(made, 8);
    // The window: each second from start_at to end_at, both included, once.
    let window = runs(&pool, "window").await;
    let instants: Vec<DateTime<Utc>> = window.iter().map(|r| r.scheduled_at).collect();
    let want: Vec<DateTime<Utc>> = (0..=5).map(|s| start + TimeDelta::seconds(s)).collect();
    assert_eq!(instants, want);
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_calendar_skips_or_moves_the_fires_it_excludes(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["calendar"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    // Three seconds of every-second fires excluded, a few seconds after the leader starts.
    let quiet = Utc::now().duration_trunc(TimeDelta::seconds(1)).unwrap() + TimeDelta::seconds(10);
    let quiet_end = quiet + TimeDelta::seconds(3);
    let window = format!(
        "{}-{}",
        quiet.format("%H:%M:%S"),
        quiet_end.format("%H:%M:%S")
    );
    let define = |name: &str, on_excluded: &str| {
        job(json!({
            "name": name, "group": "calendar", "every": "1s",
            "calendar": {"name": "quiet", "times": [window]},
            "calendar_mode": "except", "on_excluded": on_excluded,
        }))
    };
    let jobs = vec![
        define("cal-skip", "skip"),
        define("cal-move", "next_allowed"),
    ];
    let scheduler = Scheduler::start(service_config(&db, AMQP_URL, "a", &prefix), jobs);
    let settled = quiet_end + TimeDelta::seconds(2);
    wait_for(
        Duration::from_secs(30),
        "fires after the quiet window",
        || async {
            let mut done = true;
            for name in ["cal-skip", "cal-move"] {
                done &= runs(&pool, name)
                    .await
                    .last()
                    .is_some_and(|r| r.scheduled_at >= settled);
            }
            done.then_some(())
        },
    )
    .await;
    scheduler.stop().await.expect("graceful stop");

    let in_quiet = |at: DateTime<Utc>| at >= quiet && at < quiet_end;
    // skip: each excluded second is a skipped run naming the calendar; the others run.
    let skip = runs(&pool, "cal-skip").await;
    assert_consecutive(&skip, Duration::from_secs(1));
    let excluded: Vec<&crate::common::Run> =
        skip.iter().filter(|r| in_quiet(r.scheduled_at)).collect();
    assert_eq!(excluded.len(), 3, "{skip:?}");
    for run in &excluded {
        assert_eq!(run.state, "skipped", "{run:?}");
        let reason = run.reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains(
                "excluded by calendar quiet (calendar_mode = \"except\", on_excluded = \"skip\")"
            ),
            "{run:?}"
        );
    }
    assert!(
        skip.iter()
            .filter(|r| !in_quiet(r.scheduled_at))
            .all(|r| r.state != "skipped"),
        "{skip:?}"
    );
    // next_allowed: nothing inside the window, and the window's end fires once for all of it.
    let moved = runs(&pool, "cal-move").await;
    assert!(moved.iter().all(|r| !in_quiet(r.scheduled_at)), "{moved:?}");
    assert!(moved.iter().all(|r| r.state != "skipped"), "{moved:?}");
    assert_eq!(
        moved.iter().filter(|r| r.scheduled_at == quiet_end).count(),
        1,
        "{moved:?}"
    );
    let instants: Vec<DateTime<Utc>> = moved.iter().map(|r| r.scheduled_at).collect();
    assert!(instants.windows(2).all(|w| w[0] < w[1]), "{instants:?}");
    let first = instants.first().copied().expect("runs");
    let want: Vec<DateTime<Utc>> = (0..)
        .map(|s| first + TimeDelta::seconds(s))
        .take_while(|at| *at <= *instants.last().unwrap())
        .filter(|at| !in_quiet(*at))
        .collect();
    assert_eq!(instants, want, "every second but the quiet ones");
    t.finish().await;
}
