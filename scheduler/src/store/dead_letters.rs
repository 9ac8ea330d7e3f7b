//! The SQL of dead letters: the leader's fenced insert of messages drained from the parking-lot
//! queues, keyset pages of them for every read, one in full, and their deletion on replay and
//! purge.
//!
//! A message drained twice (the leader stopped between the commit and the broker ack) has the
//! same fingerprint both times and is kept once (`UNIQUE (group_name, fingerprint)`).

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::{Fence, Store};

/// A parked message as the drain stores it: what it says (each text value already cut to its
/// bound), its headers as JSON, its body (cut), and its fingerprint.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDeadLetter {
    /// Executor group whose parking lot held it.
    pub group: String,
    /// Run id, when it has one.
    pub run_id: Option<i64>,
    /// Job.
    pub job: Option<String>,
    /// Attempt.
    pub attempt: Option<i32>,
    /// Why it was parked.
    pub reason: Option<String>,
    /// Who parked it.
    pub parked_by: Option<String>,
    /// Last error.
    pub error: Option<String>,
    /// When it was parked.
    pub parked_at: Option<DateTime<Utc>>,
    /// The `message-id` property.
    pub message_id: Option<String>,
    /// The `content-type` property.
    pub content_type: Option<String>,
    /// Every header, as a JSON object.
    pub headers: serde_json::Value,
    /// The body, at most `limits::MAX_TRIGGER_BYTES`.
    pub body: Vec<u8>,
    /// Whether `body` was cut.
    pub body_truncated: bool,
    /// SHA-256 of the message (see the module docs).
    pub fingerprint: Vec<u8>,
}

/// A stored dead letter, as lists show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRecord {
    /// Its id (drain order).
    pub id: i64,
    /// Executor group.
    pub group: String,
    /// Run id, when it has one.
    pub run_id: Option<i64>,
    /// Job.
    pub job: Option<String>,
    /// Attempt.
    pub attempt: Option<i32>,
    /// Why it was parked.
    pub reason: Option<String>,
    /// Who parked it.
    pub parked_by: Option<String>,
    /// Last error.
    pub error: Option<String>,
    /// When it was parked.
    pub parked_at: Option<DateTime<Utc>>,
}

/// A stored dead letter in full.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterContent {
    /// What lists show.
    pub record: DeadLetterRecord,
    /// Dead letters of its group drained before it.
    pub position: i64,
    /// The `message-id` property.
    pub message_id: Option<String>,
    /// The `content-type` property.
    pub content_type: Option<String>,
    /// Every header, as a JSON object.
    pub headers: serde_json::Value,
    /// The body (cut when `body_truncated`).
    pub body: Vec<u8>,
    /// Whether `body` was cut.
    pub body_truncated: bool,
}

fn record(row: &sqlx::postgres::PgRow) -> DeadLetterRecord {
    DeadLetterRecord {
        id: row.get("id"),
        group: row.get("group_name"),
        run_id: row.get("run_id"),
        job: row.get("job_name"),
        attempt: row.get("attempt"),
        reason: row.get("reason"),
        parked_by: row.get("parked_by"),
        error: row.get("error"),
        parked_at: row.get("parked_at"),
    }
}

