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
            amqp_urls: Vec::new(),
            amqp_tls: AmqpTls::default(),
            management_url: Some("http://mq.internal:15672".into()),
            instance_id: Some("scheduler-1".into()),
            bind: "0.0.0.0:9000".parse().unwrap(),
            queue_prefix: "acme".into(),
            jobs: vec![fixture("jobs.d/*"), PathBuf::from("/etc/chime/extra.toml")],
            watch: true,
            leader: LeaderSettings {
                lease_ttl: Duration::from_secs(6),
                renew_interval: Duration::from_secs(2),
            },
            planner: PlannerSettings {
                lookahead: Duration::from_millis(250),
            },
            rescuer: RescuerSettings {
                interval: Duration::from_secs(2),
                rescue_after: Duration::from_secs(20),
                retry_slack: Duration::from_secs(90),
            },
            retention: RetentionSettings {
                max_age: Duration::from_secs(7 * 24 * 3600),
                interval: Duration::from_secs(30),
                batch_size: 500,
                audit_max_age: Duration::from_secs(730 * 24 * 3600),
            },
            alerts: AlertSettings {
                webhook: Some("https://hooks.example.com/services/T0/B0/secret".into()),
                format: AlertFormat::Slack,
                min_interval: Duration::from_secs(300),
                consecutive_failures: 5,
                groups: [
                    (
                        "billing".to_owned(),
                        GroupAlertSettings {
                            webhook: Some("http://alerts.internal:9000/billing".into()),
                            format: Some(AlertFormat::Generic),
                            min_interval: Some(Duration::from_secs(30)),
                            consecutive_failures: Some(1),
                        },
                    ),
                    (
                        "reports.eu".to_owned(),
                        GroupAlertSettings {
                            consecutive_failures: Some(0),
                            ..GroupAlertSettings::default()
                        },
                    ),
                ]
                .into_iter()
                .collect(),
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
            r#"chime.toml: key "colour" = "blue": unknown key; remove it, or use one of the settings: database_url, amqp_url, amqp_urls, amqp_tls.ca_file, amqp_tls.cert_file, amqp_tls.key_file, management_url, instance_id, bind, queue_prefix, jobs, watch, leader.lease_ttl, leader.renew_interval, planner.lookahead, rescuer.interval, rescuer.rescue_after, rescuer.retry_slack, alerts.webhook, alerts.format, alerts.min_interval, alerts.consecutive_failures, retention.max_age, retention.interval, retention.batch_size, retention.audit_max_age"#,
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
        management_url = "http://guest:guest@mq:15672"
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
            r#"chime.toml: key "management_url" = "http://guest:***@mq:15672": write the URL without credentials, such as "http://127.0.0.1:15672": the management API is used as amqp_url's user"#,
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

/// Issue 10: each of these printed the password, whole or in part.
#[test]
fn url_mistakes_never_show_the_password() {
    for (key, url) in [
        ("database_url", "postgres://u:secret@host:notaport/db"),
        ("database_url", "postgres://u:sec@ret@host:notaport/db"),
        ("database_url", "u:secret@host/db"),
        (
            "database_url",
            "postgres://u@host/db?password=secret&sslmode=bogus",
        ),
        ("amqp_url", "amqp://u:secret@host:notaport/%2f"),
        ("amqp_url", "u:secret@host/%2f"),
    ] {
        let errors = toml_errors(&format!("{key} = {url:?}\n"), &[]).join("\n");
        assert!(
            errors.starts_with(&format!("chime.toml: key \"{key}\" = ")),
            "{errors}"
        );
        assert!(
            !errors.contains("secret") && !errors.contains("ret@"),
            "{errors}"
        );
        let variable = if key == "database_url" {
            "CHIME_DATABASE_URL"
        } else {
            "CHIME_AMQP_URL"
        };
        let errors = toml_errors("", &[(variable, url)]).join("\n");
        assert!(errors.contains(variable), "{errors}");
        assert!(!errors.contains("secret"), "{errors}");
    }
    let errors = toml_errors(
        "database_url = \"postgres://u:secret@host:notaport/db\"\n",
        &[],
    );
    assert_eq!(
        errors,
        [
            "chime.toml: key \"database_url\" = \"postgres://u:***@host:notaport/db\": not a \
             valid PostgreSQL URL (error with configuration: invalid port number); write it like \
             \"postgres://postgres@127.0.0.1:5432/chime\""
        ]
    );
}

fn tls_fixture() -> PathBuf {
    fixture("tls/ca.pem")
}

#[test]
fn amqp_tls_paths_resolve_against_the_settings_file_and_come_from_the_environment() {
    let root = SourceFormat::Toml
        .parse(
            "chime.toml",
            "amqp_url = \"amqps://mq.internal:5671/%2f\"\n[amqp_tls]\nca_file = \"tls/ca.pem\"\n",
        )
        .unwrap();
    let settings = resolve(
        Some(("chime.toml".to_owned(), root)),
        Some(&fixture("")),
        Some(env(&[])),
    )
    .unwrap();
    assert_eq!(settings.amqp_tls, AmqpTls::new().ca_file(tls_fixture()));

    let ca = tls_fixture().display().to_string();
    let settings = Settings::load_with_env(
        None,
        env(&[
            ("CHIME_AMQP_URL", "amqps://mq.internal:5671/%2f"),
            ("CHIME_AMQP_TLS__CA_FILE", &ca),
        ]),
    )
    .unwrap();
    assert_eq!(settings.amqp_tls.ca_file, Some(tls_fixture()));
    let debug = format!("{settings:?}");
    assert!(debug.contains("ca.pem"), "{debug}");
}

#[test]
fn amqp_tls_mistakes_name_the_setting() {
    let ca = tls_fixture().display().to_string();
    let amqps = ("CHIME_AMQP_URL", "amqps://u:secret@mq:5671/%2f");
    // TLS options with a plaintext URL.
    let errors = toml_errors(&format!("[amqp_tls]\nca_file = {ca:?}\n"), &[]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("chime.toml: key \"amqp_tls.ca_file\" = ")
            && errors[0].contains("write it as amqps://"),
        "{errors:?}"
    );
    // A missing file, from the environment.
    let errors = toml_errors(
        "",
        &[amqps, ("CHIME_AMQP_TLS__CA_FILE", "/nonexistent/ca.pem")],
    );
    assert_eq!(
        errors,
        [
            "environment variable CHIME_AMQP_TLS__CA_FILE = \"/nonexistent/ca.pem\": cannot read \
          the file (No such file or directory (os error 2)); give the path of a readable PEM file"
        ]
    );
    // A file that is no certificate: the settings file itself.
    let not_pem = fixture("settings.toml").display().to_string();
    let errors = toml_errors(&format!("[amqp_tls]\nca_file = {not_pem:?}\n"), &[amqps]);
    assert!(
        errors.len() == 1
            && errors[0].contains("amqp_tls.ca_file")
            && errors[0].contains("holds no certificate"),
        "{errors:?}"
    );
    // A certificate without its key.
    let errors = toml_errors(&format!("[amqp_tls]\ncert_file = {ca:?}\n"), &[amqps]);
    assert_eq!(
        errors,
        ["chime.toml: key \"amqp_tls.cert_file\" = ".to_owned()
            + &format!("{ca:?}")
            + ": is set without amqp_tls.key_file: a client certificate needs both its \
               certificate and its key; set amqp_tls.key_file, or remove amqp_tls.cert_file"]
    );
    // A misspelt key and a misspelt variable.
    let errors = toml_errors("[amqp_tls]\nca_flie = \"ca.pem\"\n", &[amqps]);
    assert!(
        errors[0].contains("did you mean \"amqp_tls.ca_file\"?"),
        "{errors:?}"
    );
    let errors = toml_errors("", &[amqps, ("CHIME_AMQP_TLS_CA_FILE", &ca)]);
    assert!(
        errors[0].contains("did you mean CHIME_AMQP_TLS__CA_FILE?"),
        "{errors:?}"
    );
    // A database URL naming a root certificate that is not there.
    let errors = toml_errors(
        "database_url = \"postgres://db/chime?sslmode=verify-full&sslrootcert=/nonexistent/root.pem\"\n",
        &[],
    );
    assert!(
        errors.len() == 1
            && errors[0].contains(
                "database_url sslrootcert = \"/nonexistent/root.pem\": cannot read the file"
            ),
        "{errors:?}"
    );
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

#[test]
fn rescuer_and_alert_defaults() {
    let settings = Settings::default();
    assert_eq!(settings.rescuer.interval, Duration::from_secs(5));
    assert_eq!(settings.rescuer.rescue_after, Duration::from_secs(30));
    assert_eq!(settings.rescuer.retry_slack, Duration::from_secs(60));
    assert_eq!(settings.alerts.webhook, None);
    assert_eq!(settings.alerts.format, AlertFormat::Generic);
    assert_eq!(settings.alerts.min_interval, Duration::from_secs(60));
    assert_eq!(settings.alerts.consecutive_failures, 3);
    assert!(settings.alerts.groups.is_empty());
    assert!(!settings.alerts.any_webhook());
}

#[test]
fn alert_settings_come_from_the_environment_too() {
    let settings = from_toml(
        "",
        &[
            (
                "CHIME_ALERTS__WEBHOOK",
                "https://hooks.slack.com/services/T/B/x",
            ),
            ("CHIME_ALERTS__FORMAT", "slack"),
            ("CHIME_ALERTS__CONSECUTIVE_FAILURES", "4"),
            (
                "CHIME_ALERTS__GROUPS__ORDERS__WEBHOOK",
                "http://127.0.0.1:9/orders",
            ),
            ("CHIME_RESCUER__RESCUE_AFTER", "45s"),
        ],
    )
    .unwrap();
    assert_eq!(
        settings.alerts.webhook.as_deref(),
        Some("https://hooks.slack.com/services/T/B/x")
    );
    assert_eq!(settings.alerts.format, AlertFormat::Slack);
    assert_eq!(settings.alerts.consecutive_failures, 4);
    assert_eq!(
        settings.alerts.groups["orders"].webhook.as_deref(),
        Some("http://127.0.0.1:9/orders")
    );
    assert_eq!(settings.rescuer.rescue_after, Duration::from_secs(45));
    let debug = format!("{settings:?}");
    assert!(!debug.contains("T/B/x"), "webhook secrets leak: {debug}");
    assert!(debug.contains("https://hooks.slack.com/***"), "{debug}");
}

#[test]
fn alert_and_rescuer_mistakes_name_the_key() {
    let errors = toml_errors(
        r#"
        [rescuer]
        interval = "0s"
        rescue_after = 30

        [alerts]
        webhook = "hooks.example.com/x"
        format = "teams"
        consecutive_failures = -1

        [alerts.groups.billing]
        webhok = "https://x.example.com"

        [alerts.groups.Orders]
        webhook = "https://x.example.com"
        "#,
        &[],
    );
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "rescuer.interval" = "0s": must be longer than 0s; write a duration such as "5s""#,
            r#"chime.toml: key "rescuer.rescue_after" = 30: a duration needs a unit; write it as a string such as "30s""#,
            r#"chime.toml: key "alerts.webhook" = "***": expected an http:// or https:// URL, such as "https://hooks.slack.com/services/…""#,
            r#"chime.toml: key "alerts.format" = "teams": unknown alert format; use "generic" or "slack""#,
            r#"chime.toml: key "alerts.consecutive_failures" = -1: expected a whole number from 0 to 4294967295, such as 3"#,
            r#"chime.toml: key "alerts.groups.billing.webhok" = "https://x.example.com": unknown key; did you mean "alerts.groups.billing.webhook"?"#,
            r#"chime.toml: key "alerts.groups.Orders": invalid group name: 'O' is not allowed; use the executor group's name"#,
        ]
    );
}

