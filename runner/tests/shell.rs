//! Shell handlers with real processes, run through the SDK's `testing` helper (no services):
//! placeholders, injection attempts, exit codes, timeouts and process groups, output.

use std::time::Duration;

use chime_runner::config::{HandlerSpec, parse};
use chime_test_kit::{done_if, wait_for};
use chime_worker::testing::{TestJob, TestRun};
use chime_worker::{JobError, Level, Shard, Task, TaskKind};
use serde_json::{Value, json};

/// The spec of the one handler in `handler` (TOML fields of a `[[handlers]]` table).
fn spec(handler: &str) -> HandlerSpec {
    let text = format!(
        "[worker]\ngroup = \"ops\"\n\n[[handlers]]\nname = \"h\"\nkind = \"shell\"\n{handler}\n"
    );
    match parse("runner.toml", &text) {
        Ok(mut config) => config.handlers.remove(0).spec,
        Err(e) => panic!("{e}"),
    }
}

async fn run(handler: &str, params: Value) -> TestRun {
    TestJob::new("h")
        .run(chime_runner::handler(spec(handler)), params)
        .await
}

fn lines(run: &TestRun) -> Vec<String> {
    run.logs.iter().map(|(_, l)| l.clone()).collect()
}

fn info(text: &str) -> (Level, String) {
    (Level::Info, text.to_owned())
}

#[tokio::test]
async fn argv_placeholders_are_filled_from_params_and_defaults() {
    let run = run(
        r#"argv = ["printf", "%s|%s|%s|%s\n", "{name}", "x-{count}", "{region}", "{ctx:run_id}/{ctx:attempt}"]
           defaults = { region = "eu" }"#,
        json!({"name": "Ada Lovelace", "count": 12.5}),
    )
    .await;
    assert_eq!(run.result, Ok(()));
    assert_eq!(run.logs, [info("Ada Lovelace|x-12.5|eu|1/1")]);
}

#[tokio::test]
async fn a_missing_param_fails_without_retry_naming_it() {
    let run = run(r#"argv = ["echo", "{database}"]"#, json!({"other": 1})).await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.message().contains("param `database` is missing"),
        "{err}"
    );
    // Nothing ran.
    assert!(run.logs.is_empty(), "{:?}", run.logs);

    for (params, problem) in [
        (json!({"database": ["a"]}), "param `database` is an array"),
        (json!({"database": true}), "param `database` is a boolean"),
        (json!({"database": "x".repeat(5000)}), "is 5000 bytes long"),
        (json!({"database": "a\u{0}b"}), "contains a NUL byte"),
        (json!("orders"), "params must be a JSON object"),
    ] {
        let run = self::run(r#"argv = ["echo", "{database}"]"#, params).await;
        let err = run.result.as_ref().unwrap_err();
        assert!(!err.is_retryable());
        assert!(err.message().contains(problem), "{err}");
    }
}

const HOSTILE: &str =
    "a b; rm -rf $HOME $(touch MARKER) `touch MARKER` | touch MARKER && '\" * {other}";

#[tokio::test]
async fn params_never_become_argv_elements_or_shell_text() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let value = HOSTILE.replace("MARKER", marker.to_str().unwrap());

    // argv: one param is one argument, whatever it holds.
    let run = run(
        r#"argv = ["sh", "-c", "echo $#; printf '[%s]\n' \"$1\"", "sh", "{v}"]"#,
        json!({"v": value}),
    )
    .await;
    assert_eq!(run.result, Ok(()));
    assert_eq!(lines(&run), ["1".to_owned(), format!("[{value}]")]);

    // shell = true: params reach the command as environment variables only.
    let run = self::run(
        r#"shell = true
           command = "printf '[%s]\n' \"$V\""
           env_from_params = ["V"]"#,
        json!({"V": value}),
    )
    .await;
    assert_eq!(run.result, Ok(()));
    assert_eq!(lines(&run), [format!("[{value}]")]);
    assert!(!marker.exists(), "a param ran a command");
}

