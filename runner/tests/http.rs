//! HTTP handlers against a local axum server (no other services): status mapping, the body
//! template, the response cap, header redaction, the response stored as the run's output, and
//! the allow list at load and at run time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, get, post};
use chime_protocol::limits::MAX_TASK_OUTPUT_BYTES;
use chime_runner::config::{HandlerSpec, parse};
use chime_worker::testing::{TestJob, TestRun};
use chime_worker::{JobError, Level, Shard, Task, TaskKind};
use serde_json::{Value, json};

/// The secret the tests put in a header; it must never show in a log line or an error.
const SECRET: &str = "s3cr3t-t0ken-value";

#[derive(Default)]
struct Hits {
    admin: AtomicUsize,
}

/// Starts the test server on a free port; returns its base URL (`http://127.0.0.1:PORT`).
async fn server() -> (String, Arc<Hits>) {
    let hits = Arc::new(Hits::default());
    let app = Router::new()
        .route("/jobs/ok", get(|| async { "done\nsecond line" }))
        .route(
            "/jobs/status/{code}",
            get(|Path(code): Path<u16>| async move {
                let status = StatusCode::from_u16(code).unwrap();
                let mut headers = HeaderMap::new();
                if code == 503 {
                    headers.insert("retry-after", "7".parse().unwrap());
                }
                (status, headers, format!("status {code}"))
            }),
        )
        .route(
            "/jobs/echo",
            post(|headers: HeaderMap, body: Bytes| async move {
                // Echoes what it got, secrets included, as a careless service would.
                let auth = headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                let content_type = headers
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                format!(
                    "auth: {auth}\ncontent-type: {content_type}\nbody: {}",
                    String::from_utf8_lossy(&body)
                )
            }),
        )
        .route(
            "/jobs/json",
            post(|headers: HeaderMap, body: Bytes| async move {
                // What it got, as JSON, the secret included.
                let auth = headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned());
                let received: Value = serde_json::from_slice(&body).unwrap();
                axum::Json(json!({"received": received, "auth": auth}))
            }),
        )
        .route(
            "/jobs/big",
            get(|| async { "z".repeat(1024 * 1024).into_response() }),
        )
        .route(
            "/jobs/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route("/jobs/{*rest}", any(|| async { "somewhere under /jobs" }))
        .route(
            "/admin",
            any(|State(hits): State<Arc<Hits>>| async move {
                hits.admin.fetch_add(1, SeqCst);
                "admin"
            }),
        )
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, hits)
}

fn config(handler: &str) -> Result<HandlerSpec, Vec<String>> {
    let text = format!(
        "[worker]\ngroup = \"ops\"\n\n[[handlers]]\nname = \"h\"\nkind = \"http\"\n{handler}\n"
    );
    parse("runner.toml", &text)
        .map(|mut c| c.handlers.remove(0).spec)
        .map_err(|e| e.lines())
}

fn spec(handler: &str) -> HandlerSpec {
    config(handler).unwrap_or_else(|e| panic!("{e:?}"))
}

async fn run(handler: &str, params: Value) -> TestRun {
    TestJob::new("h")
        .run_id(42)
        .run(chime_runner::handler(spec(handler)), params)
        .await
}

fn lines(run: &TestRun) -> Vec<String> {
    run.logs.iter().map(|(_, l)| l.clone()).collect()
}

