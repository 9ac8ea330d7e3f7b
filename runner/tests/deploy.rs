//! chime-runner's deployment files as an operator installs them (`deploy/systemd/`): the unit
//! checks the config before it starts, starts the command line the binary accepts (run here with
//! the example config), stops with SIGTERM and waits longer than the default drain and kill
//! grace; its environment file sets only the variables a worker reads.

use std::process::Command;
use std::time::Duration;

use chime_runner::config::limits::DEFAULT_KILL_GRACE;
use chime_test_kit::{Unit, env_file};
use chime_worker::{
    DEFAULT_DRAIN_TIMEOUT, ENV_AMQP_URL, ENV_DATABASE_URL, ENV_QUEUE_PREFIX, ENV_WORKER_ID,
};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/runner.toml");
/// Where the unit reads its config: the example stands in for it here.
const INSTALLED: &str = "/etc/chime/runner.toml";

#[test]
fn the_runner_unit_checks_then_runs_a_command_line_the_runner_accepts() {
    let unit = Unit::read("systemd/chime-runner.service");
    let start = unit.argv("Service", "ExecStart");
    assert_eq!(
        start,
        ["/usr/local/bin/chime-runner", "--config", INSTALLED]
    );
    let check = unit.argv("Service", "ExecStartPre");
    assert_eq!(check, [start.as_slice(), &["--check".to_owned()]].concat());
    let args: Vec<&str> = check[1..]
        .iter()
        .map(|a| if a == INSTALLED { EXAMPLE } else { a.as_str() })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_chime-runner"))
        .args(&args)
        .env("BILLING_TOKEN", "example-token")
        .output()
        .expect("the chime-runner binary runs");
    assert!(
        out.status.success(),
        "chime-runner {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(unit.value("Service", "KillSignal"), "SIGTERM");
    // systemd's SIGKILL of the whole unit must come after the runner's own drain and kill grace.
    let stop = unit.value("Service", "TimeoutStopSec");
    let stop = Duration::from_secs(stop.parse().expect("TimeoutStopSec in seconds"));
    assert!(
        stop > DEFAULT_DRAIN_TIMEOUT + DEFAULT_KILL_GRACE,
        "TimeoutStopSec {stop:?} must exceed drain_timeout {DEFAULT_DRAIN_TIMEOUT:?} + kill_grace {DEFAULT_KILL_GRACE:?}"
    );
    assert_eq!(unit.value("Service", "KillMode"), "mixed");
    assert_eq!(
        unit.value("Service", "EnvironmentFile"),
        "/etc/chime/runner.env"
    );
}

#[test]
fn the_runner_environment_file_sets_only_what_a_worker_reads() {
    let read = [
        ENV_DATABASE_URL,
        ENV_AMQP_URL,
        ENV_QUEUE_PREFIX,
        ENV_WORKER_ID,
        "CHIME_RUNNER_CONFIG",
    ];
    let env = env_file("systemd/runner.env");
    assert!(!env.is_empty());
    for (name, value) in &env {
        assert!(
            read.contains(&name.as_str()),
            "runner.env sets {name}, which nothing reads (read: {read:?})"
        );
        assert!(!value.is_empty(), "runner.env sets {name} empty");
    }
}

#[test]
fn the_compose_runner_config_passes_check_and_serves_the_compose_job() {
    let config = chime_test_kit::deploy_path("docker/runner.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_chime-runner"))
        .arg("--config")
        .arg(&config)
        .arg("--check")
        .output()
        .expect("the chime-runner binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("job \"disk-usage\" -> shell handler"),
        "{stdout}"
    );
    // The scheduler's job file declares that job in the runner's group, and compose mounts the
    // config where the runner's command reads it.
    let jobs = std::fs::read_to_string(chime_test_kit::deploy_path("docker/jobs.toml"))
        .expect("deploy/docker/jobs.toml");
    assert!(
        jobs.contains("name = \"disk-usage\"\ngroup = \"ops\""),
        "{jobs}"
    );
    let compose = std::fs::read_to_string(chime_test_kit::deploy_path("compose.yaml"))
        .expect("deploy/compose.yaml");
    assert!(
        compose.contains("command: [\"chime-runner\", \"--config\", \"/etc/chime/runner.toml\"]")
    );
    assert!(compose.contains("- ./docker/runner.toml:/etc/chime/runner.toml:ro"));
}

#[test]
fn the_kubernetes_runner_passes_check_and_outlasts_its_drain() {
    let config = chime_test_kit::deploy_path("kubernetes/base/runner.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_chime-runner"))
        .arg("--config")
        .arg(&config)
        .arg("--check")
        .output()
        .expect("the chime-runner binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest =
        std::fs::read_to_string(chime_test_kit::deploy_path("kubernetes/base/runner.yaml"))
            .expect("deploy/kubernetes/base/runner.yaml");
    // The ConfigMap `chime-runner` (its file runner.toml) is mounted where the args read it.
    assert!(
        manifest
            .contains("args: [\"chime-runner\", \"--config\", \"/etc/chime/runner/runner.toml\"]")
    );
    assert!(manifest.contains("mountPath: /etc/chime/runner\n"));
    assert!(manifest.contains("name: chime-runner\n"));
    let grace: u64 = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds: "))
        .expect("terminationGracePeriodSeconds")
        .parse()
        .expect("seconds");
    assert!(Duration::from_secs(grace) > DEFAULT_DRAIN_TIMEOUT + DEFAULT_KILL_GRACE);
    let read = [
        ENV_DATABASE_URL,
        ENV_AMQP_URL,
        ENV_QUEUE_PREFIX,
        ENV_WORKER_ID,
    ];
    for name in manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- name: CHIME_"))
    {
        let name = format!("CHIME_{name}");
        assert!(
            read.contains(&name.as_str()),
            "runner.yaml sets {name}, which nothing reads"
        );
    }
}