#[tokio::test]
async fn a_param_that_looks_like_an_option_is_refused_unless_allowed() {
    let run = run(r#"argv = ["echo", "{v}"]"#, json!({"v": "-n"})).await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.message()
            .contains("param `v` = \"-n\" starts with `-` and would be read as an option"),
        "{err}"
    );
    // However the params are arranged.
    let run = self::run(r#"argv = ["echo", "{a}{b}"]"#, json!({"a": "", "b": "-n"})).await;
    assert!(!run.result.as_ref().unwrap_err().is_retryable());
    // Inside an argument (after fixed text) it is harmless.
    let run = self::run(r#"argv = ["echo", "x{v}"]"#, json!({"v": "-n"})).await;
    assert_eq!(run.logs, [info("x-n")]);
    let run = self::run(
        r#"argv = ["printf", "%s\n", "{v}"]
           allow_option_params = true"#,
        json!({"v": "-n"}),
    )
    .await;
    assert_eq!(run.logs, [info("-n")]);
}

#[tokio::test]
async fn exit_codes_map_to_outcomes() {
    let codes = r#"retry_codes = [3]
                   fail_codes = [4]"#;
    // (script, extra fields, expected: None for success, else (retryable, message start))
    type Case<'a> = (&'a str, &'a str, Option<(bool, &'a str)>);
    let cases: [Case<'_>; 6] = [
        ("exit 0", "", None),
        (
            "echo bad; exit 3",
            "",
            Some((true, "exited with code 3 (in retry_codes: retried")),
        ),
        (
            "echo bad; exit 4",
            "",
            Some((false, "exited with code 4 (in fail_codes: not retried)")),
        ),
        (
            "echo bad; exit 5",
            "",
            Some((true, "exited with code 5 (other_codes = \"retry\"")),
        ),
        (
            "echo bad; exit 5",
            "other_codes = \"fail\"",
            Some((
                false,
                "exited with code 5 (other_codes = \"fail\": not retried)",
            )),
        ),
        (
            "echo bad; kill -KILL $$",
            "",
            Some((true, "killed by SIGKILL (9)")),
        ),
    ];
    for (script, extra, expected) in cases {
        let handler = format!("argv = [\"sh\", \"-c\", \"{script}\"]\n{codes}\n{extra}");
        let run = run(&handler, Value::Null).await;
        match expected {
            None => assert_eq!(run.result, Ok(()), "{script}"),
            Some((retryable, text)) => {
                let err = run.result.as_ref().unwrap_err();
                assert_eq!(err.is_retryable(), retryable, "{script}: {err}");
                assert!(matches!(
                    err,
                    JobError::Retry { .. } | JobError::Fail { .. }
                ));
                assert!(err.message().starts_with(text), "{script}: {err}");
                assert!(
                    err.message().ends_with("; last output:\nbad"),
                    "{script}: {err}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_program_that_does_not_exist_fails_without_retry() {
    let run = run(r#"argv = ["/nonexistent/chime-test-program"]"#, Value::Null).await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.message()
            .starts_with("could not start \"/nonexistent/chime-test-program\""),
        "{err}"
    );
}

/// Whether `pid` is gone (or a zombie nobody reaped yet: it runs no more).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn pids(run: &TestRun) -> Vec<u32> {
    run.logs
        .iter()
        .filter_map(|(_, l)| l.parse().ok())
        .collect()
}

async fn assert_gone(pids: &[u32]) {
    for &pid in pids {
        wait_for(
            Duration::from_secs(10),
            &format!("process {pid} to be gone"),
            || async move { done_if(gone(pid), |g| *g) },
        )
        .await;
    }
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let run = run(
        r#"argv = ["sh", "-c", "echo $$; sleep 100 & echo $!; sleep 100"]
           timeout = "1s"
           kill_grace = "5s""#,
        Value::Null,
    )
    .await;
    let err = run.result.as_ref().unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        err.message().starts_with(
            "timed out after 1s (the handler's timeout); the process group got SIGTERM"
        ),
        "{err}"
    );
    let pids = pids(&run);
    assert_eq!(pids.len(), 2, "{:?}", run.logs);
    assert_gone(&pids).await;
}

#[tokio::test]
async fn a_group_that_ignores_sigterm_gets_sigkill_after_kill_grace() {
    let run = run(
        r#"argv = ["sh", "-c", "trap '' TERM; echo $$; sleep 100 & echo $!; wait"]
           timeout = "1s"
           kill_grace = "300ms""#,
        Value::Null,
    )
    .await;
    let err = run.result.as_ref().unwrap_err();
    assert!(
        err.message()
            .contains("the process group got SIGTERM, then SIGKILL after 300ms"),
        "{err}"
    );
    assert!(lines(&run).contains(
        &"still running 300ms after SIGTERM: sent SIGKILL to the process group".to_owned()
    ));
    let pids = pids(&run);
    assert_eq!(pids.len(), 2, "{:?}", run.logs);
    assert_gone(&pids).await;
}

#[tokio::test]
async fn a_cancelled_run_stops_its_process_group_and_ends_cancelled() {
    let job = TestJob::new("h");
    job.cancellation_token().cancel();
    let run = job
        .run(
            chime_runner::handler(spec(r#"argv = ["sleep", "100"]"#)),
            Value::Null,
        )
        .await;
    let err = run.result.as_ref().unwrap_err();
    assert!(matches!(err, JobError::Cancel { .. }), "{err}");
    assert!(err.message().starts_with("the run was cancelled"), "{err}");
}

#[tokio::test]
async fn processes_left_behind_are_stopped_when_the_program_exits() {
    let run = run(r#"argv = ["sh", "-c", "sleep 100 & echo $!"]"#, Value::Null).await;
    assert_eq!(run.result, Ok(()));
    let pids = pids(&run);
    assert_eq!(pids.len(), 1, "{:?}", run.logs);
    assert!(lines(&run).contains(
        &"the program exited and left processes in its process group: sent them SIGTERM".to_owned()
    ));
    assert_gone(&pids).await;
}

#[tokio::test]
async fn output_lines_arrive_in_order_stdout_at_info_stderr_at_warn() {
    let run = run(r#"argv = ["seq", "1", "3000"]"#, Value::Null).await;
    assert_eq!(run.result, Ok(()));
    let expected: Vec<String> = (1..=3000).map(|i| i.to_string()).collect();
    assert_eq!(lines(&run), expected);
    assert!(run.logs.iter().all(|(level, _)| *level == Level::Info));

    let run = self::run(
        r#"argv = ["sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2"]"#,
        Value::Null,
    )
    .await;
    let stdout: Vec<_> = run
        .logs
        .iter()
        .filter(|(l, _)| *l == Level::Info)
        .map(|(_, t)| t.as_str())
        .collect();
    let stderr: Vec<_> = run
        .logs
        .iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(stdout, ["out1", "out2"]);
    assert_eq!(stderr, ["err1", "err2"]);
}

#[tokio::test]
async fn oversize_output_is_capped_and_the_child_is_not_blocked() {
    // 4 MB in 4,000 lines of 1,000 bytes, far beyond a pipe's buffer: had the runner stopped
    // reading at the cap, the child would block and the handler's timeout would fire.
    let run = run(
        r#"argv = ["sh", "-c", "head -c 4000000 /dev/zero | tr '\\0' x | fold -w 1000; echo done >&2"]
           max_output = "64KiB"
           timeout = "60s""#,
        Value::Null,
    )
    .await;
    assert_eq!(run.result, Ok(()), "{:?}", run.logs.last());
    let logged = lines(&run);
    // 65 lines of 1,000 bytes fit in 64 KiB; the 66th and every later one are dropped.
    assert_eq!(logged.len(), 66, "{:?}", &logged[60..]);
    assert!(logged[..65].iter().all(|l| l.len() == 1000));
    assert_eq!(
        logged[65],
        "… 3936 more lines (3935004 bytes) of output dropped: the log keeps at most 64 KiB and \
         9000 lines per attempt (max_output)"
    );

    // A long line is cut, and says by how much.
    let run = self::run(
        r#"argv = ["sh", "-c", "head -c 10000 /dev/zero | tr '\\0' y"]"#,
        Value::Null,
    )
    .await;
    assert_eq!(
        lines(&run),
        [format!("{} …[line cut: 5904 more bytes]", "y".repeat(4096))]
    );
}

#[tokio::test]
async fn the_child_gets_only_the_declared_environment() {
    let run = run(
        r#"argv = ["env"]
           env = { FIXED = "1" }
           env_from_params = ["REGION"]
           inherit_env = ["PATH"]"#,
        json!({"REGION": "eu-west"}),
    )
    .await;
    assert_eq!(run.result, Ok(()));
    let mut names: Vec<String> = lines(&run)
        .iter()
        .map(|l| l.split_once('=').unwrap().0.to_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "CHIME_ATTEMPT",
            "CHIME_JOB",
            "CHIME_RUN_ID",
            "CHIME_SCHEDULED_AT",
            "FIXED",
            "PATH",
            "REGION"
        ]
    );
    assert!(lines(&run).contains(&"REGION=eu-west".to_owned()));
    assert!(lines(&run).contains(&"CHIME_JOB=h".to_owned()));
}

/// Task `shard/index` of run 41, a sharded job's fire of `total` shards.
fn shard_task(index: u32, total: u32, param: Option<Value>) -> Task {
    Task {
        parent_run_id: 41,
        key: format!("shard/{index}"),
        kind: TaskKind::Shard,
        shard: Some(Shard {
            index,
            total,
            param,
        }),
        worker: None,
        step: None,
        depth: None,
    }
}

#[tokio::test]
async fn a_shard_task_sees_its_shard_in_placeholders_and_the_environment() {
    let handler = r#"argv = ["sh", "-c", "echo \"$1 $2 env $CHIME_SHARD_INDEX/$CHIME_SHARD_TOTAL ${{CHIME_SHARD_PARAM-unset}}\"", "sh", "{ctx:shard_index}/{ctx:shard_total}", "{ctx:shard_param}"]"#;
    let cases = [
        (json!("Guangzhou"), "1/3 Guangzhou env 1/3 Guangzhou"),
        (
            json!({"region": "eu"}),
            r#"1/3 {"region":"eu"} env 1/3 {"region":"eu"}"#,
        ),
    ];
    for (param, line) in cases {
        let run = TestJob::new("h")
            .task(shard_task(1, 3, Some(param)))
            .run(chime_runner::handler(spec(handler)), Value::Null)
            .await;
        assert_eq!(run.result, Ok(()), "{:?}", run.logs);
        assert_eq!(run.logs, [info(line)]);
    }

    // A shard without a shard_params entry: no CHIME_SHARD_PARAM, and `{ctx:shard_param}`
    // refuses to fill.
    let env_only = r#"argv = ["sh", "-c", "echo \"$CHIME_SHARD_INDEX/$CHIME_SHARD_TOTAL ${{CHIME_SHARD_PARAM-unset}}\""]"#;
    let run = TestJob::new("h")
        .task(shard_task(0, 2, None))
        .run(chime_runner::handler(spec(env_only)), Value::Null)
        .await;
    assert_eq!(run.result, Ok(()));
    assert_eq!(run.logs, [info("0/2 unset")]);
    let run = TestJob::new("h")
        .task(shard_task(0, 2, None))
        .run(chime_runner::handler(spec(handler)), Value::Null)
        .await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.message().contains(
            "`{ctx:shard_param}` has no value: shard 0 of 2 has no entry in the job's shard_params"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn shard_placeholders_fail_a_run_that_is_not_a_shard_without_retry() {
    let run = run(r#"argv = ["echo", "{ctx:shard_index}"]"#, Value::Null).await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.message()
            .contains("`{ctx:shard_index}` has no value: run 1 is not a task of a sharded job"),
        "{err}"
    );
    // Nothing ran.
    assert!(run.logs.is_empty(), "{:?}", run.logs);
}

#[tokio::test]
async fn workdir_is_where_the_program_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    let run = run(
        &format!("argv = [\"pwd\"]\nworkdir = {:?}", path.to_str().unwrap()),
        Value::Null,
    )
    .await;
    assert_eq!(lines(&run), [path.to_str().unwrap().to_owned()]);
}