#[tokio::test]
async fn statuses_map_to_outcomes() {
    let (base, _) = server().await;
    let allow = format!("allow = [\"{base}/jobs/\"]");
    let ok = run(&format!("url = \"{base}/jobs/ok\"\n{allow}"), Value::Null).await;
    assert_eq!(ok.result, Ok(()));
    let logged = lines(&ok);
    assert_eq!(logged[0], format!("GET {base}/jobs/ok"));
    assert!(logged[1].starts_with("HTTP 200 OK in "), "{logged:?}");
    assert_eq!(logged[2..], ["done", "second line"]);

    // (status, extra fields, expected: None for success, else (retryable, requested delay))
    type Case<'a> = (u16, &'a str, Option<(bool, Option<Duration>)>);
    let cases: [Case<'_>; 6] = [
        (204, "", None),
        (404, "", Some((false, None))),
        (429, "", Some((true, None))),
        (503, "", Some((true, Some(Duration::from_secs(7))))),
        (200, "expect = [202]", Some((false, None))),
        (404, "expect = [\"2xx\", 404]", None),
    ];
    for (code, extra, expected) in cases {
        let handler = format!("url = \"{base}/jobs/status/{{code}}\"\n{allow}\n{extra}");
        let run = run(&handler, json!({"code": code})).await;
        match expected {
            None => assert_eq!(run.result, Ok(()), "{code} {extra}"),
            Some((retryable, delay)) => {
                let err = run.result.as_ref().unwrap_err();
                assert_eq!(err.is_retryable(), retryable, "{code}: {err}");
                assert_eq!(err.requested_delay(), delay, "{code}");
                assert!(
                    err.message()
                        .starts_with(&format!("GET {base}/jobs/status/{code}: HTTP {code}")),
                    "{err}"
                );
                if code != 204 {
                    assert!(
                        err.message()
                            .ends_with(&format!("last output:\nstatus {code}")),
                        "{err}"
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn the_body_template_fills_params_as_json_values_and_headers_are_redacted() {
    let (base, _) = server().await;
    // The secret comes from a header literal here; `{env:…}` is covered by the example config.
    let run = run(
        &format!(
            r#"url = "{base}/jobs/echo"
               allow = ["{base}/jobs/"]
               headers = {{ Authorization = "Bearer {SECRET}", X-Run = "{{ctx:run_id}}" }}
               body = {{ tenant = "{{tenant}}", ids = "{{ids}}", note = "run {{ctx:run_id}} for {{tenant}}", run = "{{ctx:run_id}}", fixed = [1, true] }}"#
        ),
        json!({"tenant": "acme", "ids": [1, 2, 3]}),
    )
    .await;
    assert_eq!(run.result, Ok(()), "{:?}", run.logs);
    let logged = lines(&run);
    assert_eq!(logged[0], format!("POST {base}/jobs/echo"));
    assert_eq!(logged[2], "auth: [redacted]");
    assert_eq!(logged[3], "content-type: application/json");
    let body: Value = serde_json::from_str(logged[4].strip_prefix("body: ").unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"tenant": "acme", "ids": [1, 2, 3], "note": "run 42 for acme", "run": 42, "fixed": [1, true]})
    );
    for line in &logged {
        assert!(!line.contains(SECRET), "{line}");
    }

    // Errors are redacted too.
    let run = self::run(
        &format!(
            r#"url = "{base}/jobs/status/500"
               allow = ["{base}/jobs/"]
               headers = {{ Authorization = "{SECRET}" }}"#
        ),
        Value::Null,
    )
    .await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.message().contains(SECRET));

    // A param cannot add a header line.
    let run = self::run(
        &format!(
            "url = \"{base}/jobs/ok\"\nallow = [\"{base}/jobs/\"]\nheaders = {{ X-Tenant = \"{{tenant}}\" }}"
        ),
        json!({"tenant": "acme\r\nX-Evil: 1"}),
    )
    .await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.message()
            .starts_with("header x-tenant would hold characters a header cannot"),
        "{err}"
    );

    // `--check` shows header names, never values.
    let HandlerSpec::Http(http) = spec(&format!(
        "url = \"{base}/jobs/ok\"\nallow = [\"{base}/jobs/\"]\nheaders = {{ Authorization = \"{SECRET}\" }}"
    )) else {
        unreachable!()
    };
    let described = http.describe();
    assert!(described.contains("headers [authorization]"), "{described}");
    assert!(!described.contains(SECRET));
}

#[tokio::test]
async fn the_response_is_read_up_to_max_response_only() {
    let (base, _) = server().await;
    let run = run(
        &format!("url = \"{base}/jobs/big\"\nallow = [\"{base}/jobs/\"]\nmax_response = \"8KiB\""),
        Value::Null,
    )
    .await;
    assert_eq!(run.result, Ok(()));
    let logged = lines(&run);
    assert!(
        logged[1].ends_with("8192 bytes of body read"),
        "{}",
        logged[1]
    );
    // 8 KiB of one line: cut at the line cap, then the note.
    assert_eq!(
        logged[2],
        format!("{} …[line cut: 4096 more bytes]", "z".repeat(4096))
    );
    assert_eq!(
        logged[3],
        "… the response body was cut at 8 KiB (max_response); the rest was not read"
    );
    assert_eq!(logged.len(), 4);
}

#[tokio::test]
async fn an_expected_response_is_stored_as_the_run_output_json_as_its_value() {
    let (base, _) = server().await;
    // A shard task: `{ctx:shard_param}` alone is the shard param's JSON value, the response's
    // JSON is the output, and the secret it echoes is redacted there too.
    let handler = format!(
        r#"url = "{base}/jobs/json"
           allow = ["{base}/jobs/"]
           headers = {{ Authorization = "Bearer {SECRET}" }}
           body = {{ region = "{{ctx:shard_param}}", shard = "{{ctx:shard_index}}", of = "{{ctx:shard_index}} of {{ctx:shard_total}}" }}"#
    );
    let run = TestJob::new("h")
        .task(Task {
            parent_run_id: 41,
            key: "shard/1".into(),
            kind: TaskKind::Shard,
            shard: Some(Shard {
                index: 1,
                total: 3,
                param: Some(json!({"name": "eu", "zones": 2})),
            }),
            worker: None,
            step: None,
            depth: None,
        })
        .run(chime_runner::handler(spec(&handler)), Value::Null)
        .await;
    assert_eq!(run.result, Ok(()), "{:?}", run.logs);
    assert_eq!(
        run.output,
        Some(json!({
            "received": {"region": {"name": "eu", "zones": 2}, "shard": 1, "of": "1 of 3"},
            "auth": "[redacted]",
        }))
    );

    // Not a shard: the body cannot be filled, nothing is sent or stored.
    let run = self::run(&handler, Value::Null).await;
    let err = run.result.as_ref().unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.message()
            .contains("has no value: run 42 is not a task of a sharded job"),
        "{err}"
    );
    assert_eq!(run.output, None);

    // Text: status and body.
    let allow = format!("allow = [\"{base}/jobs/\"]");
    let run = self::run(&format!("url = \"{base}/jobs/ok\"\n{allow}"), Value::Null).await;
    assert_eq!(
        run.output,
        Some(json!({"status": 200, "body": "done\nsecond line"}))
    );

    // Read up to max_response, then cut to fit the output limit.
    let run = self::run(
        &format!("url = \"{base}/jobs/big\"\n{allow}\nmax_response = \"1MiB\""),
        Value::Null,
    )
    .await;
    let output = run.output.unwrap();
    let body = output["body"].as_str().unwrap();
    assert!(body.len() < MAX_TASK_OUTPUT_BYTES && body.len() > MAX_TASK_OUTPUT_BYTES - 64);
    assert!(body.bytes().all(|b| b == b'z'));

    // A status that is not expected stores nothing.
    let run = self::run(
        &format!("url = \"{base}/jobs/status/404\"\n{allow}"),
        Value::Null,
    )
    .await;
    assert!(run.result.is_err());
    assert_eq!(run.output, None);
}

