//! The conformance suite (`chime-conformance`, docs/conformance.md) against the Rust SDK's
//! conformance worker (`tests/bin/chime_conformance_worker.rs`) and `chime-runner`: every
//! scenario passes. (The Python SDK's run is in `sdks/python/ci.sh`.)

use std::time::Duration;

use serde_json::Value;

/// The whole suite takes well under a minute on an idle two-core machine.
const SUITE_TIMEOUT: Duration = Duration::from_secs(300);

#[tokio::test]
async fn the_rust_sdk_passes_every_conformance_scenario() {
    let worker = env!("CARGO_BIN_EXE_chime-conformance-worker");
    passes_every_scenario("rust", &quoted(worker)).await;
}

/// `chime-runner` under the suite through tests/conformance/runner-worker.sh (the wrapper of
/// docs/conformance.md), with the runner `cargo test --workspace` builds next to this test.
#[tokio::test]
async fn chime_runner_passes_every_conformance_scenario() {
    let runner = chime_e2e::process::sibling_binary("chime-runner").expect("chime-runner is built");
    let wrapper = concat!(env!("CARGO_MANIFEST_DIR"), "/conformance/runner-worker.sh");
    let command = format!(
        "env CHIME_RUNNER={} {}",
        quoted(&runner.to_string_lossy()),
        quoted(wrapper)
    );
    passes_every_scenario("runner", &command).await;
}

/// `text` quoted for `sh`.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Runs the whole suite against the worker `command` starts, as a role granted only its group,
/// and asserts that every scenario passed.
async fn passes_every_scenario(name: &str, command: &str) {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime-conformance"))
        // Two at once: each scenario holds about 12 PostgreSQL connections at its peak, and the
        // other end-to-end tests share the server's 100.
        .args([
            "--name",
            name,
            "--json",
            "--parallel",
            "2",
            "--worker",
            command,
        ])
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SUITE_TIMEOUT, run)
        .await
        .expect("the suite finishes in time")
        .expect("chime-conformance runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("a JSON report ({e}); stdout: {stdout}; stderr: {stderr}"));
    let scenarios = report["scenarios"].as_array().expect("scenarios");
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["scenario"].as_str().expect("name"))
        .collect();
    assert_eq!(names.len(), 15, "{names:?}");
    assert_eq!(
        report["least_privilege"], true,
        "the workers ran as a role granted only their group"
    );
    let unexpected: Vec<&Value> = scenarios.iter().filter(|s| s["result"] != "pass").collect();
    assert!(
        unexpected.is_empty(),
        "{name}: scenarios that did not pass: {unexpected:#?}\nstderr: {stderr}"
    );
    assert!(output.status.success(), "exit status {}", output.status);
    assert_eq!(report["passed"], true);
    let logs = path_after(&stderr, "worker logs in ");
    assert!(
        !logs.exists(),
        "a passing run deletes its temporary log directory {}",
        logs.display()
    );
}

/// The path printed after `marker` on a line of `stderr`.
fn path_after(stderr: &str, marker: &str) -> std::path::PathBuf {
    stderr
        .lines()
        .find_map(|line| line.split_once(marker).map(|(_, path)| path.trim().into()))
        .unwrap_or_else(|| panic!("no {marker:?} in stderr: {stderr}"))
}

/// The suite fails a worker that does not work: one that exits at once fails every scenario it
/// is started for, and the exit status says so.
#[tokio::test]
async fn a_worker_that_exits_at_once_fails_and_the_exit_status_says_so() {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime-conformance"))
        .args([
            "--name",
            "broken",
            "--only",
            "runs-a-job,heartbeat",
            "--worker",
            "true",
        ])
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SUITE_TIMEOUT, run)
        .await
        .expect("the suite finishes in time")
        .expect("chime-conformance runs");
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{table}");
    assert!(table.contains("0 passed, 2 failed, 0 skipped"), "{table}");
    for scenario in ["runs-a-job", "heartbeat"] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {scenario} |")))
            .unwrap_or_else(|| panic!("a row for {scenario}: {table}"));
        assert!(row.contains("| FAIL |") && row.contains("exited"), "{row}");
    }
    // A failing run keeps the workers' logs, and says where.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let kept = path_after(&stderr, "worker logs kept in ");
    assert!(kept.is_dir(), "kept {}", kept.display());
    std::fs::remove_dir_all(&kept).expect("removing the kept logs");
}
