//! The hostile-input corpus (`tests/corpus/config/`): each file there is a settings or job file
//! a user or an attacker could write, paired with a `.expected` file of the message parts its
//! check must print. Job files go through [`crate::check::check`], exactly as `chime check` runs
//! them; files named `settings-*` through [`Settings::load_with_env`], as the scheduler loads its
//! settings. Every case must fail with each expected part, quickly, and without a panic.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::DateTime;

use super::Settings;

/// Longest a case may take in a debug build: a YAML bomb once took minutes and gigabytes.
const PER_CASE: Duration = Duration::from_secs(5);

fn corpus() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/corpus/config"
    ))
    .to_path_buf()
}

/// The corpus's input files (every file but the `.expected` ones), by name.
fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(corpus())
        .expect("tests/corpus/config exists")
        .map(|entry| entry.expect("readable directory").path())
        .filter(|path| path.extension().is_some_and(|ext| ext != "expected"))
        .collect();
    cases.sort();
    cases
}

/// What checking `path` prints, and whether it passed.
fn check(path: &Path) -> (bool, String) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with("settings-") {
        return match Settings::load_with_env(Some(path), Vec::new()) {
            Ok(settings) => (true, format!("{settings:?}")),
            Err(errors) => (false, errors.to_string()),
        };
    }
    let now = DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
        .expect("instant")
        .to_utc();
    let mut out = Vec::new();
    let ok = crate::check::check(&[path.to_path_buf()], now, &mut out).expect("in-memory output");
    (ok, String::from_utf8(out).expect("UTF-8 output"))
}

#[test]
fn every_hostile_config_fails_fast_with_its_clear_error() {
    let cases = cases();
    assert!(cases.len() >= 20, "the corpus is missing: {cases:?}");
    let mut failures = Vec::new();
    for path in &cases {
        let expected_path = path.with_extension("expected");
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let started = Instant::now();
        let (ok, output) = check(path);
        let took = started.elapsed();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if ok {
            failures.push(format!("{name:?}: accepted\n{output}"));
            continue;
        }
        if took > PER_CASE {
            failures.push(format!("{name:?}: took {took:?}"));
        }
        for part in expected.lines().filter(|line| !line.trim().is_empty()) {
            if !output.contains(part) {
                failures.push(format!("{name:?}: no {part:?} in\n{output}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_corpus_case_has_its_expectation() {
    for path in cases() {
        assert!(
            path.with_extension("expected").is_file(),
            "{} has no .expected file",
            path.display()
        );
    }
}