#[tokio::test]
async fn a_slow_endpoint_times_out_as_a_retryable_failure() {
    let (base, _) = server().await;
    let run = run(
        &format!("url = \"{base}/jobs/slow\"\nallow = [\"{base}/jobs/\"]\ntimeout = \"300ms\""),
        Value::Null,
    )
    .await;
    let err = run.result.as_ref().unwrap_err();
    assert!(err.is_retryable());
    assert!(
        err.message().contains("timed out")
            || err.message().contains("no complete response within 300ms"),
        "{err}"
    );
}

#[tokio::test]
async fn params_cannot_move_the_request_outside_the_allow_list() {
    let (base, hits) = server().await;
    let handler = format!("url = \"{base}/jobs/{{path}}\"\nallow = [\"{base}/jobs/\"]");
    for path in [
        "..",
        "%2e%2e",
        "../admin",
        "x/../../admin",
        "?/../admin",
        "#x",
        "@evil.test",
    ] {
        let run = run(&handler, json!({"path": path})).await;
        match run.result {
            Ok(()) => {
                // Encoded into one path segment: still under /jobs/.
                assert_eq!(
                    lines(&run).last().unwrap(),
                    "somewhere under /jobs",
                    "{path}"
                );
            }
            Err(err) => {
                assert!(!err.is_retryable());
                assert!(
                    err.message().starts_with("refused: the URL"),
                    "{path}: {err}"
                );
                assert!(run.logs.iter().any(|(level, _)| *level == Level::Error));
            }
        }
    }
    // ".." alone is a dot segment even when encoded: refused, not sent.
    let run = run(&handler, json!({"path": ".."})).await;
    assert!(matches!(run.result, Err(JobError::Fail { .. })));
    assert_eq!(hits.admin.load(SeqCst), 0, "a param reached /admin");
}