impl Store {
    /// Stores drained messages in one fenced statement, in the order given; a message whose
    /// fingerprint its group already has is skipped. Returns how many were new, or `None` if
    /// the fence no longer holds (nothing was stored).
    pub async fn insert_dead_letters(
        &self,
        fence: &Fence,
        letters: &[NewDeadLetter],
    ) -> anyhow::Result<Option<u64>> {
        let column = |f: fn(&NewDeadLetter) -> Option<String>| -> Vec<Option<String>> {
            letters.iter().map(f).collect()
        };
        let row = sqlx::query(
            "WITH lease AS (SELECT term FROM chime_fence($1, $2)), ins AS (
                 INSERT INTO chime_dead_letters (group_name, run_id, job_name, attempt, reason,
                     parked_by, error, parked_at, message_id, content_type, headers, body,
                     body_truncated, fingerprint)
                 SELECT g, r, j, a, re, pb, e, pa, m, ct, h, b, bt, f
                 FROM unnest($3::text[], $4::bigint[], $5::text[], $6::int[], $7::text[],
                             $8::text[], $9::text[], $10::timestamptz[], $11::text[], $12::text[],
                             $13::jsonb[], $14::bytea[], $15::bool[], $16::bytea[])
                      WITH ORDINALITY AS u(g, r, j, a, re, pb, e, pa, m, ct, h, b, bt, f, n)
                 WHERE EXISTS (SELECT FROM lease)
                 ORDER BY n
                 ON CONFLICT (group_name, fingerprint) DO NOTHING
                 RETURNING 1
             )
             SELECT (SELECT count(*) FROM lease) AS leased, (SELECT count(*) FROM ins) AS inserted",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(letters.iter().map(|l| l.group.clone()).collect::<Vec<_>>())
        .bind(letters.iter().map(|l| l.run_id).collect::<Vec<_>>())
        .bind(column(|l| l.job.clone()))
        .bind(letters.iter().map(|l| l.attempt).collect::<Vec<_>>())
        .bind(column(|l| l.reason.clone()))
        .bind(column(|l| l.parked_by.clone()))
        .bind(column(|l| l.error.clone()))
        .bind(letters.iter().map(|l| l.parked_at).collect::<Vec<_>>())
        .bind(column(|l| l.message_id.clone()))
        .bind(column(|l| l.content_type.clone()))
        .bind(
            letters
                .iter()
                .map(|l| l.headers.clone())
                .collect::<Vec<_>>(),
        )
        .bind(letters.iter().map(|l| l.body.clone()).collect::<Vec<_>>())
        .bind(letters.iter().map(|l| l.body_truncated).collect::<Vec<_>>())
        .bind(
            letters
                .iter()
                .map(|l| l.fingerprint.clone())
                .collect::<Vec<_>>(),
        )
        .fetch_one(&self.pool)
        .await
        .context("storing drained dead letters")?;
        if row.get::<i64, _>("leased") == 0 {
            return Ok(None);
        }
        Ok(Some(row.get::<i64, _>("inserted") as u64))
    }

    /// Up to `limit` dead letters of `group` (or of every group) with an id above `after`, in
    /// drain order.
    pub async fn dead_letters(
        &self,
        group: Option<&str>,
        after: Option<i64>,
        limit: i64,
    ) -> anyhow::Result<Vec<DeadLetterRecord>> {
        let rows = sqlx::query(
            "SELECT id, group_name, run_id, job_name, attempt, reason, parked_by, error, parked_at
             FROM chime_dead_letters
             WHERE ($1::text IS NULL OR group_name = $1) AND id > $2
             ORDER BY id LIMIT $3",
        )
        .bind(group)
        .bind(after.unwrap_or(0))
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .context("listing dead letters")?;
        Ok(rows.iter().map(record).collect())
    }

    /// The first dead letter of run `run_id`, in full, with its place in its group.
    pub async fn dead_letter_of_run(
        &self,
        run_id: i64,
    ) -> anyhow::Result<Option<DeadLetterContent>> {
        let row = sqlx::query(
            "SELECT id, group_name, run_id, job_name, attempt, reason, parked_by, error, parked_at,
                 message_id, content_type, headers, body, body_truncated,
                 (SELECT count(*) FROM chime_dead_letters o
                  WHERE o.group_name = d.group_name AND o.id < d.id) AS position
             FROM chime_dead_letters d WHERE run_id = $1 ORDER BY id LIMIT 1",
        )
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await
        .with_context(|| format!("reading the dead letter of run {run_id}"))?;
        Ok(row.map(|row| DeadLetterContent {
            record: record(&row),
            position: row.get("position"),
            message_id: row.get("message_id"),
            content_type: row.get("content_type"),
            headers: row.get("headers"),
            body: row.get("body"),
            body_truncated: row.get("body_truncated"),
        }))
    }