#[test]
fn webhook_targets_hide_paths_and_credentials() {
    assert_eq!(
        webhook_target("https://hooks.slack.com/services/T0/B0/secret"),
        "https://hooks.slack.com/***"
    );
    assert_eq!(
        webhook_target("http://user:pw@127.0.0.1:8080"),
        "http://127.0.0.1:8080"
    );
    assert_eq!(webhook_target("nonsense"), "***");
}

#[test]
fn a_misspelt_group_alert_variable_is_reported() {
    let errors = toml_errors("", &[("CHIME_ALERTS__GROUPS__ORDERS__WEBHOK", "http://x")]);
    assert_eq!(
        errors,
        [
            "environment variable CHIME_ALERTS__GROUPS__ORDERS__WEBHOK: unknown setting; a group's alert settings are CHIME_ALERTS__GROUPS__<GROUP>__ followed by one of WEBHOOK, FORMAT, MIN_INTERVAL, CONSECUTIVE_FAILURES"
        ]
    );
}

#[test]
fn retention_mistakes_name_the_key() {
    let errors = toml_errors(
        r#"
        [retention]
        max_age = "500ms"
        interval = "1 minute please"
        batch_size = 0
        audit_max_age = "0s"
        "#,
        &[],
    );
    assert_eq!(
        errors,
        [
            r#"chime.toml: key "retention.max_age" = "500ms": must be at least 1s; write a duration such as "30days" or "1m""#,
            r#"chime.toml: key "retention.interval" = "1 minute please": invalid duration (expected a number at "please"); write a number with a unit, such as "3s" or "500ms""#,
            r#"chime.toml: key "retention.audit_max_age" = "0s": must be at least 1s; write a duration such as "30days" or "1m""#,
            r#"chime.toml: key "retention.batch_size" = 0: must be at least 1; a batch of 1000 is usual"#,
        ]
    );
    let defaults = Settings::default().retention;
    assert_eq!(defaults.max_age, Duration::from_secs(30 * 24 * 3600));
    assert_eq!(defaults.batch_size, 1000);
    assert_eq!(defaults.audit_max_age, Duration::from_secs(400 * 24 * 3600));
}

