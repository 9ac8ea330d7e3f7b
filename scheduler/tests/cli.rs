//! The `chime` binary as an operator runs it: `chime check` exit codes and output on good,
//! broken and missing job files. (Building this test also builds `target/*/chime`, which the
//! end-to-end benchmark smoke tests start as a process.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
