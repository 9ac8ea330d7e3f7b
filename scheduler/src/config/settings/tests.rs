//! Settings tests: defaults, file, environment overrides (given as a map, never by changing the
//! process environment, since tests run in parallel) and each kind of mistake.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn env(pairs: &[(&str, &str)]) -> config::Map<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Settings from a TOML settings file `chime.toml` in `/etc/chime` with this text.
fn from_toml(text: &str, vars: &[(&str, &str)]) -> Result<Settings, ConfigErrors> {
    let root = SourceFormat::Toml
        .parse("chime.toml", text)
        .unwrap_or_else(|e| panic!("{e}"));
    resolve(
        Some(("chime.toml".to_owned(), root)),
        Some(Path::new("/etc/chime")),
        Some(env(vars)),
    )
}

fn toml_errors(text: &str, vars: &[(&str, &str)]) -> Vec<String> {
    match from_toml(text, vars) {
        Ok(settings) => panic!("expected errors, got {settings:#?}"),
        Err(errors) => errors.lines(),
    }
}

#[test]
fn defaults_point_at_the_local_services() {
    let settings = Settings::load_with_env(None, env(&[("PATH", "/bin")])).unwrap();
    assert_eq!(settings, Settings::default());
    assert_eq!(
        settings.database_url,
        "postgres://postgres@127.0.0.1:5432/chime"
    );
    assert_eq!(settings.amqp_url, "amqp://guest:guest@127.0.0.1:5672/%2f");
    assert_eq!(settings.instance_id, None);
    assert_eq!(settings.bind, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(settings.queue_prefix, "chime");
    assert!(settings.jobs.is_empty());
    assert_eq!(settings.leader.lease_ttl, Duration::from_secs(3));
    assert_eq!(settings.leader.renew_interval, Duration::from_secs(1));
    assert_eq!(settings.planner.lookahead, Duration::from_millis(500));
}

#[test]
fn settings_file_sets_every_key_and_resolves_job_paths_against_its_directory() {
    let path = fixture("settings.toml");
    let settings = Settings::load_with_env(Some(&path), env(&[])).unwrap();
    assert_eq!(
        settings,
        Settings {
            database_url: "postgres://chime@db.internal:5432/chime".into(),
            amqp_url: "amqp://chime@mq.internal:5672/%2f".into(),
            instance_id: Some("scheduler-1".into()),
            bind: "0.0.0.0:9000".parse().unwrap(),
            queue_prefix: "acme".into(),
            jobs: vec![fixture("jobs.d/*"), PathBuf::from("/etc/chime/extra.toml")],
            leader: LeaderSettings {
                lease_ttl: Duration::from_secs(6),
                renew_interval: Duration::from_secs(2),
            },
            planner: PlannerSettings {
                lookahead: Duration::from_millis(250),
            },
        }
    );
}

#[test]
fn yaml_settings_file_reads_like_toml() {
    let toml = Settings::load_with_env(Some(&fixture("settings.toml")), env(&[])).unwrap();
    let yaml = Settings::load_with_env(Some(&fixture("settings.yaml")), env(&[])).unwrap();
    assert_eq!(toml, yaml);
}

#[test]
fn environment_overrides_the_file() {
    let settings = Settings::load_with_env(
        Some(&fixture("settings.toml")),
        env(&[
            (
                "CHIME_DATABASE_URL",
                "postgres://chime:s3cret@db.prod:5432/chime",
            ),
            ("CHIME_INSTANCE_ID", "scheduler-7"),
            ("CHIME_LEADER__LEASE_TTL", "10s"),
            ("CHIME_PLANNER__LOOKAHEAD", "1s"),
            ("CHIME_JOBS", "jobs/a.toml, jobs/*.yaml"),
            // Not settings: the CLI's settings file variable and someone else's.
            ("CHIME_CONFIG", "/etc/chime/chime.toml"),
            ("CHIME_LOG_FORMAT", "json"),
            // Empty counts as unset: the file's value stays.
            ("CHIME_QUEUE_PREFIX", ""),
            ("DATABASE_URL", "postgres://ignored/other"),
        ]),
    )
    .unwrap();
    assert_eq!(
        settings.database_url,
        "postgres://chime:s3cret@db.prod:5432/chime"
    );
    assert_eq!(settings.instance_id.as_deref(), Some("scheduler-7"));
    assert_eq!(settings.leader.lease_ttl, Duration::from_secs(10));
    assert_eq!(
        settings.leader.renew_interval,
        Duration::from_secs(2),
        "from the file"
    );
    assert_eq!(settings.planner.lookahead, Duration::from_secs(1));
    // From the environment, relative paths stay relative to the working directory.
    assert_eq!(
        settings.jobs,
        [PathBuf::from("jobs/a.toml"), PathBuf::from("jobs/*.yaml")]
    );
    assert_eq!(
        settings.amqp_url, "amqp://chime@mq.internal:5672/%2f",
        "from the file"
    );
}

#[test]
fn settings_jobs_load_through_their_patterns() {
    let mut settings = Settings::load_with_env(Some(&fixture("settings.toml")), env(&[])).unwrap();
    settings.jobs.truncate(1); // keep "jobs.d/*"; /etc/chime/extra.toml does not exist here
    let names: Vec<String> = settings
        .load_jobs()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|job| job.name)
        .collect();
    assert_eq!(names, ["close-unpaid-orders", "weekday-report"]);
}

