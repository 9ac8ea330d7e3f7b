//! CI-sized smoke runs of `chime-bench`, one per scenario (a few seconds, a handful of jobs), so
//! the benchmark command keeps working. They assert correctness only — every fire delivered,
//! none twice, the crashed worker's runs rerun — never timings, which depend on the machine;
//! the one figure checked is precision's agreement between each run's recorded `started_at` and
//! its handler's own start (two readings of the same instant, with room for a loaded machine).
//!
//! `scale` and `failover` run the real `chime` binary from the same target directory; `cargo
//! test` does not build it (only `cargo build` does), so these two fail with the command to run
//! when it is missing or older than the scheduler's sources.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::process::Command;
use tokio::sync::Semaphore;

/// At most two benchmark processes at a time: each starts schedulers and workers with their own
/// connection pools, next to the rest of the suite.
static SLOTS: Semaphore = Semaphore::const_new(2);

/// Runs `chime-bench <args> --json` and returns its report, failing with its stderr if it did
/// not produce one.
async fn bench(args: &[&str]) -> Value {
    let _slot = SLOTS.acquire().await.expect("semaphore open");
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        Command::new(env!("CARGO_BIN_EXE_chime-bench"))
            .args(args)
            .arg("--json")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("chime-bench {args:?} did not finish within 300 s"))
    .expect("chime-bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "chime-bench {args:?} printed no JSON report ({e}); {}\nstderr:\n{stderr}",
            output.status
        )
    });
    assert!(
        report.get("error").is_none(),
        "chime-bench {args:?} failed: {}\nstderr:\n{stderr}",
        report["error"]
    );
    println!("chime-bench {args:?}:\n{report:#}");
    report
}

/// `report.results` at a JSON pointer, as an unsigned number.
fn number(report: &Value, pointer: &str) -> u64 {
    report["results"]
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at results{pointer} in {report:#}"))
}

/// The newest modification time under `path`.
fn newest(path: &Path) -> SystemTime {
    let meta = std::fs::metadata(path).expect("source path exists");
    if !meta.is_dir() {
        return meta.modified().expect("mtime");
    }
    std::fs::read_dir(path)
        .expect("readable directory")
        .map(|entry| newest(&entry.expect("directory entry").path()))
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// The `chime` binary next to `chime-bench`, checked to exist and to be newer than the sources
/// it is built from.
fn chime_binary() -> PathBuf {
    let chime = Path::new(env!("CARGO_BIN_EXE_chime-bench")).with_file_name("chime");
    let build = "run `cargo build --workspace` before `cargo test --workspace` (cargo test builds \
                 the test harness of `chime`, not the binary)";
    let built = std::fs::metadata(&chime)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {build}", chime.display()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for source in [
        "protocol/src",
        "protocol/Cargo.toml",
        "scheduler/src",
        "scheduler/Cargo.toml",
        "worker-sdk/src",
        "worker-sdk/Cargo.toml",
        "migrations",
    ] {
        assert!(
            newest(&root.join(source)) <= built,
            "{} is older than {source}: {build}",
            chime.display()
        );
    }
    chime
}

#[tokio::test]
async fn bench_smoke_precision_delivers_every_fire_once_and_writes_the_csv() {
    let csv = tempfile::NamedTempFile::new().expect("temporary file");
    let path = csv.path().to_str().expect("utf-8 path");
    let report = bench(&[
        "precision",
        "--jobs",
        "20",
        "--seconds",
        "6",
        "--capacity",
        "8",
        "--csv",
        path,
    ])
    .await;
    let expected = number(&report, "/tally/expected");
    assert_eq!(expected, 20 * 3, "20 jobs × 3 instants of steady window");
    assert_eq!(number(&report, "/tally/delivered"), expected);
    assert_eq!(number(&report, "/tally/missed"), 0);
    assert_eq!(number(&report, "/tally/duplicates"), 0);
    assert_eq!(report["correct"], true);
    // The database's started_at and the handler's own start agree for every run: the same
    // lateness on every surface as the worker measured (docs/runs.md).
    assert_eq!(
        number(&report, "/database_vs_worker/count"),
        number(&report, "/executions")
    );
    // A few ms typically (the claim statement's way to the server, the handler task's spawn);
    // the tail has room for a loaded machine, far below a held-up start's error.
    let apart = |at: &str| {
        report["results"]["database_vs_worker"][at]
            .as_f64()
            .unwrap_or_else(|| panic!("no {at} in {report:#}"))
    };
    let (median, largest) = (apart("p50_ms"), apart("max_ms"));
    assert!(
        median <= 5.0 && largest <= 25.0,
        "the database's started_at is {median} ms (median), up to {largest} ms, from the \
         handler's start"
    );
    let text = std::fs::read_to_string(csv.path()).expect("csv written");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("job_id,intended_at_unix_ms,started_at_unix_ms")
    );
    assert_eq!(
        lines.count() as u64,
        number(&report, "/executions"),
        "one CSV row per execution"
    );
}