#[test]
fn the_allow_list_is_checked_at_load() {
    let cases = [
        (
            "url = \"http://127.0.0.1:1/admin/{x}\"\nallow = [\"http://127.0.0.1:1/jobs/\"]",
            "runner.toml: handler \"h\": field \"url\" = \"http://127.0.0.1:1/admin/{x}\": is not within the allow list",
        ),
        (
            "url = \"http://127.0.0.1:2/jobs/{x}\"\nallow = [\"http://127.0.0.1:1/jobs/\"]",
            "is not within the allow list",
        ),
        (
            "url = \"http://127.0.0.1:1/jobsx/{x}\"\nallow = [\"http://127.0.0.1:1/jobs\"]",
            "is not within the allow list",
        ),
        (
            "url = \"http://{host}/jobs/\"\nallow = [\"http://127.0.0.1:1/jobs/\"]",
            "placeholders may fill the path and query only",
        ),
        (
            "url = \"http://user:pw@127.0.0.1:1/jobs/\"\nallow = [\"http://127.0.0.1:1/jobs/\"]",
            "must not hold credentials",
        ),
        (
            "url = \"http://127.0.0.1:1/jobs/\"",
            "field \"allow\": missing",
        ),
        (
            "url = \"http://127.0.0.1:1/jobs/\"\nallow = [\"ftp://x/\"]",
            "field \"allow[0]\" = \"ftp://x/\": must be an http:// or https:// URL",
        ),
        (
            "url = \"http://127.0.0.1:1/jobs/\"\nallow = [\"http://127.0.0.1:1/jobs/\"]\nheaders = { Authorization = \"Bearer {env:CHIME_RUNNER_TEST_UNSET}\" }",
            "field \"headers.Authorization\": environment variable CHIME_RUNNER_TEST_UNSET is not set (or empty); export it before starting the runner",
        ),
        (
            "url = \"http://127.0.0.1:1/jobs/\"\nallow = [\"http://127.0.0.1:1/jobs/\"]\nexpect = [500]",
            "field \"retry_statuses\" = 500: status 500 is also in expect; keep it in one",
        ),
        (
            "url = \"http://127.0.0.1:1/jobs/\"\nallow = [\"http://127.0.0.1:1/jobs/\"]\nargv = [\"x\"]",
            "field \"argv\": is a field of kind = \"shell\" handlers; remove it from this http handler",
        ),
    ];
    for (handler, expected) in cases {
        let errors = config(handler).expect_err(handler);
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{handler}\nexpected: {expected}\ngot: {errors:#?}"
        );
    }
    // Within the list: accepted, including a prefix without a trailing slash.
    for (url, allow) in [
        ("http://127.0.0.1:1/jobs/{x}", "http://127.0.0.1:1/jobs/"),
        ("http://127.0.0.1:1/jobs/{x}", "http://127.0.0.1:1/jobs"),
        ("http://127.0.0.1:1/jobs?id={x}", "http://127.0.0.1:1/jobs"),
        ("http://127.0.0.1:80/a", "http://127.0.0.1/"),
    ] {
        let handler = format!("url = \"{url}\"\nallow = [\"{allow}\"]");
        assert!(
            config(&handler).is_ok(),
            "{handler}: {:?}",
            config(&handler).err()
        );
    }
}
