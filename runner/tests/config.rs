//! The config file: every mistake reported at once with its field, value and fix; the example
//! config passes `chime-runner --check`.

use std::process::Command;

use chime_runner::config::{HandlerSpec, parse};

fn errors(text: &str) -> Vec<String> {
    parse("runner.toml", text).expect_err(text).lines()
}

const WORKER: &str = "[worker]\ngroup = \"ops\"\n";

fn with_handler(handler: &str) -> String {
    format!("{WORKER}\n[[handlers]]\nname = \"dump\"\nkind = \"shell\"\n{handler}\n")
}

#[test]
fn mistakes_name_the_field_the_value_and_the_fix() {
    let cases = [
        (
            with_handler("argv = [\"pg_dump\", \"{db name}\"]"),
            "runner.toml: handler \"dump\": field \"argv[1]\" = \"{db name}\": placeholder `{db name}` is not a name",
        ),
        (
            with_handler("argv = [\"{program}\", \"x\"]"),
            "runner.toml: handler \"dump\": field \"argv[0]\" = \"{program}\": the program is fixed text: a placeholder may fill arguments, never the program",
        ),
        (
            with_handler("argv = []"),
            "runner.toml: handler \"dump\": field \"argv\" = []: is empty; give the program and its arguments",
        ),
        (
            with_handler("argv = [\"x\"]\ntimeout = \"8days\""),
            "runner.toml: handler \"dump\": field \"timeout\" = \"8days\": is longer than the limit of 7days; give a shorter duration",
        ),
        (
            with_handler("argv = [\"x\"]\ntimeout = \"soon\""),
            "field \"timeout\" = \"soon\": is not a duration",
        ),
        (
            with_handler("argv = [\"x\"]\nkill_grace = \"0s\""),
            "field \"kill_grace\" = \"0s\": must be longer than 0",
        ),
        (
            with_handler("argv = [\"x\"]\nmax_output = \"1TiB\""),
            "field \"max_output\" = \"1TiB\": is not a size",
        ),
        (
            with_handler("argv = [\"x\"]\nmax_output = 10"),
            "field \"max_output\" = 10: must be between 1 KiB and 64 MiB",
        ),
        (
            with_handler("argv = [\"x\"]\nretry_codes = [3, 0]\nfail_codes = [3]"),
            "field \"retry_codes[1]\" = 0: must be an exit code from 1 to 255",
        ),
        (
            with_handler("argv = [\"x\"]\nretry_codes = [3]\nfail_codes = [3]"),
            "field \"fail_codes\" = 3: exit code 3 is in both retry_codes and fail_codes",
        ),
        (
            with_handler("command = \"pg_dump | gzip\""),
            "field \"command\" = \"pg_dump | gzip\": runs through /bin/sh only with shell = true",
        ),
        (
            with_handler("shell = true\ncommand = \"x\"\nenv_from_params = [\"LD_PRELOAD\"]"),
            "field \"env_from_params[0]\" = \"LD_PRELOAD\": changes how programs load or shells start",
        ),
        (
            with_handler("argv = [\"x\"]\nworkdir = \"relative\""),
            "field \"workdir\" = \"relative\": must be an absolute path",
        ),
        (
            with_handler("argv = [\"x\"]\nurl = \"http://x/\""),
            "field \"url\": is a field of kind = \"http\" handlers; remove it from this shell handler",
        ),
        (
            format!("{WORKER}\n[[handlers]]\nname = \"Dump\"\nkind = \"shell\"\nargv = [\"x\"]\n"),
            "runner.toml: handler #1: field \"name\" = \"Dump\": contains 'D'",
        ),
        (
            format!("{WORKER}\n[[handlers]]\nname = \"a\"\nkind = \"ftp\"\n"),
            "runner.toml: handler \"a\": field \"kind\" = \"ftp\": is not a handler kind",
        ),
        (
            format!(
                "{WORKER}\n[[handlers]]\nname = \"a\"\njob = \"j\"\nkind = \"shell\"\nargv = [\"x\"]\n\n[[handlers]]\nname = \"b\"\njob = \"j\"\nkind = \"shell\"\nargv = [\"y\"]\n"
            ),
            "runner.toml: handler \"b\": field \"job\" = \"j\": is already bound to handler \"a\"; a job has one handler",
        ),
        (
            "[worker]\ncapacity = 0\n".to_owned(),
            "runner.toml: field \"worker.group\": missing",
        ),
        (
            "[worker]\ngroup = \"ops\"\ncapacity = 0\n".to_owned(),
            "runner.toml: field \"worker.capacity\" = 0: must be between 1 and 1024",
        ),
        (
            "[worker]\ngroup = \"ops\"\n".to_owned(),
            "runner.toml: field \"handlers\": no handlers",
        ),
        (
            format!("{}\n[worker.extra]\n", with_handler("argv = [\"x\"]")),
            "runner.toml: unknown field `extra`",
        ),
        (
            "[worker]\ngroup = \"ops\"\ncancel_grace = \"5s\"\n\n[[handlers]]\nname = \"a\"\nkind = \"shell\"\nargv = [\"x\"]\nkill_grace = \"10s\"\n".to_owned(),
            "field \"worker.cancel_grace\" = \"5s\": must be longer than the longest kill_grace of the handlers (10s)",
        ),
    ];
    for (text, expected) in cases {
        let got = errors(&text);
        assert!(
            got.iter().any(|e| e.contains(expected)),
            "{text}\nexpected: {expected}\ngot: {got:#?}"
        );
    }
}