#[tokio::test]
async fn bench_smoke_burst_delivers_one_instant_of_many_jobs_once_each() {
    // Jobs every 10 s: the steady window (first fire + 2 s to 12 − 1 s) holds one instant.
    let report = bench(&[
        "burst",
        "--jobs",
        "300",
        "--seconds",
        "12",
        "--workers",
        "2",
        "--capacity",
        "8",
        "--hold",
        "512",
    ])
    .await;
    assert_eq!(number(&report, "/tally/expected"), 300);
    assert_eq!(number(&report, "/tally/delivered"), 300);
    assert_eq!(number(&report, "/tally/duplicates"), 0);
    assert_eq!(number(&report, "/term_changes"), 0);
    assert_eq!(report["correct"], true);
}

#[tokio::test]
async fn bench_smoke_throughput_steps_lose_and_double_nothing() {
    let report = bench(&[
        "throughput",
        "--rates",
        "100,200",
        "--seconds",
        "5",
        "--capacity",
        "8",
    ])
    .await;
    let steps = report["results"]["steps"].as_array().expect("steps");
    assert!(!steps.is_empty(), "at least the first step ran");
    for step in steps {
        let drained = &step["drained"];
        assert!(drained["expected"].as_u64() > Some(0), "{step:#}");
        assert_eq!(drained["missed"], 0, "after the drain: {step:#}");
        assert_eq!(drained["duplicates"], 0, "{step:#}");
    }
    assert_eq!(number(&report, "/term_changes"), 0);
    assert_eq!(report["correct"], true);
}

#[tokio::test]
async fn bench_smoke_scale_registers_every_job_and_fires() {
    let chime = chime_binary();
    let report = bench(&[
        "scale",
        "--jobs",
        "1000",
        "--seconds",
        "2",
        "--groups",
        "2",
        "--chime",
        chime.to_str().expect("utf-8 path"),
    ])
    .await;
    assert_eq!(number(&report, "/registered"), 1000);
    assert!(number(&report, "/fires") > 0, "the every-second job fired");
    assert!(number(&report, "/rss_bytes") > 0);
    assert_eq!(report["correct"], true);
}

#[tokio::test]
async fn bench_smoke_failover_after_a_killed_leader_misses_and_doubles_nothing() {
    let chime = chime_binary();
    let report = bench(&[
        "failover",
        "--jobs",
        "5",
        "--seconds",
        "12",
        "--capacity",
        "8",
        "--chime",
        chime.to_str().expect("utf-8 path"),
    ])
    .await;
    let expected = number(&report, "/tally/expected");
    assert!(expected >= 5 * 10, "5 jobs over at least 10 s: {expected}");
    assert_eq!(number(&report, "/tally/delivered"), expected);
    assert_eq!(number(&report, "/tally/missed"), 0);
    assert_eq!(number(&report, "/tally/duplicates"), 0);
    assert!(
        report["results"]["next_fire_ms"].is_number(),
        "a fire after the kill ran"
    );
    assert_eq!(report["correct"], true);
}

#[tokio::test]
async fn bench_smoke_crash_reruns_every_run_of_the_killed_worker_once() {
    let report = bench(&["crash", "--jobs", "2"]).await;
    assert_eq!(number(&report, "/rerun"), 2, "both runs started again");
    assert_eq!(number(&report, "/duplicate_starts"), 0);
    for run in report["results"]["runs"].as_array().expect("runs") {
        assert_eq!(run["state"], "succeeded", "{run:#}");
        assert_eq!(run["starts_after_kill"], 1, "{run:#}");
    }
    assert_eq!(report["correct"], true);
}

#[tokio::test]
async fn bench_smoke_children_makes_one_child_per_upstream_run() {
    let report = bench(&["children", "--jobs", "3"]).await;
    assert_eq!(number(&report, "/runs"), 30, "3 chains of 10 jobs");
    assert_eq!(number(&report, "/succeeded_once"), 30);
    assert_eq!(number(&report, "/doubled"), 0);
    assert_eq!(
        report["results"]["edges"].as_array().map(Vec::len),
        Some(27),
        "9 links per chain"
    );
    assert_eq!(report["correct"], true);
}

#[tokio::test]
async fn bench_smoke_workflow_runs_each_node_once_after_its_upstream_nodes() {
    let report = bench(&["workflow", "--jobs", "120"]).await;
    assert_eq!(report["results"]["state"], "succeeded");
    assert_eq!(number(&report, "/node_runs"), 120, "20 layers of 6");
    assert_eq!(number(&report, "/succeeded_once"), 120);
    assert_eq!(number(&report, "/doubled"), 0);
    assert_eq!(number(&report, "/early"), 0);
    assert_eq!(report["correct"], true);
}
