//! Who owns `paused` across job-file reloads (issue 12, point 7), against a real database: the
//! job file's text is parsed as a reload parses it and synced as a reload syncs it.

use sqlx::PgPool;

use super::{JobRecord, Store};
use crate::config::{SourceFormat, parse_job_file};

/// Parses a job file declaring `nightly-reconcile` with `paused` and syncs it, as SIGHUP does;
/// returns what the sync reported as changed.
async fn reload(store: &Store, paused: bool, every: &str) -> Vec<String> {
    let text = format!(
        "[[jobs]]\nname = \"nightly-reconcile\"\ngroup = \"g\"\nevery = \"{every}\"\n\
         paused = {paused}\n"
    );
    let specs = parse_job_file("jobs.toml", &text, SourceFormat::Toml).expect("valid job file");
    let diff = store.sync_config_jobs(&specs).await.expect("synced");
    diff.added.into_iter().chain(diff.changed).collect()
}

async fn job(store: &Store) -> JobRecord {
    store
        .job("nightly-reconcile")
        .await
        .expect("read")
        .expect("the job exists")
}

fn pause(job: &JobRecord) -> (bool, Option<&str>) {
    (job.paused, job.paused_by.as_deref())
}

/// The reported bug: `paused = true` changed to `false` plus SIGHUP logged the job as changed,
/// but it stayed paused.
#[sqlx::test(migrations = "../migrations")]
async fn unpausing_in_the_file_resumes_the_job(pool: PgPool) {
    let store = Store::from_pool(pool);
    assert_eq!(reload(&store, true, "1m").await, ["nightly-reconcile"]);
    assert_eq!(
        pause(&job(&store).await),
        (true, Some("file")),
        "declared paused"
    );
    let paused_cursor = job(&store).await.cursor_at;

    assert_eq!(reload(&store, false, "1m").await, ["nightly-reconcile"]);
    let resumed = job(&store).await;
    assert_eq!(pause(&resumed), (false, None));
    assert!(
        resumed.cursor_at > paused_cursor,
        "resuming moves the cursor to now, as `chime jobs resume` does: {:?}",
        resumed.cursor_at
    );

    assert_eq!(reload(&store, true, "1m").await, ["nightly-reconcile"]);
    assert_eq!(
        pause(&job(&store).await),
        (true, Some("file")),
        "paused again"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn an_operators_pause_and_resume_survive_reloads_until_the_file_changes_its_word(
    pool: PgPool,
) {
    let store = Store::from_pool(pool);
    reload(&store, false, "1m").await;
    assert!(
        store
            .set_paused("nightly-reconcile", true, "cli:alice")
            .await
            .expect("paused")
    );
    assert_eq!(pause(&job(&store).await), (true, Some("cli:alice")));

    // Unchanged file, and a change of something else: the operator's pause stands.
    assert!(reload(&store, false, "1m").await.is_empty());
    assert_eq!(reload(&store, false, "2m").await, ["nightly-reconcile"]);
    assert_eq!(pause(&job(&store).await), (true, Some("cli:alice")));

    // The file says paused now: still paused, now by the file.
    reload(&store, true, "2m").await;
    assert_eq!(pause(&job(&store).await), (true, Some("file")));

    // An operator resumes a job its file pauses; reloading the same file keeps it running.
    store
        .set_paused("nightly-reconcile", false, "token:ops")
        .await
        .expect("resumed");
    reload(&store, true, "3m").await;
    assert_eq!(pause(&job(&store).await), (false, None));

    // Until the file's word changes: false, then true again pauses it.
    reload(&store, false, "3m").await;
    assert_eq!(pause(&job(&store).await), (false, None));
    reload(&store, true, "3m").await;
    assert_eq!(pause(&job(&store).await), (true, Some("file")));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_file_taking_over_an_api_job_brings_its_own_pause(pool: PgPool) {
    let store = Store::from_pool(pool);
    let specs = parse_job_file(
        "api",
        "[[jobs]]\nname = \"nightly-reconcile\"\ngroup = \"g\"\nevery = \"1m\"\n",
        SourceFormat::Toml,
    )
    .expect("valid");
    assert!(
        store
            .create_api_job(&specs[0], "cli:test")
            .await
            .expect("created")
    );
    store
        .set_paused("nightly-reconcile", true, "token:ops")
        .await
        .expect("paused");

    assert_eq!(reload(&store, false, "1m").await, ["nightly-reconcile"]);
    let job = job(&store).await;
    assert_eq!(job.source, "config");
    assert_eq!(
        pause(&job),
        (false, None),
        "the file's definition replaces the API's"
    );
}