/// A directory of secret files, deleted with it.
fn secret_files(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write a secret file");
    }
    dir
}

fn path_in(dir: &tempfile::TempDir, name: &str) -> String {
    dir.path().join(name).to_str().expect("utf-8").to_owned()
}

#[test]
fn urls_and_webhooks_come_from_files_named_by_file_variables() {
    let dir = secret_files(&[
        ("db", "postgres://chime:s3cret@db.prod:5432/chime\n"),
        ("mq", "amqps://chime:s3cret@mq.prod:5671/%2f\r\n"),
        ("hook", "https://hooks.slack.com/services/T/B/x"),
        ("orders-hook", "https://alerts.internal/orders\n"),
    ]);
    let settings = from_toml(
        "[alerts.groups.orders]\nformat = \"slack\"\n",
        &[
            ("CHIME_DATABASE_URL_FILE", &path_in(&dir, "db")),
            ("CHIME_AMQP_URL_FILE", &path_in(&dir, "mq")),
            ("CHIME_ALERTS__WEBHOOK_FILE", &path_in(&dir, "hook")),
            (
                "CHIME_ALERTS__GROUPS__ORDERS__WEBHOOK_FILE",
                &path_in(&dir, "orders-hook"),
            ),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        settings.database_url,
        "postgres://chime:s3cret@db.prod:5432/chime"
    );
    assert_eq!(settings.amqp_url, "amqps://chime:s3cret@mq.prod:5671/%2f");
    assert_eq!(
        settings.alerts.webhook.as_deref(),
        Some("https://hooks.slack.com/services/T/B/x")
    );
    assert_eq!(
        settings.alerts.groups["orders"].webhook.as_deref(),
        Some("https://alerts.internal/orders")
    );
}

#[test]
fn a_bad_secret_file_or_a_value_given_twice_names_the_variable_and_the_fix() {
    let dir = secret_files(&[
        ("db", "postgres://chime:s3cret@db.prod:5432/chime\n"),
        ("empty", "\n"),
        ("mysql", "mysql://root:hunter2@db/chime\n"),
        (
            "big",
            &"x".repeat(
                usize::try_from(chime_protocol::limits::MAX_SECRET_FILE_BYTES).unwrap() + 1,
            ),
        ),
    ]);
    let missing = path_in(&dir, "missing");
    let errors = toml_errors(
        "",
        &[
            ("CHIME_DATABASE_URL", "postgres://chime@db.prod/chime"),
            ("CHIME_DATABASE_URL_FILE", &path_in(&dir, "db")),
            ("CHIME_AMQP_URL_FILE", &missing),
            ("CHIME_MANAGEMENT_URL_FILE", &path_in(&dir, "empty")),
            ("CHIME_ALERTS__WEBHOOK_FILE", &path_in(&dir, "big")),
            ("CHIME_BIND_FILE", "/run/secrets/bind"),
        ],
    );
    let expected = [
        "environment variable CHIME_ALERTS__WEBHOOK_FILE = \"BIG\": the file has 65537 bytes, more than 65536; a secret file holds one value".replace("BIG", &path_in(&dir, "big")),
        format!("environment variable CHIME_AMQP_URL_FILE = {missing:?}: cannot read the file (No such file or directory (os error 2)); give the path of a readable file holding the value"),
        "environment variable CHIME_BIND_FILE = \"/run/secrets/bind\": bind cannot come from a file (only database_url, amqp_url, amqp_urls, management_url, alerts.webhook and a group's webhook can); set CHIME_BIND itself".to_owned(),
        "environment variable CHIME_DATABASE_URL_FILE: CHIME_DATABASE_URL is set too; give the value one way, the variable or the file".to_owned(),
        format!("environment variable CHIME_MANAGEMENT_URL_FILE = {:?}: the file is empty; write the value into it", path_in(&dir, "empty")),
    ];
    assert_eq!(errors, expected);

    // A bad value read from a file is reported at the file variable, its password hidden.
    let errors = toml_errors("", &[("CHIME_DATABASE_URL_FILE", &path_in(&dir, "mysql"))]);
    let [error] = errors.as_slice() else {
        panic!("{errors:?}")
    };
    assert!(
        error.starts_with(&format!(
            "environment variable CHIME_DATABASE_URL_FILE (file {:?}) = \"mysql://root:***@db/chime\": expected a URL starting with",
            path_in(&dir, "mysql")
        )),
        "{error}"
    );
    assert!(!error.contains("hunter2"), "{error}");
}

#[test]
fn watch_is_a_boolean_in_the_file_and_true_or_false_in_the_environment() {
    assert!(!from_toml("", &[]).unwrap().watch);
    assert!(from_toml("watch = true", &[]).unwrap().watch);
    assert!(from_toml("", &[("CHIME_WATCH", "true")]).unwrap().watch);
    assert!(
        !from_toml("watch = true", &[("CHIME_WATCH", "false")])
            .unwrap()
            .watch,
        "the environment wins"
    );
    assert_eq!(
        toml_errors("watch = \"yes\"", &[]),
        [r#"chime.toml: key "watch" = "yes": expected true or false (unquoted in a file)"#]
    );
    assert_eq!(
        toml_errors("", &[("CHIME_WATCH", "on")]),
        [r#"environment variable CHIME_WATCH = "on": expected true or false (unquoted in a file)"#]
    );
}

#[test]
fn amqp_urls_is_a_list_in_the_file_and_comma_separated_in_the_environment() {
    let defaults = Settings::default();
    assert_eq!(defaults.amqp_addresses().urls(), [DEFAULT_AMQP_URL]);

    let settings = from_toml(
        "amqp_urls = [\"amqp://chime:pw@mq-1:5672/%2f\", \"amqp://chime:pw@mq-2:5672/%2f\"]\n",
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        settings.amqp_addresses().urls(),
        [
            "amqp://chime:pw@mq-1:5672/%2f",
            "amqp://chime:pw@mq-2:5672/%2f"
        ]
    );
    // amqp_url is the list's first, for what needs one address (the management API's user).
    assert_eq!(settings.amqp_url, "amqp://chime:pw@mq-1:5672/%2f");
    assert!(!format!("{settings:?}").contains(":pw@"), "{settings:?}");

    let settings = from_toml(
        "",
        &[(
            "CHIME_AMQP_URLS",
            " amqp://a:pw@mq-1:5672/%2f, amqp://a:pw@mq-2:5672/%2f ,amqp://a:pw@mq-3:5672/%2f",
        )],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        settings.amqp_addresses().urls(),
        [
            "amqp://a:pw@mq-1:5672/%2f",
            "amqp://a:pw@mq-2:5672/%2f",
            "amqp://a:pw@mq-3:5672/%2f"
        ]
    );

    // From a secret file: one address a line (or comma-separated).
    let dir = secret_files(&[(
        "mq",
        "amqp://a:pw@mq-1:5672/%2f\namqp://a:pw@mq-2:5672/%2f\n",
    )]);
    let settings = from_toml("", &[("CHIME_AMQP_URLS_FILE", &path_in(&dir, "mq"))])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        settings.amqp_addresses().urls(),
        ["amqp://a:pw@mq-1:5672/%2f", "amqp://a:pw@mq-2:5672/%2f"]
    );
}

#[test]
fn amqp_url_and_amqp_urls_together_are_refused_naming_both() {
    let errors = toml_errors(
        "amqp_url = \"amqp://a:pw@mq-1:5672/%2f\"\namqp_urls = [\"amqp://a:pw@mq-2:5672/%2f\"]\n",
        &[],
    );
    assert_eq!(
        errors,
        [
            "chime.toml: key \"amqp_urls\" = [\"amqp://a:***@mq-2:5672/%2f\"]: amqp_url in chime.toml is set too; give one address as amqp_url or several as amqp_urls, not both (put the amqp_url address into the list and remove amqp_url)"
        ]
    );
    let errors = toml_errors(
        "",
        &[
            ("CHIME_AMQP_URL", "amqp://a:pw@mq-1:5672/%2f"),
            ("CHIME_AMQP_URLS", "amqp://a:pw@mq-2:5672/%2f"),
        ],
    );
    assert_eq!(
        errors,
        [
            "environment variable CHIME_AMQP_URLS = [\"amqp://a:***@mq-2:5672/%2f\"]: CHIME_AMQP_URL is set too; give one address as amqp_url or several as amqp_urls, not both (put the amqp_url address into the list and remove amqp_url)"
        ]
    );
}

#[test]
fn amqp_urls_are_bounded_and_each_checked_as_amqp_url() {
    let max = chime_protocol::addresses::MAX_AMQP_URLS;
    let list = |n: usize| {
        (1..=n)
            .map(|i| format!("amqp://a:pw@mq-{i}:5672/%2f"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let settings =
        from_toml("", &[("CHIME_AMQP_URLS", &list(max))]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(settings.amqp_addresses().urls().len(), max);
    let errors = toml_errors("", &[("CHIME_AMQP_URLS", &list(max + 1))]);
    let [error] = errors.as_slice() else {
        panic!("{errors:?}")
    };
    assert!(
        error.starts_with("environment variable CHIME_AMQP_URLS = [\"amqp://a:***@mq-1:5672/%2f\""),
        "{error}"
    );
    assert!(
        error.ends_with(&format!(
            "{} broker addresses; the limit is {max} (list a few nodes of the cluster, or one load balancer)",
            max + 1
        )),
        "{error}"
    );
    assert!(!error.contains(":pw@"), "{error}");

    let errors = toml_errors("amqp_urls = []\n", &[]);
    assert_eq!(
        errors,
        [
            "chime.toml: key \"amqp_urls\" = []: the list of broker addresses is empty; give at least one amqp:// or amqps:// URL"
        ]
    );
    let errors = toml_errors(
        "amqp_urls = [\"amqp://a:pw@mq-1:5672/%2f\", \"http://a:pw@mq-2:15672\", \"amqp://a:pw@mq-3:notaport/%2f\"]\n",
        &[],
    );
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].starts_with("chime.toml: key \"amqp_urls\" = \"http://a:***@mq-2:15672\": address 2 of 3: expected a URL starting with \"amqp://\" or \"amqps://\""),
        "{errors:?}"
    );
    assert!(
        errors[1].starts_with("chime.toml: key \"amqp_urls\" = \"amqp://a:***@mq-3:notaport/%2f\": address 3 of 3: not a valid AMQP URL"),
        "{errors:?}"
    );
    let errors = toml_errors("amqp_urls = \"amqp://a:pw@mq-1:5672/%2f\"\n", &[]);
    assert_eq!(
        errors,
        [
            "chime.toml: key \"amqp_urls\" = \"amqp://a:***@mq-1:5672/%2f\": expected a list of URLs, such as [\"amqp://guest:guest@127.0.0.1:5672/%2f\"] (one address: amqp_url)"
        ]
    );
    // TLS settings apply to every address: an amqp:// one among amqps:// ones is refused.
    let errors = toml_errors(
        &format!(
            "amqp_urls = [\"amqps://mq-1:5671/%2f\", \"amqp://mq-2:5672/%2f\"]\n[amqp_tls]\nca_file = {:?}\n",
            tls_fixture()
        ),
        &[],
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("amqp://mq-2:5672/%2f"), "{errors:?}");
}