#[test]
fn unknown_keys_suggest_the_setting_meant() {
    let errors = toml_errors(
        r#"
        databse_url = "postgres://db/chime"
        lease_ttl = "5s"
        colour = "blue"

        [leader]
        renew_intreval = "1s"
        "#,
        &[],
    );
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "colour" = "blue": unknown key; remove it, or use one of the settings: database_url, amqp_url, instance_id, bind, queue_prefix, jobs, leader.lease_ttl, leader.renew_interval, planner.lookahead"#,
            r#"chime.toml: key "databse_url" = "postgres://db/chime": unknown key; did you mean "database_url"?"#,
            r#"chime.toml: key "leader.renew_intreval" = "1s": unknown key; did you mean "leader.renew_interval"?"#,
            r#"chime.toml: key "lease_ttl" = "5s": unknown key; did you mean "leader.lease_ttl"?"#,
        ]
    );
}

#[test]
fn a_section_must_be_a_table() {
    let errors = toml_errors("leader = \"3s\"\n", &[]);
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "leader" = "3s": expected a table ([leader] in TOML, "leader:" with indented keys in YAML)"#
        ]
    );
}

#[test]
fn job_tables_in_the_settings_file_are_pointed_to_a_job_file() {
    let errors = toml_errors("[[jobs]]\nname = \"a\"\ngroup = \"g\"\n", &[]);
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "jobs" = [{"group":"g","name":"a"}]: expected a list of job file paths or patterns; jobs themselves ([[jobs]] tables) belong in a job file whose path is listed here"#
        ]
    );
}

#[test]
fn misspelt_environment_variables_are_reported_and_others_left_alone() {
    let errors = toml_errors(
        "",
        &[
            ("CHIME_LEADER_LEASE_TTL", "5s"),
            ("CHIME_DATABSE_URL", "postgres://db/chime"),
            ("CHIME_CONFIG", "chime.toml"),
            ("CHIME_LOG", "debug"),
        ],
    );
    assert_eq!(
        errors,
        [
            "environment variable CHIME_DATABSE_URL: unknown setting; did you mean CHIME_DATABASE_URL?",
            "environment variable CHIME_LEADER_LEASE_TTL: unknown setting; did you mean CHIME_LEADER__LEASE_TTL? (two underscores between a section and its key)",
        ]
    );
}

#[test]
fn invalid_values_from_the_environment_name_the_variable() {
    let errors = toml_errors(
        "",
        &[
            ("CHIME_BIND", "localhost:8080"),
            ("CHIME_PLANNER__LOOKAHEAD", "fast"),
            ("CHIME_DATABASE_URL", "mysql://root:secret@db/chime"),
        ],
    );
    assert_eq!(
        errors,
        [
            r#"environment variable CHIME_DATABASE_URL = "mysql://root:***@db/chime": expected a URL starting with "postgres://" or "postgresql://", such as "postgres://postgres@127.0.0.1:5432/chime""#,
            r#"environment variable CHIME_BIND = "localhost:8080": expected an IP address and a port, such as "127.0.0.1:8080" or "0.0.0.0:8080" (a host name is not accepted)"#,
            r#"environment variable CHIME_PLANNER__LOOKAHEAD = "fast": invalid duration (expected a number at "fast"); write a number with a unit, such as "3s" or "500ms""#,
        ]
    );
}

