//! The `chime` binary as an operator runs it: `chime check` exit codes and output on good,
//! broken and missing job files; completions; the runtime commands against a real database
//! (`#[sqlx::test]`), with their one result line, their audit actor, and their errors when the
//! database is missing. (Building this test also builds `target/*/chime`, which the end-to-end
//! benchmark smoke tests start as a process.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chime_scheduler::config::{SourceFormat, parse_job_file};
use chime_scheduler::store::Store;
use sqlx::PgPool;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn chime(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chime"))
        .args(args)
        .env_remove("CHIME_CONFIG")
        .output()
        .expect("the chime binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn check_accepts_a_good_file_and_lists_five_fires_per_job() {
    let good = fixture("good.toml");
    let output = chime(&["check", good.to_str().expect("utf-8 path")]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "chime check said:\n{text}");
    assert!(text.contains("OK: "), "{text}");
    let jobs = text.lines().filter(|l| l.starts_with("job ")).count();
    assert!(jobs > 0, "no job listed:\n{text}");
}

#[test]
fn check_rejects_a_broken_file_naming_every_mistake_and_exits_1() {
    let broken = fixture("broken.toml");
    let output = chime(&["check", broken.to_str().expect("utf-8 path")]);
    let text = stdout(&output) + &String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "chime check said:\n{text}");
    for mistake in ["Europe/Berln", "shedule", "5 minutes please", "sometimes"] {
        assert!(
            text.contains(mistake),
            "the report does not name `{mistake}`:\n{text}"
        );
    }
    assert!(text.contains("FAILED: "), "{text}");
}

#[test]
fn check_of_a_missing_file_fails_with_its_path() {
    let output = chime(&["check", "no/such/jobs.toml"]);
    let text = stdout(&output) + &String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("no/such/jobs.toml"), "{text}");
}

#[test]
fn bash_completions_name_the_subcommands() {
    let output = chime(&["completions", "bash"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        text.contains("complete "),
        "not a bash completion script:\n{text}"
    );
    for word in [
        "jobs", "runs", "dlq", "migrate", "check", "pause", "resume", "--as",
    ] {
        assert!(text.contains(word), "`{word}` is not completed");
    }
    for shell in ["zsh", "fish"] {
        let output = chime(&["completions", shell]);
        assert_eq!(output.status.code(), Some(0), "{shell}");
        assert!(stdout(&output).contains("trigger"), "{shell}");
    }
}

/// The URL of the test's database (the same server as `DATABASE_URL`, another database).
async fn url_of(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .expect("database name");
    with_database(&name)
}

fn with_database(name: &str) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL (.cargo/config.toml)");
    let server = base
        .rsplit_once('/')
        .map_or(base.as_str(), |(server, _)| server);
    format!("{server}/{name}")
}

