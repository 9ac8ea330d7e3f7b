//! The conformance suite (`chime-conformance`, docs/conformance.md) against the Rust SDK's
//! conformance worker (`tests/bin/chime_conformance_worker.rs`): every scenario passes (the
//! least-privilege one may be skipped when the schema cannot grant a worker role).

use std::time::Duration;

use serde_json::Value;

/// The whole suite takes well under a minute on an idle two-core machine.
const SUITE_TIMEOUT: Duration = Duration::from_secs(300);

#[tokio::test]
async fn the_rust_sdk_passes_every_conformance_scenario() {
    let worker = env!("CARGO_BIN_EXE_chime-conformance-worker");
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime-conformance"))
        // Two at once: each scenario holds about 12 PostgreSQL connections at its peak, and the
        // other end-to-end tests share the server's 100.
        .args(["--name", "rust", "--json", "--parallel", "2", "--worker"])
        .arg(format!("'{}'", worker.replace('\'', r"'\''")))
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
    let privileged = report["least_privilege"]
        .as_bool()
        .expect("least_privilege");
    let unexpected: Vec<&Value> = scenarios
        .iter()
        .filter(|s| {
            let allowed_skip = !privileged && s["scenario"] == "least-privilege";
            !(s["result"] == "pass" || (allowed_skip && s["result"] == "skip"))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "scenarios that did not pass: {unexpected:#?}\nstderr: {stderr}"
    );
    assert!(output.status.success(), "exit status {}", output.status);
    assert_eq!(report["passed"], true);
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
}