#[test]
fn invalid_values_in_the_file_name_the_key() {
    let errors = toml_errors(
        r#"
        amqp_url = "http://mq:15672"
        instance_id = "scheduler one"
        bind = 8080
        queue_prefix = "Chime"

        [leader]
        lease_ttl = 3
        "#,
        &[],
    );
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "amqp_url" = "http://mq:15672": expected a URL starting with "amqp://" or "amqps://", such as "amqp://guest:guest@127.0.0.1:5672/%2f""#,
            r#"chime.toml: key "instance_id" = "scheduler one": expected 1 to 128 characters without spaces, such as "scheduler-1"; leave it unset for hostname-pid"#,
            r#"chime.toml: key "bind" = 8080: expected a string; quote it: "8080""#,
            r#"chime.toml: key "queue_prefix" = "Chime": invalid queue prefix: 'C' is not allowed; use 1 to 63 characters from a-z, 0-9, "_", "." and "-", starting with a letter or digit, such as "chime""#,
            r#"chime.toml: key "leader.lease_ttl" = 3: a duration needs a unit; write it as a string such as "3s""#,
        ]
    );
}

#[test]
fn renew_interval_must_be_shorter_than_the_lease() {
    // Only lease_ttl is set, so it is the one blamed.
    let errors = toml_errors("[leader]\nlease_ttl = \"1s\"\n", &[]);
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "leader.lease_ttl" = "1s": leader.renew_interval (1s) must be shorter than leader.lease_ttl (1s) so the leader renews its lease before it runs out; a third of lease_ttl is usual"#
        ]
    );
    let errors = toml_errors(
        "[leader]\nrenew_interval = \"2s\"\n",
        &[("CHIME_LEADER__LEASE_TTL", "2s")],
    );
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "leader.renew_interval" = "2s": leader.renew_interval (2s) must be shorter than leader.lease_ttl (2s) so the leader renews its lease before it runs out; a third of lease_ttl is usual"#
        ]
    );
    let errors = toml_errors("[leader]\nlease_ttl = \"0s\"\n", &[]);
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "leader.lease_ttl" = "0s": must be longer than 0s; write a duration such as "1s""#
        ]
    );
}

#[test]
fn missing_or_unsupported_settings_file() {
    let missing = fixture("nope.toml");
    let errors = Settings::load_with_env(Some(&missing), env(&[]))
        .unwrap_err()
        .lines();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with(&format!("{}: cannot read: ", missing.display())),
        "{}",
        errors[0]
    );
    let ini = fixture("chime.ini");
    let errors = Settings::load_with_env(Some(&ini), env(&[]))
        .unwrap_err()
        .lines();
    assert_eq!(
        errors,
        [format!(
            "{}: unsupported file type; a settings file ends in .toml, .yaml or .yml",
            ini.display()
        )]
    );
}

#[test]
fn debug_output_hides_passwords() {
    let settings = Settings {
        database_url: "postgres://chime:s3cret@db:5432/chime".into(),
        ..Settings::default()
    };
    let debug = format!("{settings:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert!(!debug.contains("guest:guest"), "{debug}");
    assert!(
        debug.contains("postgres://chime:***@db:5432/chime"),
        "{debug}"
    );
}

#[test]
fn redacted_urls() {
    let table = [
        (
            "postgres://postgres@127.0.0.1:5432/chime",
            "postgres://postgres@127.0.0.1:5432/chime",
        ),
        (
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            "amqp://guest:***@127.0.0.1:5672/%2f",
        ),
        ("postgres://u:p@ss@db/chime", "postgres://u:***@db/chime"),
        (
            "amqps://u:p@mq?heartbeat=10",
            "amqps://u:***@mq?heartbeat=10",
        ),
        ("postgres://db/a@b", "postgres://db/a@b"),
        ("not a url", "not a url"),
    ];
    for (url, want) in table {
        assert_eq!(redact_url(url), want, "{url}");
    }
}

#[test]
fn instance_id_defaults_to_host_and_pid() {
    let id = default_instance_id();
    let suffix = format!("-{}", std::process::id());
    assert!(id.ends_with(&suffix) && id.len() > suffix.len(), "{id}");
    let settings = Settings {
        instance_id: Some("scheduler-1".into()),
        ..Settings::default()
    };
    assert_eq!(settings.resolved_instance_id(), "scheduler-1");
    assert_eq!(Settings::default().resolved_instance_id(), id);
}