/// Runs `chime` against the database at `url`, with the environment adjusted by `env` (`None`
/// removes a variable). Its stderr is a pipe, not a terminal.
fn chime_at(url: &str, args: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chime"));
    command
        .args(args)
        .env_remove("CHIME_CONFIG")
        .env_remove("CHIME_ACTOR")
        .env_remove("RUST_LOG")
        .env("CHIME_DATABASE_URL", url);
    for (key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    command.output().expect("the chime binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn declare_job(pool: &PgPool) {
    let specs = parse_job_file(
        "jobs.toml",
        "[[jobs]]\nname = \"nightly\"\ngroup = \"g\"\nevery = \"1h\"\n\
         params = { batch = 500, region = \"eu\" }\ndescription = \"reconciles the ledger\"\n",
        SourceFormat::Toml,
    )
    .expect("valid job file");
    Store::from_pool(pool.clone())
        .sync_config_jobs(&specs)
        .await
        .expect("jobs stored");
}

async fn last_actor(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT actor FROM chime_audit ORDER BY id DESC LIMIT 1")
        .fetch_one(pool)
        .await
        .expect("an audit entry")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_changing_command_prints_one_plain_line_and_no_log(pool: PgPool) {
    declare_job(&pool).await;
    let url = url_of(&pool).await;
    let output = chime_at(
        &url,
        &["jobs", "pause", "nightly"],
        &[("USER", Some("alice"))],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "paused nightly\n");
    assert_eq!(stderr(&output), "", "no log lines at the default level");
    assert_eq!(last_actor(&pool).await, "cli:alice");

    // Asked for, logs go to stderr, without colour when it is not a terminal.
    let output = chime_at(
        &url,
        &["jobs", "resume", "nightly"],
        &[("USER", Some("alice")), ("RUST_LOG", Some("info"))],
    );
    assert_eq!(stdout(&output), "resumed nightly\n");
    let log = stderr(&output);
    assert!(log.contains("operator action"), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a pipe: {log:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_audit_actor_is_named_by_as_or_chime_actor_else_user_else_uid_and_host(pool: PgPool) {
    declare_job(&pool).await;
    let url = url_of(&pool).await;
    let no_user = [("USER", None), ("LOGNAME", None)];

    let output = chime_at(
        &url,
        &["--as", "deploy-bot", "jobs", "pause", "nightly"],
        &no_user,
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(last_actor(&pool).await, "cli:deploy-bot");

    let output = chime_at(
        &url,
        &["jobs", "resume", "nightly"],
        &[
            ("USER", None),
            ("LOGNAME", None),
            ("CHIME_ACTOR", Some("cron-nightly")),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(last_actor(&pool).await, "cli:cron-nightly");

    // Neither, nor $USER (containers, cron): the user id and the host, never `unknown`.
    let output = chime_at(&url, &["jobs", "pause", "nightly"], &no_user);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let actor = last_actor(&pool).await;
    assert!(
        actor.starts_with("cli:uid-") && actor.contains('@'),
        "{actor}"
    );

    // A name with a space is refused before anything runs.
    let output = chime_at(
        &url,
        &["--as", "a b", "jobs", "resume", "nightly"],
        &no_user,
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("without spaces"),
        "{}",
        stderr(&output)
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn jobs_show_prints_the_definition_readably_with_who_paused_it(pool: PgPool) {
    declare_job(&pool).await;
    let url = url_of(&pool).await;
    chime_at(&url, &["--as", "alice", "jobs", "pause", "nightly"], &[]);
    let output = chime_at(&url, &["jobs", "show", "nightly"], &[]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        text.lines().any(|l| l == "paused     yes (cli:alice)"),
        "{text}"
    );
    assert!(text.contains("\"batch\": 500"), "pretty JSON:\n{text}");
    for line in text.lines() {
        assert!(
            line.len() < 100,
            "a padded or one-line definition: {line:?}"
        );
        assert_eq!(line, line.trim_end(), "trailing padding: {line:?}");
    }

    let output = chime_at(&url, &["jobs", "list"], &[]);
    assert!(
        stdout(&output).contains("yes (cli:alice)"),
        "{}",
        stdout(&output)
    );
    let output = chime_at(&url, &["-o", "json", "jobs", "show", "nightly"], &[]);
    let job: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(job["paused_by"], "cli:alice");
}

#[sqlx::test(migrations = "../migrations")]
async fn trigger_refuses_params_that_are_not_an_object_before_sending(pool: PgPool) {
    declare_job(&pool).await;
    let url = url_of(&pool).await;
    for params in ["[1,2]", "7", "\"x\"", "not json"] {
        let output = chime_at(
            &url,
            &["jobs", "trigger", "nightly", "--params", params],
            &[],
        );
        let error = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{params}: {error}");
        assert!(error.contains("--params"), "{params}: {error}");
    }
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(runs, 0);
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_audit")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(audited, 0, "refused before reaching the operation");
}

#[sqlx::test(migrations = false)]
async fn commands_against_a_missing_database_or_tables_say_to_migrate_once(pool: PgPool) {
    // (Not named after the test's database: PostgreSQL cuts names at 63 bytes.)
    let missing = with_database(&format!("chime_cli_missing_{}", std::process::id()));
    for url in [missing, url_of(&pool).await] {
        let output = chime_at(&url, &["jobs", "list"], &[]);
        let error = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{error}");
        assert_eq!(error.matches("error:").count(), 1, "{error}");
        assert_eq!(
            error.matches("run `chime migrate` first").count(),
            1,
            "{error}"
        );
        assert!(!error.contains("at line"), "{error}");
        assert!(!error.contains('\u{1b}'), "{error:?}");
    }
}

#[sqlx::test(migrations = false)]
async fn migrate_says_it_created_the_database_and_how_many_migrations_it_applied(pool: PgPool) {
    let name = format!("chime_cli_fresh_{}", std::process::id());
    let url = with_database(&name);
    let output = chime_at(&url, &["migrate"], &[]);
    let first = stdout(&output);
    let second = stdout(&chime_at(&url, &["migrate"], &[]));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(&pool)
    .await
    .expect("dropped");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let migrations = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations"))
        .expect("migrations folder")
        .count();
    assert_eq!(
        first,
        format!("created database {name}; applied {migrations} migrations\n")
    );
    assert_eq!(second, format!("database {name} is up to date\n"));
}

#[sqlx::test(migrations = "../migrations")]
async fn diff_exits_0_when_files_match_the_cluster_2_with_changes_and_1_on_mistakes(pool: PgPool) {
    declare_job(&pool).await;
    let url = url_of(&pool).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("job file written");
        path.to_str().expect("utf-8 path").to_owned()
    };
    let same = write(
        "same.toml",
        "[[jobs]]\nname = \"nightly\"\ngroup = \"g\"\nevery = \"1h\"\n\
         params = { batch = 500, region = \"eu\" }\ndescription = \"reconciles the ledger\"\n",
    );
    let output = chime_at(&url, &["diff", &same], &[]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    assert_eq!(
        stdout(&output),
        "No changes: 1 jobs as the cluster runs them\n"
    );

    let changed = write(
        "changed.toml",
        "[[jobs]]\nname = \"nightly\"\ngroup = \"g\"\nevery = \"2h\"\njitter = \"1m\"\n\
         params = { batch = 500, region = \"eu\" }\ndescription = \"reconciles the ledger\"\n\
         [[jobs]]\nname = \"fresh\"\ngroup = \"g\"\nschedule = \"0 9 * * *\"\n",
    );
    let output = chime_at(&url, &["diff", &changed], &[]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(2), "{text}{}", stderr(&output));
    assert!(
        text.contains("+ job \"fresh\" (added)\n    next fires:        "),
        "{text}"
    );
    assert!(
        text.contains("~ job \"nightly\" (changed)\n    every: \"1h\" -> \"2h\"\n    jitter: (not set) -> \"1m\"\n    next fires before: "),
        "{text}"
    );
    assert!(
        text.ends_with("1 added, 1 changed, 0 removed; 0 unchanged\n"),
        "{text}"
    );
    // JSON for scripts; nothing was stored.
    let output = chime_at(&url, &["diff", "--output", "json", &changed], &[]);
    assert_eq!(output.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["changes"][1]["change"], "changed", "{report}");
    assert_eq!(
        report["changes"][1]["fields"][0]["field"], "every",
        "{report}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_jobs")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(stored, 1, "chime diff stores nothing");

    // No file declares the job any more: removed.
    let empty = write("other.toml", "[[jobs]]\nname = \"other\"\ngroup = \"g\"\n");
    let text = stdout(&chime_at(&url, &["diff", &empty], &[]));
    assert!(
        text.contains("- job \"nightly\" (removed)\n    next fires were:   "),
        "{text}"
    );

    let broken = write(
        "broken.toml",
        "[[jobs]]\nname = \"x\"\ngroup = \"g\"\nevery = \"soon\"\n",
    );
    let output = chime_at(&url, &["diff", &broken], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    assert!(stdout(&output).contains("soon"), "{}", stdout(&output));
}

#[sqlx::test(migrations = "../migrations")]
async fn jobs_history_lists_each_version_with_who_and_rollback_refuses_a_file_job(pool: PgPool) {
    declare_job(&pool).await;
    let url = url_of(&pool).await;
    let output = chime_at(&url, &["jobs", "history", "nightly"], &[]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    let row = text
        .lines()
        .find(|line| line.contains("(current)"))
        .unwrap_or_else(|| panic!("no current version:\n{text}"));
    for word in ["1 (current)", "file", "config", "created"] {
        assert!(row.contains(word), "{word:?} missing from {row:?}");
    }
    let output = chime_at(&url, &["jobs", "rollback", "nightly", "--to", "1"], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("declared in a job file"),
        "{}",
        stderr(&output)
    );
}
