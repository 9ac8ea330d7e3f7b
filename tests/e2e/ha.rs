//! Several scheduler instances on one database: one leader at a time, no duplicate run, fast
//! hand-over on a graceful stop, misfire policy after a killed leader's lease runs out.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chime_e2e::{AMQP_URL, Scheduler, Setup, service_config, wait_for};
use serde_json::json;
use sqlx::PgPool;

use crate::common::{RecordingWorker, assert_consecutive, job, leader, runs};

#[sqlx::test(migrations = "../migrations")]
async fn three_instances_fire_each_instant_once_under_one_leader(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["ha"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let jobs = vec![
        job(json!({"name": "a", "group": "ha", "every": "1s"})),
        job(json!({"name": "b", "group": "ha", "every": "1s"})),
        job(json!({"name": "c", "group": "ha", "schedule": "* * * * * *"})),
    ];
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, "ha", &["a", "b", "c"]);
    let instances: Vec<(&str, Scheduler)> = ["s1", "s2", "s3"]
        .into_iter()
        .map(|id| {
            let config = service_config(&db, AMQP_URL, id, &prefix);
            (id, Scheduler::start(config, jobs.clone()))
        })
        .collect();

    // Watch the lease for 15 s: at any moment at most one holder, and it never changes hands
    // while nobody stops.
    let mut holders = HashSet::new();
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if let Some((holder, term)) = leader(&pool).await {
            holders.insert((holder, term));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        holders.len(),
        1,
        "exactly one leader and term for the whole run: {holders:?}"
    );
    let (holder, term) = holders.into_iter().next().expect("one leader");
    // Followers first: a leader stopped before them hands over, and the next term would
    // rightly write runs of its own.
    let (lead, followers): (Vec<_>, Vec<_>) =
        instances.into_iter().partition(|(id, _)| *id == holder);
    assert_eq!(
        lead.len(),
        1,
        "the lease holder {holder} is one of the instances"
    );
    for (_, s) in followers.into_iter().chain(lead) {
        s.stop().await.expect("graceful stop");
    }

    for name in ["a", "b", "c"] {
        let all = runs(&pool, name).await;
        assert!(all.len() >= 13, "job {name}: {} runs in 15 s", all.len());
        assert_consecutive(&all, Duration::from_secs(1));
        assert!(
            all.iter().all(|r| r.term == Some(term)),
            "job {name}: every run written under term {term}"
        );
    }
    let total: usize = ["a", "b", "c"].len();
    let all_runs: Vec<i64> = {
        let mut ids = Vec::new();
        for name in ["a", "b", "c"] {
            ids.extend(
                runs(&pool, name)
                    .await
                    .into_iter()
                    // A run written inside the look-ahead window just before the stop is
                    // persisted but unpublished; it waits for the next leader, and there is
                    // none in this test.
                    .filter(|r| r.state != "skipped" && r.published_at.is_some())
                    .map(|r| r.id),
            );
        }
        ids
    };
    assert!(all_runs.len() >= total * 13);
    let counts = wait_for(Duration::from_secs(15), "every run executed", || {
        let counts = worker.counts();
        let ids = all_runs.clone();
        async move {
            ids.iter()
                .all(|id| counts.contains_key(id))
                .then_some(counts)
        }
    })
    .await;
    assert!(
        counts.values().all(|&n| n == 1),
        "some run executed twice: {counts:?}"
    );
    worker.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn graceful_stop_hands_over_within_a_second(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["handover"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let jobs = vec![job(
        json!({"name": "beat", "group": "handover", "every": "1s"}),
    )];
    let mut a = Some(Scheduler::start(
        service_config(&db, AMQP_URL, "a", &prefix),
        jobs.clone(),
    ));
    let (first, _) = wait_for(Duration::from_secs(10), "a leader", || async {
        leader(&pool).await
    })
    .await;
    let mut b = Some(Scheduler::start(
        service_config(&db, AMQP_URL, "b", &prefix),
        jobs.clone(),
    ));
    assert_eq!(first, "a", "the first instance up leads");
    // Let b settle as a follower.
    wait_for(
        Duration::from_secs(10),
        "b to be registered as follower (a run under a's lease)",
        || async { (runs(&pool, "beat").await.len() >= 2).then_some(()) },
    )
    .await;

    a.take().expect("a").stop().await.expect("graceful stop");
    let stopped = Instant::now();
    let (holder, _) = wait_for(Duration::from_secs(5), "b to take over", || async {
        leader(&pool).await.filter(|(h, _)| h == "b")
    })
    .await;
    let handover = stopped.elapsed();
    println!("graceful hand-over took {handover:?}");
    assert_eq!(holder, "b");
    assert!(
        handover < Duration::from_secs(1),
        "hand-over took {handover:?}"
    );

    // And b keeps firing: the next instants get runs with b's term.
    let (_, b_term) = leader(&pool).await.expect("b leads");
    wait_for(Duration::from_secs(5), "a run under b's term", || async {
        runs(&pool, "beat")
            .await
            .iter()
            .any(|r| r.term == Some(b_term))
            .then_some(())
    })
    .await;
    b.take().expect("b").stop().await.expect("graceful stop");
    assert_consecutive(&runs(&pool, "beat").await, Duration::from_secs(1));
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn killed_leader_is_replaced_after_the_lease_and_missed_fires_follow_the_misfire_policy(
    pool: PgPool,
) {
    let t = Setup::new(&pool).with_groups(&["kill"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let jobs = vec![
        job(
            json!({"name": "all", "group": "kill", "every": "1s", "misfire": "fire_all", "misfire_grace": "500ms"}),
        ),
        job(
            json!({"name": "skip", "group": "kill", "every": "1s", "misfire": "skip", "misfire_grace": "500ms"}),
        ),
        job(
            json!({"name": "once", "group": "kill", "every": "1s", "misfire": "fire_once", "misfire_grace": "500ms"}),
        ),
    ];
    let a = Scheduler::start(service_config(&db, AMQP_URL, "a", &prefix), jobs.clone());
    wait_for(Duration::from_secs(10), "a to lead and fire", || async {
        (runs(&pool, "all").await.len() >= 2).then_some(())
    })
    .await;
    let b = Scheduler::start(service_config(&db, AMQP_URL, "b", &prefix), jobs.clone());
    let (_, a_term) = leader(&pool).await.expect("a leads");

    a.kill().await;
    let killed = Instant::now();
    let (_, b_term) = wait_for(
        Duration::from_secs(10),
        "b to take over after the lease",
        || async { leader(&pool).await.filter(|(h, _)| h == "b") },
    )
    .await;
    let takeover = killed.elapsed();
    let next_fire = wait_for(Duration::from_secs(10), "a run under b's term", || async {
        runs(&pool, "all")
            .await
            .iter()
            .any(|r| r.term == Some(b_term) && r.published_at.is_some())
            .then_some(killed.elapsed())
    })
    .await;
    println!(
        "killed leader: takeover after {takeover:?}, next fire published {next_fire:?} after the kill"
    );
    assert!(b_term > a_term);
    assert!(
        next_fire < Duration::from_secs(5),
        "next fire {next_fire:?} after the kill"
    );
    // Let a couple of on-time fires land under b, then stop.
    let settled = runs(&pool, "all").await.len() + 2;
    wait_for(Duration::from_secs(10), "two more fires", || async {
        (runs(&pool, "all").await.len() >= settled).then_some(())
    })
    .await;
    b.stop().await.expect("graceful stop");

    // fire_all: no instant lost; the ones that fell due in the gap ran late, as catch-up.
    let all = runs(&pool, "all").await;
    assert_consecutive(&all, Duration::from_secs(1));
    assert!(
        all.iter().any(|r| r.trigger == "catchup"),
        "fire_all ran missed fires as catch-up"
    );
    assert!(all.iter().all(|r| r.state != "skipped"));
    // skip: the gap is recorded, each missed instant skipped with its reason.
    let skip = runs(&pool, "skip").await;
    assert_consecutive(&skip, Duration::from_secs(1));
    let skipped: Vec<_> = skip.iter().filter(|r| r.state == "skipped").collect();
    assert!(!skipped.is_empty(), "skip recorded the missed fires");
    assert!(
        skipped
            .iter()
            .all(|r| r.reason.as_deref().is_some_and(|why| why.contains("skip"))),
        "{skipped:?}"
    );
    assert!(skip.iter().all(|r| r.trigger != "catchup"));
    // fire_once: exactly one catch-up run, the rest of the gap skipped as coalesced.
    let once = runs(&pool, "once").await;
    assert_consecutive(&once, Duration::from_secs(1));
    assert_eq!(
        once.iter().filter(|r| r.trigger == "catchup").count(),
        1,
        "{once:?}"
    );
    t.finish().await;
}
