//! The scheduler's deployment files as an operator installs them (`deploy/systemd/`): the unit
//! starts a command line `chime` accepts, reloads the job files with SIGHUP and stops with the
//! graceful SIGTERM; the example settings file and environment file load without an error,
//! name only settings that exist, and give the values the unit's comments promise.

use std::path::PathBuf;

use chime_scheduler::cli::{Cli, Command};
use chime_scheduler::config::{SETTINGS_KEYS, Settings};
use chime_test_kit::{Unit, deploy_path, env_file};
use clap::Parser;

/// `CHIME_*` variables the command line reads itself (not settings).
const CLI_VARIABLES: &[&str] = &["CHIME_CONFIG", "CHIME_LOG_FORMAT", "CHIME_ACTOR"];
/// Where the example environment file says the CA certificate is installed.
const INSTALLED_CA: &str = "/etc/chime/tls/ca.pem";

#[test]
fn the_scheduler_unit_runs_chime_scheduler_reloads_with_sighup_and_stops_gracefully() {
    let unit = Unit::read("systemd/chime-scheduler.service");
    let argv = unit.argv("Service", "ExecStart");
    assert_eq!(argv[0], "/usr/local/bin/chime", "{argv:?}");
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("chime refuses {argv:?}: {e}"));
    assert!(
        matches!(cli.command, Command::Scheduler { .. }),
        "ExecStart must run `chime scheduler`: {argv:?}"
    );
    assert_eq!(cli.config, Some(PathBuf::from("/etc/chime/chime.toml")));
    // SIGHUP is the scheduler's reload (service::run); SIGTERM its graceful hand-over.
    assert_eq!(
        unit.value("Service", "ExecReload"),
        "/bin/kill -HUP $MAINPID"
    );
    assert_eq!(unit.value("Service", "KillSignal"), "SIGTERM");
    assert_eq!(
        unit.value("Service", "EnvironmentFile"),
        "/etc/chime/chime.env"
    );
    assert_eq!(unit.value("Service", "Restart"), "on-failure");
    assert_eq!(unit.value("Install", "WantedBy"), "multi-user.target");
}

#[test]
fn the_example_settings_and_environment_load_and_name_only_known_settings() {
    let env = env_file("systemd/chime.env");
    let known: Vec<String> = SETTINGS_KEYS
        .iter()
        .map(|key| format!("CHIME_{}", key.replace('.', "__").to_uppercase()))
        .collect();
    for (name, _) in &env {
        assert!(
            known.contains(name) || CLI_VARIABLES.contains(&name.as_str()),
            "deploy/systemd/chime.env sets {name}, which is no setting (known: {known:?})"
        );
    }
    // The certificate paths are checked for a readable PEM file: a test CA stands in for the
    // installed one.
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls/ca.pem");
    let env: Vec<(String, String)> = env
        .into_iter()
        .map(|(name, value)| (name, value.replace(INSTALLED_CA, ca)))
        .collect();
    let file = deploy_path("systemd/chime.toml");
    let settings = Settings::load_with_env(Some(&file), env.clone())
        .unwrap_or_else(|e| panic!("the example settings do not load:\n{e}"));
    let var = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("chime.env sets no {name}"))
    };
    assert_eq!(settings.database_url, var("CHIME_DATABASE_URL"));
    assert_eq!(settings.amqp_url, var("CHIME_AMQP_URL"));
    assert_eq!(settings.bind.to_string(), "0.0.0.0:8080");
    assert_eq!(
        settings.jobs,
        [
            PathBuf::from("/etc/chime/jobs/*.toml"),
            PathBuf::from("/etc/chime/jobs/*.yaml")
        ]
    );
}