#[test]
fn every_mistake_is_reported_at_once() {
    let got = errors(&with_handler(
        "argv = [\"x\", \"{\"]\ntimeout = \"0s\"\nother_codes = \"maybe\"",
    ));
    assert_eq!(got.len(), 3, "{got:#?}");
}

#[test]
fn defaults_give_cancel_grace_room_for_kill_grace() {
    let config = parse(
        "runner.toml",
        &with_handler("argv = [\"x\"]\nkill_grace = \"20s\""),
    )
    .unwrap();
    assert_eq!(config.worker.cancel_grace.as_secs(), 25);
    assert_eq!(
        config.handlers[0].job, "dump",
        "the job defaults to the name"
    );
    let HandlerSpec::Shell(shell) = &config.handlers[0].spec else {
        unreachable!()
    };
    assert_eq!(shell.max_output, 1024 * 1024);
}

#[test]
fn several_broker_addresses_are_a_list_not_given_with_amqp_url() {
    let handler = "\n[[handlers]]\nname = \"dump\"\nkind = \"shell\"\nargv = [\"x\"]\n";
    let list = "amqp_urls = [\"amqp://a:pw@mq-1:5672/%2f\", \"amqp://a:pw@mq-2:5672/%2f\"]\n";
    let config = parse("runner.toml", &format!("{WORKER}{list}{handler}")).unwrap();
    assert_eq!(
        config.worker.amqp_urls.as_deref(),
        Some(
            &[
                "amqp://a:pw@mq-1:5672/%2f".to_owned(),
                "amqp://a:pw@mq-2:5672/%2f".to_owned()
            ][..]
        )
    );
    assert!(!format!("{:?}", config.worker).contains(":pw@"));

    let both = format!("{WORKER}amqp_url = \"amqp://a:pw@mq-0:5672/%2f\"\n{list}{handler}");
    assert_eq!(
        errors(&both),
        [
            "runner.toml: field \"worker.amqp_urls\" = [\"amqp://a:***@mq-1:5672/%2f\", \"amqp://a:***@mq-2:5672/%2f\"]: worker.amqp_url is set too; give one address as amqp_url or several as amqp_urls, not both (put the amqp_url address into the list and remove it)"
        ]
    );
    let bad = format!("{WORKER}amqp_urls = [\"http://a:pw@mq-1\"]\n{handler}");
    assert_eq!(
        errors(&bad),
        [
            "runner.toml: field \"worker.amqp_urls\" = \"http://a:***@mq-1\": address 1 of 1: must be an amqp:// or amqps:// URL of at most 4096 bytes"
        ]
    );
}

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/runner.toml");

#[test]
fn the_example_config_passes_check() {
    let out = Command::new(env!("CARGO_BIN_EXE_chime-runner"))
        .args(["--config", EXAMPLE, "--check"])
        .env("BILLING_TOKEN", "example-token")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("job \"nightly-pg-dump\" -> shell handler"),
        "{stdout}"
    );
    assert!(
        stdout.contains("job \"settle-invoices\" -> http handler"),
        "{stdout}"
    );
    assert!(!stdout.contains("example-token"), "{stdout}");
    assert!(stdout.ends_with("handlers\n"), "{stdout}");
}

#[test]
fn check_fails_with_every_mistake_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, with_handler("argv = [\"{x}\"]\ntimeout = \"0s\"")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chime-runner"))
        .arg("--config")
        .arg(&path)
        .arg("--check")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 2, "{stderr}");
    assert!(stderr.contains("field \"argv[0]\""), "{stderr}");
    assert!(stderr.contains("field \"timeout\""), "{stderr}");
}