    /// Deletes the dead letters of run `run_id` in `group` (after a replay); returns how many.
    pub async fn delete_dead_letters_of_run(
        &self,
        group: &str,
        run_id: i64,
    ) -> anyhow::Result<u64> {
        let done =
            sqlx::query("DELETE FROM chime_dead_letters WHERE group_name = $1 AND run_id = $2")
                .bind(group)
                .bind(run_id)
                .execute(&self.pool)
                .await
                .with_context(|| format!("removing the dead letters of run {run_id}"))?;
        Ok(done.rows_affected())
    }

    /// Deletes every dead letter of `group` (a purge); returns how many.
    pub async fn purge_dead_letters(&self, group: &str) -> anyhow::Result<u64> {
        let done = sqlx::query("DELETE FROM chime_dead_letters WHERE group_name = $1")
            .bind(group)
            .execute(&self.pool)
            .await
            .with_context(|| format!("purging the dead letters of group {group:?}"))?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::PgPool;

    fn letter(group: &str, run_id: i64, fingerprint: u8) -> NewDeadLetter {
        NewDeadLetter {
            group: group.into(),
            run_id: Some(run_id),
            job: Some("j".into()),
            attempt: Some(3),
            reason: Some("attempts exhausted".into()),
            parked_by: Some("w1".into()),
            error: Some("boom".into()),
            parked_at: Some(Utc::now()),
            message_id: Some(run_id.to_string()),
            content_type: Some("application/json".into()),
            headers: serde_json::json!({"x-chime-attempt": 3}),
            body: b"{}".to_vec(),
            body_truncated: false,
            fingerprint: vec![fingerprint; 32],
        }
    }

    async fn lead(store: &Store) -> Fence {
        store.lead_for_test("l").await
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_message_drained_twice_is_stored_once_and_only_under_the_lease(pool: PgPool) {
        let store = Store::from_pool(pool);
        let fence = lead(&store).await;
        let batch = [letter("g", 1, 1), letter("g", 2, 2), letter("g", 1, 1)];
        assert_eq!(
            store.insert_dead_letters(&fence, &batch).await.unwrap(),
            Some(2)
        );
        // The same message again (the ack was lost), and the same bytes in another group.
        assert_eq!(
            store
                .insert_dead_letters(&fence, &[letter("g", 1, 1), letter("h", 1, 1)])
                .await
                .unwrap(),
            Some(1)
        );
        let listed = store.dead_letters(Some("g"), None, 10).await.unwrap();
        assert_eq!(
            listed.iter().map(|l| l.run_id).collect::<Vec<_>>(),
            [Some(1), Some(2)],
            "drain order, once each"
        );
        let stale = Fence {
            holder: "l".into(),
            term: fence.term - 1,
        };
        assert_eq!(
            store
                .insert_dead_letters(&stale, &[letter("g", 3, 3)])
                .await
                .unwrap(),
            None
        );
        assert_eq!(store.dead_letters(None, None, 10).await.unwrap().len(), 3);

        // Keyset pages, one in full, deletion.
        let first = store.dead_letters(None, None, 2).await.unwrap();
        let rest = store
            .dead_letters(None, Some(first[1].id), 2)
            .await
            .unwrap();
        assert_eq!((first.len(), rest.len()), (2, 1));
        assert_eq!(rest[0].group, "h");
        let full = store.dead_letter_of_run(2).await.unwrap().expect("stored");
        assert_eq!(full.position, 1);
        assert_eq!(full.headers, serde_json::json!({"x-chime-attempt": 3}));
        assert_eq!(full.body, b"{}");
        assert_eq!(store.delete_dead_letters_of_run("g", 1).await.unwrap(), 1);
        assert_eq!(store.purge_dead_letters("g").await.unwrap(), 1);
        assert_eq!(store.dead_letters(Some("g"), None, 10).await.unwrap(), []);
    }
}
