//! The lease against a real database (issue "Keep the promises under load"): a fenced write in
//! flight never holds up the leader's renewal, however long it takes, yet a takeover still waits
//! for it, and a deposed leader's writes are refused.

use std::time::Duration;

use sqlx::PgPool;

use super::{Fence, MARK_PUBLISHED_SQL, Store};

const TTL: Duration = Duration::from_secs(3);

/// Runs the mark (a fenced statement) for no runs inside `tx`: it takes the lease row the way
/// every fenced write does and keeps it until `tx` ends. Whether the lease held.
async fn fenced_write(tx: &mut sqlx::PgConnection, fence: &Fence) -> bool {
    let leased: i64 = sqlx::query_scalar(MARK_PUBLISHED_SQL)
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(Vec::<i64>::new())
        .bind(Vec::<chrono::DateTime<chrono::Utc>>::new())
        .fetch_one(tx)
        .await
        .expect("fenced write");
    leased == 1
}

/// Waits until a statement on `chime_leader` waits for a row lock.
async fn a_lease_statement_waits_for_a_lock(pool: &PgPool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE 'UPDATE chime_leader%'",
            )
            .fetch_one(pool)
            .await
            .expect("pg_stat_activity");
            if waiting > 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "the takeover never waited for the fenced write"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_slow_fenced_write_never_holds_up_the_renewal_but_holds_up_a_takeover(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    let term = store
        .acquire_lease("a", TTL)
        .await
        .unwrap()
        .expect("a leads");
    let fence = Fence {
        holder: "a".into(),
        term,
    };
    let before = store.leader().await.unwrap().expires_at.expect("expiry");

    // A fenced write of the leader that does not end: its transaction stays open with the
    // lease row locked until this test ends it.
    let mut slow = pool.begin().await.unwrap();
    assert!(fenced_write(&mut slow, &fence).await);

    // The renewal does not wait for it (it used to wait until the write committed, and a write
    // slower than the lease made the leader depose itself).
    let renewed = tokio::time::timeout(Duration::from_secs(10), store.acquire_lease("a", TTL))
        .await
        .expect("the renewal waited for the leader's own write");
    assert_eq!(renewed.unwrap(), Some(term), "renewed in the same term");
    let after = store.leader().await.unwrap().expires_at.expect("expiry");
    assert!(
        after > before,
        "the renewal extended the lease: {before} -> {after}"
    );

    // The lease runs out (the leader froze); another instance tries to take over while the
    // write is still in flight: it must wait for it, so no write of term N commits after term
    // N + 1 began.
    sqlx::query("UPDATE chime_leader SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let other = Store::from_pool(pool.clone());
    let takeover = tokio::spawn(async move { other.acquire_lease("b", TTL).await });
    a_lease_statement_waits_for_a_lock(&pool).await;
    assert!(
        !takeover.is_finished(),
        "the takeover committed under a fenced write"
    );
    slow.commit().await.unwrap();
    let new_term = takeover.await.unwrap().unwrap().expect("b takes over");
    assert_eq!(new_term, term + 1);

    // The deposed leader's writes are refused from now on.
    assert!(!store.mark_published(&fence, &[]).await.unwrap());
    let mut late = pool.begin().await.unwrap();
    assert!(!fenced_write(&mut late, &fence).await);
    late.rollback().await.unwrap();
    let b = Fence {
        holder: "b".into(),
        term: new_term,
    };
    assert!(store.mark_published(&b, &[]).await.unwrap());
}
