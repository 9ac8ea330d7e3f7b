//! The web dashboard in a real headless Chromium, driven over WebDriver by chromedriver: an
//! operator logs in with a token, triggers a job and watches its run appear and finish; a viewer
//! sees the same pages but cannot trigger; an admin edits a schedule with its live preview; an
//! operator sees the runs-over-time chart, filters and pages runs (older and newer), inspects
//! and replays a dead letter, cancels a run from its page, and the audit page names both; the
//! overview refreshes itself in place and stops when another page opens; an operator replays
//! every dead letter of a group and an admin purges them (an operator cannot); no page logs a
//! console error; user-supplied strings show as text, never as markup; an admin creates, edits
//! and deletes an Asia/Shanghai job through the form, triggers it through the params dialog, and
//! reads its times in its zone, its job page, its report and a readable workers page; an operator
//! previews, starts and cancels a backfill from a job's page (a viewer only previews); the
//! workflows pages list workflows, draw a workflow's DAG and a workflow run's live DAG coloured
//! by its node runs' states, and an operator reruns a failed node and cancels a run (a viewer
//! sees neither button).
//! Screenshots of every page go to `target/dashboard-screenshots/` for a person to look at.
//!
//! chromedriver and chromium come from the Debian packages of those names
//! (`deploy/local/test.sh` installs them when missing). The WebDriver protocol is plain JSON
//! over HTTP, so the test speaks it with the `reqwest` client the API tests already use.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chime_e2e::services::free_port;
use chime_e2e::{AMQP_URL, Setup, wait_for};
use chime_scheduler::auth::{Caller, Role};
use chime_scheduler::ops::Operations;
use chime_scheduler::store::Store;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::common::{RecordingWorker, ServingInstance};

/// Generous: a slow, shared two-core machine renders and polls slowly, but every wait ends as
/// soon as its condition holds.
const PATIENCE: Duration = Duration::from_secs(30);

/// A chromedriver process (in its own process group, with the Chromium it starts) and one
/// WebDriver session. Dropping it kills the whole group, so a failing test leaves no browser.
struct Browser {
    http: reqwest::Client,
    session: String,
    driver: Child,
}

impl Browser {
    async fn start() -> Browser {
        use std::os::unix::process::CommandExt as _;
        let port = free_port().expect("a free port");
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect(
                "chromedriver (Debian package chromium-driver; deploy/local/test.sh installs it)",
            );
        let mut browser = Browser {
            http: reqwest::Client::new(),
            session: format!("http://127.0.0.1:{port}"),
            driver,
        };
        let status = format!("{}/status", browser.session);
        wait_for(PATIENCE, "chromedriver to listen", || async {
            let response = browser.http.get(&status).send().await.ok()?;
            let body: Value = response.json().await.ok()?;
            (body["value"]["ready"] == true).then_some(())
        })
        .await;
        let created = browser
            .command(
                reqwest::Method::POST,
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": "/usr/bin/chromium",
                        "args": ["--headless", "--no-sandbox", "--disable-gpu",
                                 "--disable-background-networking", "--window-size=1280,900"],
                    },
                    "goog:loggingPrefs": {"browser": "ALL"},
                }}}),
            )
            .await;
        let id = created["sessionId"]
            .as_str()
            .expect("session id")
            .to_owned();
        browser.session = format!("{}/session/{id}", browser.session);
        browser
    }

    /// Sends a WebDriver command (`path` relative to the session once there is one) and
    /// returns its `value`, failing the test on a WebDriver error.
    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if !body.is_null() {
            request = request.json(&body);
        }
        let response = request.send().await.expect("WebDriver request");
        let status = response.status();
        let body: Value = response.json().await.expect("WebDriver JSON");
        assert!(status.is_success(), "WebDriver {path}: {status} {body}");
        body["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    async fn eval(&self, script: &str, args: Value) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Waits until the element `css` exists and its text satisfies `good`; returns the text.
    async fn wait_text(&self, css: &str, good: impl Fn(&str) -> bool) -> String {
        let script =
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;";
        let what = format!("the text of {css}");
        wait_for(PATIENCE, &what, || async {
            let text = self
                .try_command("/execute/sync", json!({"script": script, "args": [css]}))
                .await?;
            text.as_str().filter(|t| good(t)).map(str::to_owned)
        })
        .await
    }

    /// Waits for the page at `hash` to finish loading (the script marks it `data-loaded`).
    async fn open(&self, base: &str, hash: &str) {
        self.goto(&format!("{base}/{hash}")).await;
        let page = hash.trim_start_matches("#/");
        let page = page.split('?').next().unwrap_or_default();
        self.wait_text(&format!("#page[data-page=\"{page}\"][data-loaded]"), |_| {
            true
        })
        .await;
    }

    /// Sends a WebDriver command; `None` on a WebDriver error (such as a stale element).
    async fn try_command(&self, path: &str, body: Value) -> Option<Value> {
        let response = self
            .http
            .post(format!("{}{path}", self.session))
            .json(&body)
            .send()
            .await
            .ok()?;
        let ok = response.status().is_success();
        let body: Value = response.json().await.ok()?;
        ok.then(|| body["value"].clone())
    }

    async fn element(&self, css: &str) -> Option<String> {
        let found = self
            .try_command("/element", json!({"using": "css selector", "value": css}))
            .await?;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// Clicks `css` once it exists; a page that re-rendered between finding and clicking (the
    /// runs page refreshes itself) is retried, not failed.
    async fn click(&self, css: &str) {
        wait_for(PATIENCE, &format!("a click on {css}"), || async {
            let element = self.element(css).await?;
            self.try_command(&format!("/element/{element}/click"), json!({}))
                .await
                .map(drop)
        })
        .await;
    }

    /// Waits until `script` returns a value `good` accepts; returns it.
    async fn wait_eval(&self, what: &str, script: &str, good: impl Fn(&Value) -> bool) -> Value {
        wait_for(PATIENCE, what, || async {
            let value = self
                .try_command("/execute/sync", json!({"script": script, "args": []}))
                .await?;
            good(&value).then_some(value)
        })
        .await
    }

    async fn type_into(&self, css: &str, text: &str) {
        wait_for(PATIENCE, &format!("typing into {css}"), || async {
            let element = self.element(css).await?;
            self.try_command(
                &format!("/element/{element}/value"),
                json!({ "text": text }),
            )
            .await
            .map(drop)
        })
        .await;
    }

    async fn screenshot(&self, name: &str) {
        let png = self
            .command(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let bytes = base64_decode(png.as_str().expect("base64 PNG"));
        assert!(bytes.starts_with(b"\x89PNG"), "{name}: not a PNG");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("screenshot directory");
        std::fs::write(dir.join(format!("{name}.png")), bytes).expect("screenshot written");
    }

    /// The browser console's errors since the last call (chromedriver's log endpoint).
    async fn console_errors(&self) -> Vec<String> {
        let entries = self
            .command(reqwest::Method::POST, "/se/log", json!({"type": "browser"}))
            .await;
        entries
            .as_array()
            .expect("log entries")
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].to_string())
            .collect()
    }

    async fn quit(&self) {
        let _ = self.http.delete(&self.session).send().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The group holds chromedriver and every Chromium process it started.
        let group = nix::unistd::Pid::from_raw(self.driver.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.driver.wait();
    }
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("dashboard-screenshots")
}

/// Standard base64 (WebDriver's screenshot encoding), without a dependency for 20 lines.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .map(value)
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// Script: the overview chart's run counts by state, summed over its bars.
const CHART_COUNTS: &str = "const n = {}; \
    for (const r of document.querySelectorAll('#timeline rect.bar')) \
    n[r.dataset.state] = (n[r.dataset.state] || 0) + Number(r.dataset.count); return n;";

#[test]
fn base64_decodes_what_webdriver_sends() {
    assert_eq!(base64_decode("iVBORw=="), b"\x89PNG");
    assert_eq!(base64_decode("aGVsbG8gd29ybGQ="), b"hello world");
    assert_eq!(base64_decode("YWJj"), b"abc");
}

async fn run_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM chime_runs")
        .fetch_one(pool)
        .await
        .expect("count")
}

#[sqlx::test(migrations = "../migrations")]
async fn an_operator_triggers_a_job_and_watches_its_run_finish_and_a_viewer_cannot(pool: PgPool) {
    let group = "dashg";
    let t = Setup::new(&pool).with_groups(&[group]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let (base, operator, viewer) = (
        instance.base.clone(),
        instance.operator.clone(),
        instance.viewer.clone(),
    );
    let http = reqwest::Client::new();
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, group, &["ping"]);

    let page = http.get(&base).send().await.expect("GET /");
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .expect("CSP")
        .to_owned();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(page.text().await.expect("body").contains("dashboard.js"));

    let browser = Browser::start().await;

    // The operator logs in with a token.
    browser.goto(&format!("{base}/")).await;
    browser.wait_text("#login h1", |t| t == "Log in").await;
    browser.screenshot("login").await;
    browser.type_into("#token", &operator).await;
    browser.click("#login-button").await;
    browser
        .wait_text("#whoami", |t| t == "token:alice (operator)")
        .await;

    browser.open(&base, "#/overview").await;
    browser.wait_text("#jobs-count .value", |t| t == "1").await;
    browser.screenshot("overview").await;

    // Triggers `ping` from the jobs page.
    browser.open(&base, "#/jobs").await;
    browser
        .wait_text("tr[data-job=\"ping\"] td", |t| t == "ping")
        .await;
    browser.screenshot("jobs").await;
    assert_eq!(run_count(&pool).await, 0);
    browser
        .click("tr[data-job=\"ping\"] button.trigger:not([disabled])")
        .await;
    browser.wait_text("#trigger-params", |_| true).await;
    browser.click("#trigger-run").await;
    let notice = browser
        .wait_text("#notice", |t| t.starts_with("Triggered ping"))
        .await;
    let run_id: i64 = notice
        .rsplit('#')
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a run id in {notice:?}"));

    // Sees the run appear in the runs list and finish (the page refreshes itself).
    browser.open(&base, "#/runs").await;
    let row = format!("tr[data-run-id=\"{run_id}\"][data-state=\"succeeded\"]");
    browser.wait_text(&row, |t| t.contains("ping")).await;
    browser.screenshot("runs").await;

    // Its detail: state, the attempt and the worker's log line.
    browser.click(&format!("{row} a")).await;
    browser.wait_text("#run-state", |t| t == "succeeded").await;
    browser.wait_text("#logs", |t| t.contains("recorded")).await;
    let requested_by = browser
        .eval(
            "return [...document.querySelectorAll('table.fields tr')]\
             .find(r => r.firstChild.textContent === 'requested by').lastChild.textContent;",
            json!([]),
        )
        .await;
    assert_eq!(requested_by, "token:alice");
    browser.screenshot("run").await;

    // Pause, then resume, from the jobs page.
    browser.open(&base, "#/jobs").await;
    browser.click("tr[data-job=\"ping\"] button.pause").await;
    browser
        .wait_text("tr[data-job=\"ping\"] button.resume", |_| true)
        .await;
    let paused: bool = sqlx::query_scalar("SELECT paused FROM chime_jobs WHERE name = 'ping'")
        .fetch_one(&pool)
        .await
        .expect("paused");
    assert!(paused, "the pause button paused the job");
    browser.click("tr[data-job=\"ping\"] button.resume").await;
    browser
        .wait_text("tr[data-job=\"ping\"] button.pause", |_| true)
        .await;

    // User-supplied strings are text: params carrying markup show literally, and no element
    // comes of them.
    let markup = "<img id=injected src=x onerror=document.title='owned'>";
    let triggered: Value = http
        .post(format!("{base}/api/jobs/ping/trigger"))
        .bearer_auth(&operator)
        .json(&json!({"params": {"note": markup}}))
        .send()
        .await
        .expect("trigger")
        .json()
        .await
        .expect("JSON");
    let hostile = triggered["run_id"].as_i64().expect("run id");
    browser.open(&base, &format!("#/runs/{hostile}")).await;
    browser.wait_text("#run-state", |t| t == "succeeded").await;
    browser
        .wait_text("table.fields", |t| t.contains(markup))
        .await;
    let injected = browser
        .eval(
            "return document.getElementById('injected') === null && document.title === 'Chime';",
            json!([]),
        )
        .await;
    assert_eq!(injected, true, "markup in params became an element");

    // The other pages load too.
    for (hash, name) in [
        ("#/workers", "workers"),
        ("#/queues", "queues"),
        ("#/dead-letters", "dead-letters"),
        ("#/audit", "audit"),
    ] {
        browser.open(&base, hash).await;
        browser.screenshot(name).await;
    }
    browser
        .wait_text("#page tbody", |t| t.contains("token:alice"))
        .await;
    browser.open(&base, "#/workers").await;
    browser
        .wait_text("#page tbody", |t| t.contains(group))
        .await;

    // A viewer sees the jobs but cannot trigger: the button is disabled, and the API refuses.
    browser.click("#logout").await;
    browser.wait_text("#login h1", |t| t == "Log in").await;
    browser.type_into("#token", &viewer).await;
    browser.click("#login-button").await;
    browser
        .wait_text("#whoami", |t| t == "token:grafana (viewer)")
        .await;
    browser.open(&base, "#/jobs").await;
    browser
        .wait_text("tr[data-job=\"ping\"] td", |t| t == "ping")
        .await;
    browser.screenshot("jobs-viewer").await;
    let disabled = browser
        .eval(
            "return document.querySelector('tr[data-job=\"ping\"] button.trigger').disabled;",
            json!([]),
        )
        .await;
    assert_eq!(disabled, true, "a viewer's trigger button is disabled");

    // Until here no page logged an error (the refused request below logs one by design).
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");

    let status = browser
        .command(
            reqwest::Method::POST,
            "/execute/async",
            json!({"script": "const done = arguments[0]; \
                fetch('/api/jobs/ping/trigger', {method: 'POST', headers: \
                {Authorization: 'Bearer ' + sessionStorage.getItem('chime.token')}}) \
                .then(r => done(r.status));", "args": []}),
        )
        .await;
    assert_eq!(status, 403, "the API refuses a viewer's trigger");
    // ... and the console check would have seen such an error.
    let errors = browser.console_errors().await;
    assert!(
        errors.iter().any(|e| e.contains("403")),
        "the refused request is in the console log: {errors:?}"
    );
    assert_eq!(
        run_count(&pool).await,
        2,
        "only the operator's two runs exist"
    );

    // An admin edits the schedule of a job created through the API: a mistake is refused with
    // the API's message, a good schedule is saved and its next five fire times shown.
    let admin = Operations::new(Store::from_pool(pool.clone()), None)
        .create_token(&Caller::cli(), "root", Role::Admin)
        .await
        .expect("token")
        .secret;
    let created = http
        .post(format!("{base}/api/jobs"))
        .bearer_auth(&admin)
        .json(&json!({"name": "report", "group": group, "schedule": "0 0 * * * *"}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), 201);
    browser.click("#logout").await;
    browser.wait_text("#login h1", |t| t == "Log in").await;
    browser.type_into("#token", &admin).await;
    browser.click("#login-button").await;
    browser
        .wait_text("#whoami", |t| t == "token:root (admin)")
        .await;
    browser.open(&base, "#/jobs/report").await;
    let upcoming =
        |minute: &'static str| move |t: &str| t.matches(&format!(":{minute}:00 UTC")).count() == 5;
    browser.wait_text("#upcoming", upcoming("00")).await;
    browser.click("#edit-job").await;
    browser
        .wait_text("#page[data-page=\"jobs/report/edit\"][data-loaded]", |_| {
            true
        })
        .await;
    // The form previews the current schedule at once.
    browser
        .wait_text("#preview[data-state=\"valid\"]", |t| {
            t.matches(":00:00+00:00").count() == 5
        })
        .await;
    let clear = |id: &str| format!("document.getElementById('{id}').value = ''; return true;");
    // A mistake submitted at once (before the debounced preview) is refused with the API's
    // message, and nothing is saved.
    browser.eval(&clear("schedule"), json!([])).await;
    browser.type_into("#schedule", "every tuesday").await;
    browser.click("#job-form button[type=submit]").await;
    browser
        .wait_text("#edit-error", |t| t.contains("field \"schedule\""))
        .await;
    // While typing, a Quartz expression (2-6 = Monday to Friday) in a time zone is previewed
    // in that zone; a wrong zone is named with its fix, and Save is disabled meanwhile.
    browser.eval(&clear("schedule"), json!([])).await;
    browser.type_into("#schedule", "0 15 10 ? * 2-6").await;
    browser.eval(&clear("timezone"), json!([])).await;
    browser.type_into("#timezone", "Asia/Tokio").await;
    browser
        .wait_text("#edit-error", |t| {
            t == "field \"timezone\" = \"Asia/Tokio\": unknown time zone; use an IANA name \
                  such as \"Asia/Tokyo\""
        })
        .await;
    browser.screenshot("job-preview-invalid").await;
    let save_disabled = "return document.querySelector('#job-form button[type=submit]').disabled;";
    assert_eq!(browser.eval(save_disabled, json!([])).await, true);
    browser.eval(&clear("timezone"), json!([])).await;
    browser.type_into("#timezone", "Asia/Tokyo").await;
    browser
        .wait_text("#preview[data-state=\"valid\"]", |t| {
            t.matches("T10:15:00+09:00").count() == 5
        })
        .await;
    assert_eq!(browser.eval(save_disabled, json!([])).await, false);
    browser.screenshot("job-preview").await;
    let stored = || async {
        sqlx::query_as::<_, (Option<String>, Option<String>)>(
            "SELECT spec->>'schedule', spec->>'timezone' FROM chime_jobs WHERE name = 'report'",
        )
        .fetch_one(&pool)
        .await
        .expect("schedule")
    };
    assert_eq!(
        stored().await,
        (Some("0 0 * * * *".into()), Some("UTC".into()))
    );
    // A fixed rate instead, in the same form.
    browser
        .eval(
            "const k = document.getElementById('schedule-kind'); k.value = 'every'; \
             k.dispatchEvent(new Event('input')); return true;",
            json!([]),
        )
        .await;
    browser.eval(&clear("schedule"), json!([])).await;
    browser.type_into("#schedule", "30m").await;
    browser.eval(&clear("timezone"), json!([])).await;
    browser.type_into("#timezone", "UTC").await;
    browser
        .wait_text("#preview[data-state=\"valid\"]", |t| {
            t.matches(":00+00:00").count() == 5
        })
        .await;
    browser.click("#job-form button[type=submit]").await;
    browser
        .wait_text("#notice", |t| t.starts_with("Changed"))
        .await;
    let every: Option<String> =
        sqlx::query_scalar("SELECT spec->>'every' FROM chime_jobs WHERE name = 'report'")
            .fetch_one(&pool)
            .await
            .expect("every");
    assert_eq!(every.as_deref(), Some("30m"));
    assert_eq!(stored().await.0, None, "the cron schedule was replaced");
    // Back to cron, saved: the job's own next fires follow.
    browser
        .wait_text("table.fields", |t| t.contains("every 30m"))
        .await;
    browser.open(&base, "#/jobs/report/edit").await;
    browser
        .eval(
            "const k = document.getElementById('schedule-kind'); k.value = 'schedule'; \
             k.dispatchEvent(new Event('input')); return true;",
            json!([]),
        )
        .await;
    browser.eval(&clear("schedule"), json!([])).await;
    browser.type_into("#schedule", "0 30 * * * *").await;
    browser.click("#job-form button[type=submit]").await;
    browser.wait_text("#upcoming", upcoming("30")).await;
    browser.screenshot("job").await;
    assert_eq!(
        stored().await,
        (Some("0 30 * * * *".into()), Some("UTC".into()))
    );

    browser.quit().await;
    drop(browser);
    worker.stop().await;
    instance.stop().await;
    t.finish().await;
}

/// Logs in with `token` and waits until the page names `whoami`.
async fn login(browser: &Browser, base: &str, token: &str, whoami: &str) {
    browser.goto(&format!("{base}/")).await;
    browser.wait_text("#login h1", |t| t == "Log in").await;
    browser.type_into("#token", token).await;
    browser.click("#login-button").await;
    browser.wait_text("#whoami", |t| t == whoami).await;
}

/// The operator's other pages and actions: the runs-over-time chart, filtering and paging runs,
/// inspecting and replaying a dead letter, cancelling a run, and the audit page showing who
/// did those.
#[sqlx::test(migrations = "../migrations")]
async fn an_operator_pages_runs_replays_a_dead_letter_and_cancels_a_run(pool: PgPool) {
    // `idle` has a job but no worker: its runs wait in the queue.
    let (group, idle) = ("dash2g", "dash2idle");
    let t = Setup::new(&pool).with_groups(&[group, idle]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let (base, operator) = (instance.base.clone(), instance.operator.clone());
    let http = reqwest::Client::new();
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, group, &["ping"]);
    let admin = Operations::new(Store::from_pool(pool.clone()), None)
        .create_token(&Caller::cli(), "root", Role::Admin)
        .await
        .expect("token")
        .secret;
    let created = http
        .post(format!("{base}/api/jobs"))
        .bearer_auth(&admin)
        .json(&json!({"name": "hold", "group": idle}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), 201);
    let trigger = |job: &'static str| {
        let (http, base, operator) = (&http, &base, &operator);
        async move {
            let body: Value = http
                .post(format!("{base}/api/jobs/{job}/trigger"))
                .bearer_auth(operator)
                .send()
                .await
                .expect("trigger")
                .json()
                .await
                .expect("JSON");
            body["run_id"].as_i64().expect("run id")
        }
    };
    let state = |id: i64| {
        let pool = &pool;
        async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM chime_runs WHERE id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .expect("state")
        }
    };

    // Five runs of `ping` that succeed, and a dead one whose message is in the parking lot,
    // with markup in its reason.
    let mut pings = Vec::new();
    for _ in 0..5 {
        pings.push(trigger("ping").await);
    }
    for id in &pings {
        wait_for(PATIENCE, "the run to succeed", || async {
            (state(*id).await == "succeeded").then_some(())
        })
        .await;
    }
    let reason = "attempts exhausted <img id=injected src=x onerror=document.title='owned'>";
    let dead = crate::ops::dead_run(&pool, "ping", group, 3, "boom").await;
    crate::ops::park(&prefix, group, dead, "ping", 3, reason).await;
    crate::ops::wait_drained(&pool, group, 1).await;

    let browser = Browser::start().await;
    login(&browser, &base, &operator, "token:alice (operator)").await;

    // The overview's chart stacks the hour's runs by state.
    browser.open(&base, "#/overview").await;
    browser
        .wait_eval("the chart's bars", CHART_COUNTS, |n| {
            *n == json!({"succeeded": 5, "dead": 1})
        })
        .await;
    browser
        .wait_text("figure.chart ul.legend", |t| {
            t.contains("succeeded") && t.contains("dead")
        })
        .await;
    browser.screenshot("overview-timeline").await;

    // Runs filtered by job and state, two a page: older, older, then newer, newer.
    browser.open(&base, "#/runs?limit=2").await;
    browser
        .type_into("#run-filters input[name=job]", "ping")
        .await;
    browser
        .eval(
            "document.querySelector('#run-filters select[name=state]').value = 'succeeded'; \
             return true;",
            json!([]),
        )
        .await;
    browser.click("#run-filters button").await;
    let rows = "return [...document.querySelectorAll('#page tbody tr')]\
                .map(r => [Number(r.dataset.runId), r.dataset.job, r.dataset.state]);";
    let newest_first: Vec<i64> = pings.iter().rev().copied().collect();
    let page_of = |ids: &[i64]| -> Value {
        ids.iter()
            .map(|id| json!([id, "ping", "succeeded"]))
            .collect()
    };
    let pages = [
        page_of(&newest_first[0..2]),
        page_of(&newest_first[2..4]),
        page_of(&newest_first[4..5]),
    ];
    browser
        .wait_eval("the first filtered page", rows, |v| *v == pages[0])
        .await;
    let hash = browser.eval("return location.hash;", json!([])).await;
    let hash = hash.as_str().expect("hash");
    for part in ["job=ping", "state=succeeded", "limit=2"] {
        assert!(hash.contains(part), "{hash}");
    }
    browser.screenshot("runs-filtered").await;
    for (page, link) in [(1, "#older"), (2, "#older"), (1, "#newer"), (0, "#newer")] {
        browser.click(link).await;
        browser
            .wait_eval(&format!("page {page} after {link}"), rows, |v| {
                *v == pages[page]
            })
            .await;
        let (older, newer) = (page < 2, page > 0);
        let links = browser
            .eval(
                "return [!!document.getElementById('older'), !!document.getElementById('newer')];",
                json!([]),
            )
            .await;
        assert_eq!(links, json!([older, newer]), "page {page}");
    }

    // The dead letter in full: headers as text (the markup stays text), the trigger
    // pretty-printed; then replayed from there, and the run succeeds.
    browser.open(&base, "#/dead-letters").await;
    browser
        .click(&format!("tr[data-run-id=\"{dead}\"] a.inspect"))
        .await;
    let body = browser
        .wait_text("#dl-body", |t| t.contains(&format!("\"run_id\": {dead}")))
        .await;
    assert!(body.starts_with("{\n  \""), "pretty-printed: {body}");
    assert!(body.contains("\n  \"job\": \"ping\""), "{body}");
    browser
        .wait_text("tr[data-header=\"x-chime-dead-reason\"]", |t| {
            t.contains(reason)
        })
        .await;
    browser
        .wait_text("tr[data-header=\"x-chime-attempt\"]", |t| t.ends_with('3'))
        .await;
    let injected = browser
        .eval(
            "return document.getElementById('injected') === null && document.title === 'Chime';",
            json!([]),
        )
        .await;
    assert_eq!(injected, true, "markup in a header became an element");
    browser.screenshot("dead-letter").await;
    browser.click("button.replay:not([disabled])").await;
    browser
        .wait_text("#notice", |t| {
            t.starts_with(&format!("Replayed run #{dead} as attempt "))
        })
        .await;
    browser.wait_text("#run-state", |t| t == "succeeded").await;
    assert_eq!(state(dead).await, "succeeded");
    let parked: Value = http
        .get(format!("{base}/api/dead-letters"))
        .bearer_auth(&operator)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        parked["dead_letters"],
        json!([]),
        "the message left the parking lot"
    );

    // A run of `hold` waits in its queue; the operator cancels it from its page.
    let held = trigger("hold").await;
    wait_for(PATIENCE, "the run to be queued", || async {
        (state(held).await == "queued").then_some(())
    })
    .await;
    browser.open(&base, &format!("#/runs/{held}")).await;
    browser.wait_text("#run-state", |t| t == "queued").await;
    browser.click("button.cancel:not([disabled])").await;
    browser
        .wait_text("#notice", |t| t == "Cancel: cancelled")
        .await;
    browser.wait_text("#run-state", |t| t == "cancelled").await;
    browser.screenshot("run-cancelled").await;
    assert_eq!(state(held).await, "cancelled");

    // The audit page names who cancelled and replayed which run.
    browser.open(&base, "#/audit").await;
    let entries = "return [...document.querySelectorAll('#page tbody tr')]\
                   .map(r => [...r.children].map(c => c.textContent));";
    for (action, run) in [("runs.cancel", held), ("dlq.replay", dead)] {
        browser
            .wait_eval(&format!("the audit entry of {action}"), entries, |rows| {
                rows.as_array().is_some_and(|rows| {
                    rows.iter().any(|row| {
                        let cells: Vec<&str> = row
                            .as_array()
                            .map(|c| c.iter().filter_map(Value::as_str).collect())
                            .unwrap_or_default();
                        cells.contains(&action)
                            && cells.contains(&"token:alice")
                            && cells.contains(&"ok")
                            && cells.contains(&run.to_string().as_str())
                    })
                })
            })
            .await;
    }
    browser.screenshot("audit-actions").await;

    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    browser.quit().await;
    drop(browser);
    worker.stop().await;
    instance.stop().await;
    t.finish().await;
}

/// The overview refreshes itself (a run triggered through the API shows up in its chart without
/// a reload) and stops when another page opens; on the dead-letters page an operator replays
/// every parked run of a group and they run, but cannot purge; an admin purges the group's
/// parking lot, which leaves the list empty and the runs in the database.
#[sqlx::test(migrations = "../migrations")]
async fn the_overview_refreshes_and_dead_letters_are_replayed_in_bulk_and_purged(pool: PgPool) {
    let group = "dash3g";
    let t = Setup::new(&pool).with_groups(&[group]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let (base, operator) = (instance.base.clone(), instance.operator.clone());
    let http = reqwest::Client::new();
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, group, &["ping"]);
    let admin = Operations::new(Store::from_pool(pool.clone()), None)
        .create_token(&Caller::cli(), "root", Role::Admin)
        .await
        .expect("token")
        .secret;
    let state = |id: i64| {
        let pool = &pool;
        async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM chime_runs WHERE id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .expect("state")
        }
    };
    let park_dead = || {
        let (pool, prefix) = (&pool, &prefix);
        async move {
            let id = crate::ops::dead_run(pool, "ping", group, 3, "boom").await;
            crate::ops::park(prefix, group, id, "ping", 3, "attempts exhausted").await;
            id
        }
    };
    let listed = || {
        let (http, base, operator) = (&http, &base, &operator);
        async move {
            let body: Value = http
                .get(format!("{base}/api/dead-letters"))
                .bearer_auth(operator)
                .send()
                .await
                .expect("list")
                .json()
                .await
                .expect("JSON");
            let mut ids: Vec<i64> = body["dead_letters"]
                .as_array()
                .expect("dead letters")
                .iter()
                .filter_map(|d| d["run_id"].as_i64())
                .collect();
            ids.sort_unstable();
            ids
        }
    };
    let replayed = vec![park_dead().await, park_dead().await];
    crate::ops::wait_drained(&pool, group, 2).await;

    let browser = Browser::start().await;
    login(&browser, &base, &operator, "token:alice (operator)").await;

    // The overview shows the two dead runs; a run triggered through the API appears in its
    // chart while the page stays loaded (a mark on the window survives: no reload).
    browser.open(&base, "#/overview").await;
    browser
        .wait_eval("the dead runs in the chart", CHART_COUNTS, |n| {
            *n == json!({"dead": 2})
        })
        .await;
    browser
        .eval("window.notReloaded = true; return true;", json!([]))
        .await;
    let triggered = http
        .post(format!("{base}/api/jobs/ping/trigger"))
        .bearer_auth(&operator)
        .send()
        .await
        .expect("trigger");
    assert!(triggered.status().is_success(), "{}", triggered.status());
    browser
        .wait_eval("the triggered run in the chart", CHART_COUNTS, |n| {
            *n == json!({"dead": 2, "succeeded": 1})
        })
        .await;
    let kept = browser
        .eval(
            "return window.notReloaded === true && location.hash === '#/overview';",
            json!([]),
        )
        .await;
    assert_eq!(kept, true, "the overview refreshed in place");

    // Another page: from now on the overview asks the API nothing (counted below, after the
    // replay, which takes longer than the overview's refresh period).
    browser.open(&base, "#/dead-letters").await;
    browser
        .eval(
            "window.overviewCalls = 0; const fetch = window.fetch; \
             window.fetch = (url, init) => { \
               if (String(url).startsWith('/api/overview')) window.overviewCalls += 1; \
               return fetch(url, init); }; \
             return true;",
            json!([]),
        )
        .await;

    // The operator may replay all, not purge: the button is disabled and the API refuses.
    let purge_disabled = browser
        .eval(
            "const b = document.getElementById('purge'); return b.disabled && b.title;",
            json!([]),
        )
        .await;
    assert_eq!(purge_disabled, json!("needs the admin role"));
    let refused = http
        .post(format!("{base}/api/dead-letters/purge?group={group}"))
        .bearer_auth(&operator)
        .send()
        .await
        .expect("purge");
    assert_eq!(refused.status(), 403);
    assert_eq!(listed().await, replayed, "nothing was purged");

    browser.click("#replay-all:not([disabled])").await;
    let question = browser
        .wait_text("#confirm-replay-all", |t| !t.is_empty())
        .await;
    assert_eq!(question, format!("Confirm replay of 2 messages in {group}"));
    browser.screenshot("dead-letters-confirm-replay").await;
    browser.click("#confirm-replay-all").await;
    let result = browser
        .wait_text("#notice", |t| t.starts_with("Replayed "))
        .await;
    assert_eq!(
        result,
        format!(
            "Replayed 2 runs of {group} (#{}, #{})",
            replayed[0], replayed[1]
        )
    );
    for id in &replayed {
        wait_for(PATIENCE, "the replayed run to succeed", || async {
            (state(*id).await == "succeeded").then_some(())
        })
        .await;
    }
    browser.wait_text("#dl-none", |_| true).await;
    assert_eq!(listed().await, Vec::<i64>::new());
    let calls = browser
        .eval("return [window.overviewCalls, location.hash];", json!([]))
        .await;
    assert_eq!(
        calls,
        json!([0, "#/dead-letters"]),
        "the overview stopped refreshing"
    );

    // Two more parked runs; the admin purges them after confirming.
    let purged = vec![park_dead().await, park_dead().await];
    crate::ops::wait_drained(&pool, group, 2).await;
    browser.click("#logout").await;
    login(&browser, &base, &admin, "token:root (admin)").await;
    browser.open(&base, "#/dead-letters").await;
    let rows = "return [...document.querySelectorAll('#page tbody tr')]\
                .map(r => Number(r.dataset.runId));";
    let shown = browser.eval(rows, json!([])).await;
    assert_eq!(shown, json!(purged));
    browser.click("#purge:not([disabled])").await;
    let question = browser.wait_text("#confirm-purge", |t| !t.is_empty()).await;
    assert_eq!(question, format!("Confirm purge of 2 messages in {group}"));
    browser.screenshot("dead-letters-confirm-purge").await;
    browser.click("#confirm-purge").await;
    let result = browser
        .wait_text("#notice", |t| t.starts_with("Purged "))
        .await;
    assert_eq!(
        result,
        format!("Purged 2 messages from {prefix}.{group}.parking (the runs stay as they are)")
    );
    browser.wait_text("#dl-none", |_| true).await;
    let shown = browser.eval(rows, json!([])).await;
    assert_eq!(shown, json!([]));
    assert_eq!(listed().await, Vec::<i64>::new());
    for id in &purged {
        assert_eq!(state(*id).await, "dead", "run {id} stays");
    }
    browser.screenshot("dead-letters-purged").await;

    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    browser.quit().await;
    drop(browser);
    worker.stop().await;
    instance.stop().await;
    t.finish().await;
}

/// Issue 12: the run page's "Log (live)" box showed a slow handler's lines only once it
/// finished. A handler logs a line every 2 s; each line shows up in the box on its own while the
/// run is still running, and the box follows the newest line.
#[sqlx::test(migrations = "../migrations")]
async fn the_live_log_shows_each_line_of_a_running_handler_as_it_is_logged(pool: PgPool) {
    let group = "dashlogg";
    let t = Setup::new(&pool).with_groups(&[group]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let (base, operator) = (instance.base.clone(), instance.operator.clone());
    const LINES: usize = 4;
    // Once the test has the run's page open, the handler logs a line every 2 s, then holds the
    // run open until the test releases it. After each line it also waits until the test has
    // seen that line on the page, so "one by one" holds however slow a loaded machine makes the
    // browser.
    let (go, release) = (
        chime_worker::CancellationToken::new(),
        chime_worker::CancellationToken::new(),
    );
    let seen_lines: Vec<chime_worker::CancellationToken> = (0..LINES)
        .map(|_| chime_worker::CancellationToken::new())
        .collect();
    let (started, held, acked) = (go.clone(), release.clone(), seen_lines.clone());
    let worker = chime_worker::Worker::builder(group)
        .database_url(&db)
        .amqp_url(AMQP_URL)
        .prefix(&prefix)
        .capacity(1)
        .handle("ping", move |ctx: chime_worker::JobContext, _: Value| {
            let (go, release, seen) = (started.clone(), held.clone(), acked.clone());
            async move {
                go.cancelled().await;
                for (i, seen) in seen.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    ctx.log().info(format!("tick {} of {LINES}", i + 1));
                    seen.cancelled().await;
                }
                release.cancelled().await;
                Ok::<(), chime_worker::JobError>(())
            }
        })
        .build()
        .expect("worker builds");
    let stop = chime_worker::CancellationToken::new();
    let worker = tokio::spawn(worker.run(stop.clone()));

    let browser = Browser::start().await;
    login(&browser, &base, &operator, "token:alice (operator)").await;
    let body: Value = reqwest::Client::new()
        .post(format!("{base}/api/jobs/ping/trigger"))
        .bearer_auth(&operator)
        .send()
        .await
        .expect("trigger")
        .json()
        .await
        .expect("JSON");
    let run_id = body["run_id"].as_i64().expect("run id");
    browser.open(&base, &format!("#/runs/{run_id}")).await;

    // Lines shown, the run's state on the page, and whether the box shows its last line.
    const SEEN: &str = "const box = document.getElementById('logs'); \
        const state = document.getElementById('run-state'); \
        if (!box || !state) return null; \
        return {lines: [...box.querySelectorAll('.line')].map(l => l.textContent.trim()), \
                state: state.textContent, \
                following: box.scrollTop + box.clientHeight >= box.scrollHeight - 4};";
    browser
        .wait_eval("the running run's empty live box", SEEN, |v| {
            v["state"] == "running" && v["lines"] == json!([])
        })
        .await;
    go.cancel();
    for n in 1..=LINES {
        let seen = browser
            .wait_eval(&format!("log line {n} in the live box"), SEEN, |v| {
                v["lines"].as_array().is_some_and(|l| l.len() >= n)
            })
            .await;
        let lines: Vec<&str> = seen["lines"]
            .as_array()
            .expect("lines")
            .iter()
            .map(|l| l.as_str().expect("text"))
            .collect();
        // One by one: the line just logged is there, the next one (2 s away) is not yet.
        assert_eq!(lines.len(), n, "{lines:?}");
        for (i, line) in lines.iter().enumerate() {
            assert!(
                line.ends_with(&format!("info tick {} of {LINES}", i + 1)),
                "{lines:?}"
            );
        }
        assert_eq!(seen["state"], "running", "seen while the run runs");
        assert_eq!(seen["following"], true, "the box follows the newest line");
        seen_lines[n - 1].cancel();
    }
    let title = browser
        .eval(
            "return document.querySelector('h2 .muted').textContent;",
            json!([]),
        )
        .await;
    assert_eq!(title, " (live)");
    browser
        .eval(
            "document.getElementById('logs').scrollIntoView();",
            json!([]),
        )
        .await;
    browser.screenshot("live-log").await;

    release.cancel();
    browser.wait_text("#run-state", |t| t == "succeeded").await;
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    browser.quit().await;
    drop(browser);
    stop.cancel();
    worker
        .await
        .expect("worker task")
        .expect("worker ran cleanly");
    instance.stop().await;
    t.finish().await;
}

/// Sets the value of the form field `id` (replacing what it holds) and tells the page.
async fn set_value(browser: &Browser, id: &str, value: &str) {
    browser
        .eval(
            "const e = document.getElementById(arguments[0]); e.value = arguments[1]; \
             e.dispatchEvent(new Event('input', {bubbles: true})); return true;",
            json!([id, value]),
        )
        .await;
}

/// Script: a chart's counts by state, summed over its bars (`arguments[0]` names the chart).
const BAR_COUNTS: &str = "const n = {}; \
    for (const r of document.querySelectorAll(arguments[0] + ' rect.bar')) \
    n[r.dataset.state] = (n[r.dataset.state] || 0) + Number(r.dataset.count || 1); return n;";

/// An operator coming from XXL-Job: creates a job in Asia/Shanghai through the form (a wrong
/// field is named next to it), reads its times in Shanghai time with UTC on hover, triggers it
/// through the confirmation dialog (Cancel and invalid JSON create nothing; edited params are
/// the run's), edits it, reads its page (recent runs, success rate, duration chart) and its
/// report (runs per day by outcome, p50 and p95), reads the workers page, sees a job-file job
/// as read-only, and deletes the job.
#[sqlx::test(migrations = "../migrations")]
async fn an_admin_manages_a_shanghai_job_triggers_it_with_params_and_reads_its_report(
    pool: PgPool,
) {
    let group = "dash4g";
    let t = Setup::new(&pool).with_groups(&[group]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let base = instance.base.clone();
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, group, &["ping", "shanghai"]);
    let admin = Operations::new(Store::from_pool(pool.clone()), None)
        .create_token(&Caller::cli(), "root", Role::Admin)
        .await
        .expect("token")
        .secret;
    let browser = Browser::start().await;
    login(&browser, &base, &admin, "token:root (admin)").await;

    // Create through the form; a wrong timeout comes back next to its field, nothing saved.
    browser.open(&base, "#/jobs").await;
    browser.click("#new-job").await;
    browser
        .wait_text("#page[data-page=\"new-job\"][data-loaded]", |_| true)
        .await;
    set_value(&browser, "job-name", "shanghai").await;
    set_value(&browser, "job-group", group).await;
    set_value(&browser, "job-description", "daily settlement").await;
    set_value(&browser, "schedule", "0 30 9 * * *").await;
    set_value(&browser, "timezone", "Asia/Shanghai").await;
    set_value(
        &browser,
        "job-params",
        "{\"region\": \"cn\", \"batch\": 500}",
    )
    .await;
    set_value(&browser, "job-timeout", "soon").await;
    browser
        .wait_text("#preview[data-state=\"valid\"]", |t| {
            t.matches("T09:30:00+08:00").count() == 5
        })
        .await;
    browser.click("#job-form button[type=submit]").await;
    browser
        .wait_text(".field-error[data-field=\"timeout\"]", |t| {
            t.contains("soon") || !t.is_empty()
        })
        .await;
    browser.screenshot("job-form-error").await;
    let jobs = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM chime_jobs WHERE name = 'shanghai'")
            .fetch_one(&pool)
            .await
            .expect("count")
    };
    assert_eq!(jobs().await, 0);
    set_value(&browser, "job-timeout", "30s").await;
    browser.click("#job-form button[type=submit]").await;
    browser
        .wait_text("#page[data-page=\"jobs/shanghai\"][data-loaded]", |_| true)
        .await;
    browser
        .wait_text("#notice", |t| t == "Created job shanghai")
        .await;
    assert_eq!(jobs().await, 1);
    // The previews of half-typed schedules and the refused timeout logged their 400s; from
    // here on, no page may log an error.
    browser.console_errors().await;
    // Its next fires read in Shanghai time, with the UTC instant on hover.
    browser
        .wait_text("#upcoming", |t| t.matches("09:30:00 +08:00").count() == 5)
        .await;
    let title = browser
        .eval(
            "return document.querySelector('#upcoming time').title;",
            json!([]),
        )
        .await;
    assert!(
        title.as_str().expect("title").ends_with("01:30:00Z"),
        "{title}"
    );
    browser
        .wait_text("#definition", |t| {
            t.contains("Asia/Shanghai") && t.contains("daily settlement") && t.contains("30s")
        })
        .await;

    // The jobs list shows the next fire in the job's zone too.
    browser.open(&base, "#/jobs").await;
    browser
        .wait_text("tr[data-job=\"shanghai\"]", |t| {
            t.contains("09:30:00 +08:00")
        })
        .await;
    browser.screenshot("jobs-zoned").await;

    // Trigger: Cancel sends nothing; invalid JSON and a non-object are refused here.
    browser
        .click("tr[data-job=\"shanghai\"] button.trigger")
        .await;
    browser.wait_text("#trigger-params", |_| true).await;
    let prefilled = browser
        .eval(
            "return document.getElementById('trigger-params').value;",
            json!([]),
        )
        .await;
    assert_eq!(
        prefilled, "{\n  \"batch\": 500,\n  \"region\": \"cn\"\n}",
        "the job's params, pretty"
    );
    browser.screenshot("trigger-dialog").await;
    browser.click("#trigger-cancel").await;
    browser
        .wait_eval(
            "the dialog to close",
            "return document.getElementById('trigger-dialog') === null;",
            |v| v == true,
        )
        .await;
    browser
        .click("tr[data-job=\"shanghai\"] button.trigger")
        .await;
    set_value(&browser, "trigger-params", "{\"region\": ").await;
    browser.click("#trigger-run").await;
    browser
        .wait_text("#trigger-error", |t| t.contains("not valid JSON"))
        .await;
    browser.screenshot("trigger-dialog-invalid").await;
    set_value(&browser, "trigger-params", "[1, 2]").await;
    browser.click("#trigger-run").await;
    browser
        .wait_text("#trigger-error", |t| t.contains("must be a JSON object"))
        .await;
    assert_eq!(run_count(&pool).await, 0, "nothing was triggered");
    // Run with edited params: the run carries them.
    set_value(
        &browser,
        "trigger-params",
        "{\"region\": \"eu\", \"day\": 3}",
    )
    .await;
    browser.click("#trigger-run").await;
    let notice = browser
        .wait_text("#notice", |t| t.starts_with("Triggered shanghai"))
        .await;
    let run_id: i64 = notice
        .rsplit('#')
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a run id in {notice:?}"));
    let params: Value = sqlx::query_scalar("SELECT params FROM chime_runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(&pool)
        .await
        .expect("params");
    assert_eq!(params, json!({"region": "eu", "day": 3}));
    assert_eq!(run_count(&pool).await, 1);
    wait_for(PATIENCE, "the triggered run to succeed", || async {
        let state: String = sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&pool)
            .await
            .ok()?;
        (state == "succeeded").then_some(())
    })
    .await;
    // Its page: times in Shanghai time (UTC on hover), the duration in words.
    browser.open(&base, &format!("#/runs/{run_id}")).await;
    browser.wait_text("#run-state", |t| t == "succeeded").await;
    let scheduled = browser
        .eval(
            "const row = [...document.querySelectorAll('table.fields tr')]\
             .find(r => r.firstChild.textContent === 'scheduled'); \
             const t = row.querySelector('time'); return [t.textContent, t.title];",
            json!([]),
        )
        .await;
    assert!(
        scheduled[0].as_str().is_some_and(|t| t.ends_with("+08:00"))
            && scheduled[1].as_str().is_some_and(|t| t.ends_with('Z')),
        "{scheduled}"
    );

    // Earlier days' runs, for the report and the page's numbers.
    let day = chrono::Duration::days(1);
    for (ago, state, ms) in [
        (day, "succeeded", Some(850)),
        (day, "succeeded", Some(10_873)),
        (day, "failed", Some(4000)),
        (day * 3, "dead", None),
        (day * 3, "cancelled", None),
    ] {
        let at = chrono::Utc::now() - ago;
        sqlx::query(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                     started_at, finished_at, worker_id)
             VALUES ('shanghai', $1, $2, 'manual', $3, $4, $5, 'seeded-worker')",
        )
        .bind(group)
        .bind(at)
        .bind(state)
        .bind(ms.map(|_| at))
        .bind(ms.map(|ms| at + chrono::Duration::milliseconds(ms)))
        .execute(&pool)
        .await
        .expect("seeded run");
    }

    // Edit through the form: three attempts.
    browser.open(&base, "#/jobs/shanghai/edit").await;
    browser
        .wait_text("#preview[data-state=\"valid\"]", |t| {
            t.matches("T09:30:00+08:00").count() == 5
        })
        .await;
    set_value(&browser, "job-attempts", "3").await;
    browser.screenshot("job-form").await;
    browser.click("#job-form button[type=submit]").await;
    browser
        .wait_text("#notice", |t| t == "Changed job shanghai")
        .await;
    let attempts: Option<String> = sqlx::query_scalar(
        "SELECT spec->'retry'->>'max_attempts' FROM chime_jobs WHERE name = 'shanghai'",
    )
    .fetch_one(&pool)
    .await
    .expect("retry");
    assert_eq!(attempts.as_deref(), Some("3"));

    // The job page: readable definition, recent runs in Shanghai time, success rate, chart.
    browser.open(&base, "#/jobs/shanghai").await;
    browser
        .wait_text("#definition", |t| t.contains("3 attempts"))
        .await;
    browser
        .wait_text(&format!("tr[data-run-id=\"{run_id}\"]"), |t| {
            t.contains("+08:00") && (t.contains(" ms") || t.contains(" s"))
        })
        .await;
    browser
        .wait_text("#success-rate .value", |t| t == "60.0%")
        .await;
    let bars = browser
        .eval(
            "return document.querySelectorAll('#duration-chart rect.bar').length;",
            json!([]),
        )
        .await;
    assert_eq!(bars, 4, "one bar per finished run");
    let durations = browser
        .eval(
            "return [...document.querySelectorAll('#page table tbody tr')].map(r => r.textContent).join('|');",
            json!([]),
        )
        .await;
    let durations = durations.as_str().expect("text");
    assert!(
        durations.contains("850 ms") && durations.contains("10.9 s"),
        "{durations}"
    );
    assert!(!durations.contains("10873"), "{durations}");
    // Its versions, newest first: the edit (attempts 1 -> 3) on top of the creation.
    browser
        .wait_text("#versions tr[data-version=\"2\"]", |t| {
            t.contains("2 (current)") && t.contains("retry.max_attempts: 1 → 3")
        })
        .await;
    browser
        .wait_text("#versions tr[data-version=\"1\"]", |t| {
            t.contains("created")
        })
        .await;
    browser.screenshot("job-page").await;
    // Rolling back to version 1 makes version 3 with one attempt again.
    browser
        .click("#versions tr[data-version=\"1\"] button.rollback")
        .await;
    browser
        .wait_text("#notice", |t| {
            t == "Rolled shanghai back to version 1, now version 3"
        })
        .await;
    let attempts: Option<String> = sqlx::query_scalar(
        "SELECT spec->'retry'->>'max_attempts' FROM chime_jobs WHERE name = 'shanghai'",
    )
    .fetch_one(&pool)
    .await
    .expect("retry");
    assert_eq!(attempts.as_deref(), Some("1"));

    // The report: runs per day by outcome, and durations per day.
    browser.click("#report-link").await;
    browser
        .wait_text(
            "#page[data-page=\"jobs/shanghai/report\"][data-loaded]",
            |_| true,
        )
        .await;
    let counts = browser.eval(BAR_COUNTS, json!(["#report-chart"])).await;
    assert_eq!(
        counts,
        json!({"succeeded": 3, "failed": 1, "dead": 1, "cancelled": 1})
    );
    let dots = browser
        .eval(
            "return document.querySelectorAll('#report-durations circle').length;",
            json!([]),
        )
        .await;
    assert_eq!(dots, 4, "p50 and p95 on the two days with finished runs");
    browser.screenshot("report").await;

    // Runs list: duration and worker columns, times in each job's zone.
    browser.open(&base, "#/runs?job=shanghai").await;
    browser
        .wait_text(&format!("tr[data-run-id=\"{run_id}\"]"), |t| {
            t.contains("+08:00")
        })
        .await;
    browser.screenshot("runs-zoned").await;

    // Workers: a badge, capacity, running, jobs as a list, no raw booleans.
    browser.open(&base, "#/workers").await;
    let row = browser
        .wait_text("tr[data-online=\"true\"]", |t| t.contains("online"))
        .await;
    assert!(!row.contains("true") && !row.contains("false"), "{row}");
    let jobs_listed = browser
        .eval(
            "return [...document.querySelectorAll('tr[data-online=\"true\"] ul.jobs li')].map(l => l.textContent);",
            json!([]),
        )
        .await;
    assert_eq!(jobs_listed, json!(["ping", "shanghai"]));
    browser.screenshot("workers-readable").await;

    // A job-file job is read-only, with a note saying why.
    browser.open(&base, "#/jobs/ping").await;
    browser
        .wait_text("#read-only", |t| t.contains("declared in a job file"))
        .await;
    let controls = browser
        .eval(
            "return document.querySelector('#edit-job, #delete-job') === null;",
            json!([]),
        )
        .await;
    assert_eq!(controls, true, "no edit or delete for a job-file job");

    // Delete, after a confirmation.
    browser.open(&base, "#/jobs/shanghai").await;
    browser.click("#delete-job").await;
    browser.click("#confirm-delete").await;
    browser
        .wait_text("#notice", |t| t == "Deleted job shanghai")
        .await;
    assert_eq!(jobs().await, 0);

    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    browser.quit().await;
    drop(browser);
    worker.stop().await;
    instance.stop().await;
    t.finish().await;
}

/// A run with tasks on the dashboard: the runs list shows the fire with its progress and not its
/// tasks; the run page shows a progress bar and a grid with one cell per task coloured by its
/// state (tooltip: key, worker, attempt, shard), both following the tasks live; a cell opens
/// the task's page, which names its parent; once the run has finished with a failed task an
/// operator reruns it with "Retry failed tasks".
#[sqlx::test(migrations = "../migrations")]
async fn a_run_with_tasks_shows_a_live_task_grid_and_reruns_its_failed_tasks(pool: PgPool) {
    let group = "dashtasks";
    let t = Setup::new(&pool).with_groups(&[group]);
    // A sharded job's fire, expanded into its 12 tasks as the leader would, under a lease the
    // test holds: the serving instance stays a follower and publishes nothing, so the tasks
    // take the states the test gives them.
    sqlx::query(
        "INSERT INTO chime_jobs (name, group_name, spec, source) VALUES ('shards', $1, $2, 'api')",
    )
    .bind(group)
    .bind(json!({"name": "shards", "group": group, "kind": "sharded", "shards": 12}))
    .execute(&pool)
    .await
    .expect("job");
    let parent: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
         VALUES ('shards', $1, now(), 'schedule', 'pending') RETURNING id",
    )
    .bind(group)
    .fetch_one(&pool)
    .await
    .expect("parent");
    sqlx::query(
        "UPDATE chime_leader SET holder = 't', term = 1, expires_at = now() + interval '1 hour'",
    )
    .execute(&pool)
    .await
    .expect("lease");
    let tasks: Vec<i64> = sqlx::query_scalar("SELECT id FROM chime_expand_run('t', 1, $1)")
        .bind(parent)
        .fetch_all(&pool)
        .await
        .expect("expansion");
    assert_eq!(tasks.len(), 12);
    let set = |id: i64, state: &'static str, worker: &'static str| {
        let pool = &pool;
        async move {
            sqlx::query(
                "UPDATE chime_runs SET state = $2, worker_id = $3, attempt = 1,
                        started_at = coalesce(started_at, now() - interval '2 seconds'),
                        finished_at = CASE WHEN chime_run_ended($2) THEN now() END,
                        error = CASE WHEN $2 = 'failed' THEN 'shard 7: upstream refused' END
                  WHERE id = $1",
            )
            .bind(id)
            .bind(state)
            .bind(worker)
            .execute(pool)
            .await
            .expect("task state");
        }
    };
    for (i, id) in tasks.iter().enumerate() {
        match i {
            0..7 => set(*id, "succeeded", if i % 2 == 0 { "w1" } else { "w2" }).await,
            7 => set(*id, "failed", "w2").await,
            8 | 9 => set(*id, "running", "w1").await,
            _ => {}
        }
    }

    let instance = ServingInstance::start(&pool, &t.prefix, group).await;
    let (base, operator) = (instance.base.clone(), instance.operator.clone());
    let browser = Browser::start().await;
    login(&browser, &base, &operator, "token:alice (operator)").await;

    // The runs list: the fire with its progress, none of its tasks.
    browser.open(&base, "#/runs").await;
    let row = format!("tr[data-run-id=\"{parent}\"]");
    browser
        .wait_text(&row, |t| t.contains("7/12 ok, 1 failed, 4 left"))
        .await;
    let rows = browser
        .eval(
            "return document.querySelectorAll('#page tbody tr').length;",
            json!([]),
        )
        .await;
    assert_eq!(rows, 1, "tasks are not listed among runs");

    // The run page: progress in words and as a bar, a cell per task coloured by its state.
    browser.open(&base, &format!("#/runs/{parent}")).await;
    browser
        .wait_text("#task-progress", |t| t == "7/12 ok, 1 failed, 4 left")
        .await;
    let cells = browser
        .eval(
            "return [...document.querySelectorAll('#task-grid a.cell')].map(c => \
             [Number(c.dataset.taskId), c.dataset.state, c.className, c.title]);",
            json!([]),
        )
        .await;
    let cells = cells.as_array().expect("cells");
    assert_eq!(cells.len(), 12, "{cells:?}");
    let states: Vec<&str> = cells.iter().map(|c| c[1].as_str().unwrap_or("")).collect();
    let mut expected = vec!["succeeded"; 7];
    expected.extend(["failed", "running", "running", "queued", "queued"]);
    assert_eq!(states, expected);
    assert_eq!(cells[7][0], tasks[7]);
    assert_eq!(cells[7][2], "cell bar-failed");
    assert_eq!(
        cells[7][3],
        "shard/7 · failed · worker w2 · attempt 1 · shard 7/12"
    );
    let widths = browser
        .eval(
            "return [...document.querySelectorAll('#task-progress-bar > div')]\
             .map(d => Math.round(100 * d.getBoundingClientRect().width / \
                  d.parentElement.getBoundingClientRect().width));",
            json!([]),
        )
        .await;
    assert_eq!(widths, json!([58, 8]), "succeeded 7/12, failed 1/12");
    assert_eq!(
        browser
            .eval(
                "return document.querySelector('button.retry-failed') === null;",
                json!([])
            )
            .await,
        true,
        "no rerun while the run is running"
    );
    browser.screenshot("task-grid").await;

    // Live: a task ends, the page follows within a second or two.
    set(tasks[8], "succeeded", "w1").await;
    browser
        .wait_text("#task-progress", |t| t == "8/12 ok, 1 failed, 3 left")
        .await;
    browser
        .wait_text(
            &format!(
                "#task-grid a.cell[data-task-id=\"{}\"][data-state=\"succeeded\"]",
                tasks[8]
            ),
            |_| true,
        )
        .await;

    // A cell opens the task's page, which names its parent.
    browser
        .click(&format!("#task-grid a.cell[data-task-id=\"{}\"]", tasks[7]))
        .await;
    browser
        .wait_text(
            &format!("#page[data-page=\"runs/{}\"][data-loaded]", tasks[7]),
            |_| true,
        )
        .await;
    let fields = browser
        .wait_text("table.fields", |t| t.contains("task of"))
        .await;
    assert!(fields.contains(&format!("#{parent}")), "{fields}");
    assert!(fields.contains("shard/7 (shard 7/12)"), "{fields}");
    assert!(fields.contains("upstream refused"), "{fields}");

    // Every task ends: the run has failed, and an operator reruns its failed task.
    for id in &tasks[9..] {
        set(*id, "succeeded", "w1").await;
    }
    browser.open(&base, &format!("#/runs/{parent}")).await;
    browser.wait_text("#run-state", |t| t == "failed").await;
    browser.screenshot("task-grid-finished").await;
    browser.click("button.retry-failed:not([disabled])").await;
    let notice = browser
        .wait_text("#notice", |t| t.starts_with("Rerunning"))
        .await;
    assert_eq!(notice, format!("Rerunning 1 task of run #{parent}"));
    let states: Vec<String> =
        sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = ANY($1) ORDER BY id")
            .bind([parent, tasks[7]].as_slice())
            .fetch_all(&pool)
            .await
            .expect("states");
    assert_eq!(
        states,
        ["queued", "pending"],
        "the run runs its failed task again"
    );
    browser
        .wait_text("#task-progress", |t| t == "11/12 ok, 1 left")
        .await;
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chime_audit WHERE action = 'runs.retry_failed' AND outcome = 'ok'
            AND actor = 'token:alice' AND run_id = $1",
    )
    .bind(parent)
    .fetch_one(&pool)
    .await
    .expect("audit");
    assert_eq!(audited, 1);
    assert_eq!(browser.console_errors().await, Vec::<String>::new());

    browser.quit().await;
    drop(browser);
    instance.stop().await;
    t.finish().await;
}

/// Backfills on the job page: a mistake in the range is named next to its field; the preview
/// counts the range's fires and lists each as one to make; an operator starts the backfill
/// (after a second button naming the runs it makes) and sees it in the job's list, which
/// follows its progress without a reload; its runs link lists its run, whose page names the
/// backfill; Cancel cancels it and the run it made, which a second preview then shows as the
/// fire's run. A viewer may preview but not start.
#[sqlx::test(migrations = "../migrations")]
async fn an_operator_previews_starts_and_cancels_a_backfill_on_the_job_page(pool: PgPool) {
    // No worker serves the group: the backfill's first run waits queued, so the backfill (one
    // run at once) stays running until it is cancelled.
    let group = "dashbackfill";
    let t = Setup::new(&pool).with_groups(&[group]);
    let instance = ServingInstance::start(&pool, &t.prefix, group).await;
    let (base, operator, viewer) = (
        instance.base.clone(),
        instance.operator.clone(),
        instance.viewer.clone(),
    );
    let admin = Operations::new(Store::from_pool(pool.clone()), None)
        .create_token(&Caller::cli(), "root", Role::Admin)
        .await
        .expect("token")
        .secret;
    let http = reqwest::Client::new();
    let created = http
        .post(format!("{base}/api/jobs"))
        .bearer_auth(&admin)
        .json(&json!({"name": "hourly", "group": group, "schedule": "0 0 * * * *"}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), 201);
    let backfills = || async {
        sqlx::query_as::<_, (i64, String)>("SELECT id, status FROM chime_backfills ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("backfills")
    };
    // Six hourly fires: the range is from..to with `to` left out.
    let now = chrono::Utc::now();
    let from = (now - chrono::Duration::hours(6)).to_rfc3339();
    let to = now.to_rfc3339();

    let browser = Browser::start().await;
    login(&browser, &base, &operator, "token:alice (operator)").await;
    browser.open(&base, "#/jobs/hourly").await;
    browser
        .wait_text("#backfills", |t| t.contains("No backfills"))
        .await;
    browser
        .eval("window.notReloaded = true; return true;", json!([]))
        .await;

    // A mistake comes back from the API next to its field.
    set_value(&browser, "backfill-from", &from).await;
    set_value(&browser, "backfill-to", "next week").await;
    browser.click("#backfill-preview-button").await;
    browser
        .wait_text(".field-error[data-field=\"to\"]", |t| !t.trim().is_empty())
        .await;
    browser
        .wait_text("#backfill-error", |t| t.contains("field \"to\""))
        .await;
    // That 400 is in the console by design; from here on, nothing may be.
    browser.console_errors().await;

    // The preview: six fires, all to make, nothing saved.
    set_value(&browser, "backfill-to", &to).await;
    set_value(&browser, "backfill-parallel", "1").await;
    browser.click("#backfill-preview-button").await;
    let totals = browser
        .wait_text("#backfill-totals", |t| t.starts_with("6 fires"))
        .await;
    assert!(
        totals.contains("6 to make, 0 with a run already"),
        "{totals}"
    );
    let fires = "return [...document.querySelectorAll('#backfill-fires tbody tr')]\
                 .map(r => [r.dataset.toMake, r.textContent.includes('to make')]);";
    assert_eq!(
        browser.eval(fires, json!([])).await,
        Value::Array(vec![json!(["true", true]); 6]),
        "six fires, each to make"
    );
    assert_eq!(
        browser
            .eval(
                "return document.querySelector('.field-error[data-field=\"to\"]').textContent;",
                json!([]),
            )
            .await,
        "",
        "the mistake's note is gone"
    );
    scroll_to(&browser, "backfill-section").await;
    browser.screenshot("backfill-preview").await;
    assert_eq!(backfills().await, vec![], "a preview saves nothing");

    // Start asks first, naming what it makes; then the backfill is in the list, running.
    browser.click("#backfill-start:not([disabled])").await;
    browser
        .wait_text("#backfill-confirm-start", |t| {
            t == "Confirm backfill of 6 fires: make 6 runs"
        })
        .await;
    assert_eq!(backfills().await, vec![], "nothing before the confirmation");
    browser.click("#backfill-confirm-start").await;
    let notice = browser
        .wait_text("#notice", |t| t.starts_with("Started backfill "))
        .await;
    let id: i64 = notice
        .trim_start_matches("Started backfill ")
        .split(' ')
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a backfill id in {notice:?}"));
    assert!(notice.contains("of hourly: 6 fires"), "{notice}");
    assert_eq!(backfills().await, vec![(id, "running".to_owned())]);
    let row = format!("#backfills tr[data-backfill-id=\"{id}\"]");
    browser
        .wait_text(&format!("{row}[data-state=\"running\"]"), |t| {
            t.contains("token:alice") && t.contains("1 at once") && t.contains("10 a second")
        })
        .await;
    // The list follows the leader making the first run (and no more: it waits, queued)...
    browser
        .wait_text(&row, |t| {
            t.contains("1/6 fires handled (1 made, 0 existing)")
        })
        .await;
    // ...and goes on following it while the page stays as it is: the first run, cancelled
    // through the API, ends, and the leader makes the next.
    let made = || async {
        sqlx::query_scalar::<_, i64>("SELECT id FROM chime_runs WHERE backfill_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(&pool)
            .await
            .expect("runs")
    };
    browser
        .eval(
            "document.getElementById('backfill-form').kept = true; return true;",
            json!([]),
        )
        .await;
    let first = made().await;
    assert_eq!(first.len(), 1, "one run at once: {first:?}");
    let first = first[0];
    let cancelled = http
        .post(format!("{base}/api/runs/{first}/cancel"))
        .bearer_auth(&operator)
        .send()
        .await
        .expect("cancel");
    assert!(cancelled.status().is_success(), "{}", cancelled.status());
    browser
        .wait_text(&row, |t| {
            t.contains("2/6 fires handled (2 made, 0 existing)")
        })
        .await;
    let kept = browser
        .eval(
            "return [window.notReloaded === true, \
             document.getElementById('backfill-form').kept === true, \
             document.getElementById('backfill-parallel').value];",
            json!([]),
        )
        .await;
    assert_eq!(
        kept,
        json!([true, true, "1"]),
        "the list redrew in place, the form as it was"
    );
    scroll_to(&browser, "backfills-title").await;
    browser.screenshot("backfill-running").await;
    let second = made().await[1];

    // Its runs: the two it made, with the backfill as their trigger; a run's page names it.
    browser.click(&format!("{row} a.backfill-runs")).await;
    browser
        .wait_text(
            "#page[data-page=\"runs\"][data-loaded] #backfill-summary",
            |t| t.contains("hourly") && t.contains("running"),
        )
        .await;
    let runs = "return [...document.querySelectorAll('#page tbody tr')]\
                .map(r => [Number(r.dataset.runId), r.dataset.job, r.children[3].textContent]);";
    let trigger = format!("backfill {id}");
    browser
        .wait_eval("the backfill's runs", runs, |v| {
            *v == json!([[second, "hourly", trigger], [first, "hourly", trigger]])
        })
        .await;
    browser.open(&base, &format!("#/runs/{second}")).await;
    let named = browser
        .eval(
            "return [...document.querySelectorAll('table.fields tr')]\
             .find(r => r.firstChild.textContent === 'backfill').lastChild.textContent;",
            json!([]),
        )
        .await;
    assert_eq!(named, trigger);

    // Cancel: the backfill and its waiting run are cancelled, and the list says so.
    browser.open(&base, "#/jobs/hourly").await;
    browser
        .click(&format!("{row} button.cancel-backfill:not([disabled])"))
        .await;
    browser
        .wait_text("#notice", |t| {
            t == format!("Cancelled backfill {id} of hourly: 1 waiting run cancelled")
        })
        .await;
    browser
        .wait_text(&format!("{row}[data-state=\"cancelled\"]"), |t| {
            t.contains("cancelled by token:alice")
        })
        .await;
    let cancel_left = browser
        .eval(
            &format!("return document.querySelector('{row} button.cancel-backfill') === null;"),
            json!([]),
        )
        .await;
    assert_eq!(cancel_left, true, "an ended backfill has no Cancel");
    // The job's recent runs were redrawn with it: its run, cancelled, names the backfill.
    browser
        .wait_text(
            &format!("#recent-runs tr[data-run-id=\"{second}\"][data-state=\"cancelled\"]"),
            |t| t.contains(&trigger),
        )
        .await;
    assert_eq!(backfills().await, vec![(id, "cancelled".to_owned())]);
    let states: Vec<String> =
        sqlx::query_scalar("SELECT state FROM chime_runs WHERE backfill_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(&pool)
            .await
            .expect("states");
    assert_eq!(states, ["cancelled", "cancelled"]);
    assert_eq!(
        made().await,
        [first, second],
        "no run made after the cancel"
    );
    scroll_to(&browser, "backfills-title").await;
    browser.screenshot("backfill-cancelled").await;

    // A second preview shows the fires' runs, links to them, and four fires still to make.
    set_value(&browser, "backfill-from", &from).await;
    set_value(&browser, "backfill-to", &to).await;
    browser.click("#backfill-preview-button").await;
    browser
        .wait_text("#backfill-totals", |t| {
            t.contains("4 to make, 2 with a run already")
        })
        .await;
    let links = browser
        .eval(
            "return [...document.querySelectorAll('#backfill-fires tr[data-run-id]')]\
             .map(r => [r.querySelector('a').getAttribute('href'), r.dataset.toMake]);",
            json!([]),
        )
        .await;
    assert_eq!(
        links,
        json!([
            [format!("#/runs/{first}"), "false"],
            [format!("#/runs/{second}"), "false"]
        ])
    );

    // A viewer previews too, but cannot start.
    browser.click("#logout").await;
    login(&browser, &base, &viewer, "token:grafana (viewer)").await;
    browser.open(&base, "#/jobs/hourly").await;
    let start = browser
        .eval(
            "const b = document.getElementById('backfill-start'); return [b.disabled, b.title];",
            json!([]),
        )
        .await;
    assert_eq!(start, json!([true, "needs the operator role"]));
    set_value(&browser, "backfill-from", &from).await;
    set_value(&browser, "backfill-to", &to).await;
    browser.click("#backfill-preview-button").await;
    browser
        .wait_text("#backfill-totals", |t| t.starts_with("6 fires"))
        .await;

    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    browser.quit().await;
    drop(browser);
    instance.stop().await;
    t.finish().await;
}

/// Scrolls the element `id` to the top of the window, for a screenshot of what follows it.
async fn scroll_to(browser: &Browser, id: &str) {
    browser
        .eval(
            "document.getElementById(arguments[0]).scrollIntoView(); return true;",
            json!([id]),
        )
        .await;
}

/// The jobs of `nightly-etl`'s nodes (docs/workflows.md's example), in its nodes' order.
const WORKFLOW_JOBS: [&str; 7] = [
    "extract-orders",
    "extract-payments",
    "join-orders",
    "load-warehouse",
    "mail-report",
    "rollback-warehouse",
    "drop-staging",
];

/// Script: the DAG's nodes as [node, state, class, href, x, y] (x and y of the box's corner).
const DAG_NODES: &str = "return [...document.querySelectorAll('#wf-dag a.wf-node')].map(n => { \
    const m = n.transform.baseVal.consolidate().matrix; \
    return [n.dataset.node, n.dataset.state, n.getAttribute('class'), n.getAttribute('href'), m.e, m.f]; });";

/// Script: the DAG's edges as [from, to, when].
const DAG_EDGES: &str = "return [...document.querySelectorAll('#wf-dag path.wf-edge')]\
    .map(e => [e.dataset.from, e.dataset.to, e.dataset.when]);";

/// A manual run of workflow `workflow` in `state`, started two minutes ago (and ended now when
/// `state` is an end), as the leader leaves one: a run of the workflow job with no group.
async fn workflow_run_row(
    pool: &PgPool,
    workflow: &str,
    state: &str,
    reason: Option<&str>,
    params: Value,
) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, reason, params,
                                 started_at, finished_at)
         VALUES ($1, '', now() - interval '2 minutes', 'manual', $2, $3, $4,
                 now() - interval '2 minutes', CASE WHEN chime_run_ended($2) THEN now() END)
         RETURNING id",
    )
    .bind(workflow)
    .bind(state)
    .bind(reason)
    .bind(params)
    .fetch_one(pool)
    .await
    .expect("workflow run")
}

/// A screenshot of the page from its top (a hash change keeps the scroll position).
async fn screenshot_from_top(browser: &Browser, name: &str) {
    browser
        .eval("window.scrollTo(0, 0); return true;", json!([]))
        .await;
    browser.screenshot(name).await;
}

/// Round-0 node runs of workflow run `wf`, each (node, job, state, reason), as the leader's
/// advance makes them and workers end them; their ids by node.
async fn node_run_rows(
    pool: &PgPool,
    wf: i64,
    group: &str,
    nodes: &[(String, String, &str, Option<&str>)],
) -> std::collections::HashMap<String, i64> {
    let names: Vec<&str> = nodes.iter().map(|n| n.0.as_str()).collect();
    let jobs: Vec<&str> = nodes.iter().map(|n| n.1.as_str()).collect();
    let states: Vec<&str> = nodes.iter().map(|n| n.2).collect();
    let reasons: Vec<Option<&str>> = nodes.iter().map(|n| n.3).collect();
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, reason,
                                 workflow_run_id, node, node_round, attempt, worker_id,
                                 started_at, finished_at)
         SELECT n.job, $2, now() - interval '2 minutes', 'workflow', n.state, n.reason, $1,
                n.node, 0, CASE WHEN n.state IN ('skipped', 'pending', 'queued') THEN 0 ELSE 1 END,
                CASE WHEN n.state IN ('skipped', 'pending', 'queued') THEN NULL ELSE 'w1' END,
                CASE WHEN n.state IN ('skipped', 'pending', 'queued') THEN NULL
                     ELSE now() - interval '90 seconds' END,
                CASE WHEN chime_run_ended(n.state) THEN now() - interval '30 seconds' END
           FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS n(node, job, state, reason)
         RETURNING id, node",
    )
    .bind(wf)
    .bind(group)
    .bind(&names)
    .bind(&jobs)
    .bind(&states)
    .bind(&reasons)
    .fetch_all(pool)
    .await
    .expect("node runs");
    rows.into_iter().map(|(id, node)| (node, id)).collect()
}

/// `nightly-etl`'s nodes in `states` (in its nodes' order; `None`: waiting, no run yet).
fn etl_nodes<'a>(
    states: [Option<(&'a str, Option<&'a str>)>; 7],
) -> Vec<(String, String, &'a str, Option<&'a str>)> {
    const NODES: [&str; 7] = [
        "orders", "payments", "join", "load", "report", "rollback", "cleanup",
    ];
    NODES
        .iter()
        .zip(WORKFLOW_JOBS)
        .zip(states)
        .filter_map(|((node, job), s)| {
            s.map(|(state, reason)| ((*node).to_owned(), job.to_owned(), state, reason))
        })
        .collect()
}

/// A layered workflow over job `step`: `widths[k]` nodes `sK-J` in layer k, each after one or
/// two nodes of the layer before (some of those edges `failure` or `always`).
fn grid(widths: &[usize]) -> Vec<Value> {
    let mut nodes = Vec::new();
    for (k, &width) in widths.iter().enumerate() {
        for j in 0..width {
            let mut node = json!({"name": format!("s{k}-{j}"), "job": "step"});
            if k > 0 {
                let before = widths[k - 1];
                let mut after = vec![json!(format!("s{}-{}", k - 1, j % before))];
                if before > 1 {
                    let when = match j % 7 {
                        3 => "always",
                        5 => "failure",
                        _ => "success",
                    };
                    after.push(
                        json!({"node": format!("s{}-{}", k - 1, (j + 1) % before), "when": when}),
                    );
                }
                node["after"] = json!(after);
            }
            nodes.push(node);
        }
    }
    nodes
}

/// The edges of `nodes` (what the DAG draws).
fn edge_count(nodes: &[Value]) -> usize {
    nodes
        .iter()
        .map(|n| n["after"].as_array().map_or(0, Vec::len))
        .sum()
}

/// The DAG's nodes as (node, state), after checking that each has its state's class and, with
/// a run, the link to its run page.
async fn dag_states(browser: &Browser) -> Vec<(String, String)> {
    let nodes = browser.eval(DAG_NODES, json!([])).await;
    nodes
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            let (node, state) = (n[0].as_str().expect("node"), n[1].as_str().expect("state"));
            assert_eq!(n[2], format!("wf-node state-{state}"), "{n}");
            if state == "waiting" {
                assert_eq!(n[3], Value::Null, "a waiting node links nowhere: {n}");
            } else {
                assert!(n[3].as_str().is_some_and(|h| h.starts_with("#/")), "{n}");
            }
            (node.to_owned(), state.to_owned())
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// Workflows on the dashboard: the list links to a workflow's page (its definition as a DAG, its
/// runs); a workflow run's page draws the DAG in layers (a column per layer, an edge per
/// `after`, dashed by condition), each node coloured by its run's state and opening its run's
/// page; a running run's page follows its nodes in place; an operator reruns a failed run from
/// a failed node and sees the new round, and cancels a running one; a viewer sees neither
/// button; the job and run pages of a workflow link to it; 50- and 1,000-node DAGs draw, scroll
/// and follow too. The test holds the leader's lease, so the serving instance stays a follower
/// and the runs keep the states the test writes (a rerun needs no leader).
#[sqlx::test(migrations = "../migrations")]
async fn workflow_runs_draw_their_dag_live_and_an_operator_reruns_a_failed_node(pool: PgPool) {
    let group = "dashwf";
    let t = Setup::new(&pool).with_groups(&[group]);
    sqlx::query(
        "UPDATE chime_leader SET holder = 't', term = 1, expires_at = now() + interval '1 hour'",
    )
    .execute(&pool)
    .await
    .expect("lease");
    let ops = Operations::new(Store::from_pool(pool.clone()), None);
    let cli = Caller::cli();
    for name in WORKFLOW_JOBS.iter().chain(&["step"]) {
        ops.create_job(&cli, json!({"name": name, "group": group}))
            .await
            .expect("a node's job");
    }
    ops.create_job(
        &cli,
        json!({
            "name": "nightly-etl", "kind": "workflow",
            "description": "Orders and payments into the warehouse",
            "nodes": [
                {"name": "orders", "job": "extract-orders"},
                {"name": "payments", "job": "extract-payments"},
                {"name": "join", "job": "join-orders", "after": ["orders", "payments"]},
                {"name": "load", "job": "load-warehouse", "after": ["join"]},
                {"name": "report", "job": "mail-report", "after": ["load"], "on_failure": "continue"},
                {"name": "rollback", "job": "rollback-warehouse",
                 "after": [{"node": "load", "when": "failure"}]},
                {"name": "cleanup", "job": "drop-staging", "after": ["load"], "when": "always"},
            ],
        }),
    )
    .await
    .expect("the workflow");
    let fifty = grid(&[3, 6, 10, 12, 10, 6, 3]);
    let thousand = grid(&[50; 20]);
    for (name, nodes) in [("fifty", &fifty), ("thousand", &thousand)] {
        ops.create_job(
            &cli,
            json!({"name": name, "kind": "workflow", "nodes": nodes}),
        )
        .await
        .expect("a large workflow");
    }

    // Three runs of nightly-etl: one running (join runs, load and after wait), one failed
    // (load failed, report skipped, the failure handlers ran), one succeeded.
    let markup = "<img id=injected src=x onerror=document.title='owned'>";
    let ok = Some(("succeeded", None));
    let running = workflow_run_row(
        &pool,
        "nightly-etl",
        "running",
        None,
        json!({"note": markup}),
    )
    .await;
    let running_nodes = node_run_rows(
        &pool,
        running,
        group,
        &etl_nodes([ok, ok, Some(("running", None)), None, None, None, None]),
    )
    .await;
    let failed = workflow_run_row(
        &pool,
        "nightly-etl",
        "failed",
        Some("node load failed"),
        json!({}),
    )
    .await;
    node_run_rows(
        &pool,
        failed,
        group,
        &etl_nodes([
            ok,
            ok,
            ok,
            Some(("failed", None)),
            Some((
                "skipped",
                Some("edge from node load (when = \"success\") not met: it failed"),
            )),
            ok,
            ok,
        ]),
    )
    .await;
    let finished = workflow_run_row(&pool, "nightly-etl", "succeeded", None, json!({})).await;
    node_run_rows(
        &pool,
        finished,
        group,
        &etl_nodes([
            ok,
            ok,
            ok,
            ok,
            ok,
            Some((
                "skipped",
                Some("edge from node load (when = \"failure\") not met: it succeeded"),
            )),
            ok,
        ]),
    )
    .await;

    let instance = ServingInstance::start(&pool, &t.prefix, group).await;
    let (base, operator, viewer) = (
        instance.base.clone(),
        instance.operator.clone(),
        instance.viewer.clone(),
    );
    let browser = Browser::start().await;
    login(&browser, &base, &operator, "token:alice (operator)").await;

    // The list: each workflow's size and latest run; the nav has the page.
    browser.open(&base, "#/workflows").await;
    let row = "tr[data-workflow=\"nightly-etl\"]";
    browser.wait_text(row, |t| t.contains("nightly-etl")).await;
    let cells = "return ['nightly-etl', 'fifty', 'thousand'].map(w => { \
        const r = document.querySelector('tr[data-workflow=\"' + w + '\"]'); \
        return [r.children[1].textContent, r.children[2].textContent, \
                r.querySelector('a.workflow-run-link') && r.querySelector('a.workflow-run-link').getAttribute('href')]; });";
    assert_eq!(
        browser.eval(cells, json!([])).await,
        json!([
            ["7", "4", format!("#/workflows/runs/{finished}")],
            ["50", "7", null],
            ["1000", "20", null]
        ])
    );
    assert_eq!(
        browser
            .eval(
                "return document.querySelector('nav a.current').getAttribute('href');",
                json!([])
            )
            .await,
        "#/workflows"
    );
    screenshot_from_top(&browser, "workflows").await;

    // The workflow's page: its definition as a DAG (a node opens its job) and its runs, each
    // opening its workflow run page.
    browser.click(&format!("{row} td a")).await;
    browser
        .wait_text(
            "#page[data-page=\"workflows/nightly-etl\"][data-loaded]",
            |_| true,
        )
        .await;
    let nodes = browser.eval(DAG_NODES, json!([])).await;
    let nodes = nodes.as_array().expect("nodes");
    assert_eq!(nodes.len(), 7, "{nodes:?}");
    for (n, job) in nodes.iter().zip(WORKFLOW_JOBS) {
        assert_eq!(n[1], "definition", "{n}");
        assert_eq!(n[3], format!("#/jobs/{job}"), "{n}");
    }
    assert_eq!(
        browser
            .eval(DAG_EDGES, json!([]))
            .await
            .as_array()
            .map(Vec::len),
        Some(6)
    );
    let runs = "return [...document.querySelectorAll('#workflow-runs tbody tr')]\
        .map(r => [Number(r.dataset.runId), r.dataset.state, r.querySelector('a').getAttribute('href')]);";
    assert_eq!(
        browser.eval(runs, json!([])).await,
        json!([
            [
                finished,
                "succeeded",
                format!("#/workflows/runs/{finished}")
            ],
            [failed, "failed", format!("#/workflows/runs/{failed}")],
            [running, "running", format!("#/workflows/runs/{running}")],
        ])
    );
    screenshot_from_top(&browser, "workflow").await;

    // The running run: a column per layer, a row per node of the layer, an edge per `after`
    // (dashed for failure, dotted for always), each node in its run's state; Cancel, no Rerun.
    browser
        .click(&format!(
            "#workflow-runs a[href=\"#/workflows/runs/{running}\"]"
        ))
        .await;
    browser
        .wait_text(
            &format!("#page[data-page=\"workflows/runs/{running}\"][data-loaded]"),
            |_| true,
        )
        .await;
    browser.wait_text("#wf-run-state", |t| t == "running").await;
    assert_eq!(
        dag_states(&browser).await,
        pairs(&[
            ("orders", "succeeded"),
            ("payments", "succeeded"),
            ("join", "running"),
            ("load", "waiting"),
            ("report", "waiting"),
            ("rollback", "waiting"),
            ("cleanup", "waiting"),
        ])
    );
    let nodes = browser.eval(DAG_NODES, json!([])).await;
    let x: Vec<f64> = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n[4].as_f64().expect("x"))
        .collect();
    assert_eq!(
        x,
        [12.0, 12.0, 242.0, 472.0, 702.0, 702.0, 702.0],
        "x is the layer"
    );
    let y = |i: usize| nodes[i][5].as_f64().expect("y");
    assert!(
        y(0) < y(1) && y(4) < y(5) && y(5) < y(6),
        "y is the place in the layer: {nodes}"
    );
    assert_eq!(
        browser.eval(DAG_EDGES, json!([])).await,
        json!([
            ["orders", "join", "success"],
            ["payments", "join", "success"],
            ["join", "load", "success"],
            ["load", "report", "success"],
            ["load", "rollback", "failure"],
            ["load", "cleanup", "always"],
        ])
    );
    let dashes = browser
        .eval(
            "return ['success', 'failure', 'always'].map(w => getComputedStyle(\
             document.querySelector('#wf-dag path.when-' + w)).strokeDasharray);",
            json!([]),
        )
        .await;
    assert_eq!(dashes[0], "none", "{dashes}");
    assert_ne!(dashes[1], "none", "{dashes}");
    assert_ne!(dashes[2], "none", "{dashes}");
    browser
        .wait_text("#wf-progress", |t| {
            t == "2 of 7 nodes ended: 1 running, 2 succeeded, 4 waiting"
        })
        .await;
    let buttons = "return [document.querySelectorAll('button.cancel-workflow').length, \
        document.querySelectorAll('button.rerun').length];";
    assert_eq!(browser.eval(buttons, json!([])).await, json!([1, 0]));
    // The params' markup is text.
    browser
        .wait_text("#wf-params", |t| t.contains(markup))
        .await;
    assert_eq!(
        browser
            .eval(
                "return document.getElementById('injected') === null && document.title === 'Chime';",
                json!([]),
            )
            .await,
        true
    );
    screenshot_from_top(&browser, "workflow-run-running").await;

    // Live: join ends and load starts; the page follows in place (the same SVG, no reload).
    browser
        .eval(
            "window.notReloaded = true; document.getElementById('wf-dag').kept = true; return true;",
            json!([]),
        )
        .await;
    sqlx::query("UPDATE chime_runs SET state = 'succeeded', finished_at = now() WHERE id = $1")
        .bind(running_nodes["join"])
        .execute(&pool)
        .await
        .expect("join ends");
    let load = node_run_rows(
        &pool,
        running,
        group,
        &etl_nodes([None, None, None, Some(("running", None)), None, None, None]),
    )
    .await["load"];
    browser
        .wait_text(
            "#wf-dag a.wf-node[data-node=\"load\"][data-state=\"running\"]",
            |_| true,
        )
        .await;
    browser
        .wait_text(
            "#wf-nodes tr[data-node=\"join\"][data-state=\"succeeded\"]",
            |_| true,
        )
        .await;
    browser
        .wait_text("#wf-progress", |t| t.starts_with("3 of 7 nodes ended"))
        .await;
    assert_eq!(
        browser
            .eval(
                "return [window.notReloaded === true, document.getElementById('wf-dag').kept === true];",
                json!([])
            )
            .await,
        json!([true, true]),
        "updated in place"
    );

    // A node opens its run's page.
    browser.click("#wf-dag a.wf-node[data-node=\"load\"]").await;
    browser
        .wait_text(
            &format!("#page[data-page=\"runs/{load}\"][data-loaded]"),
            |_| true,
        )
        .await;
    browser.wait_text("#run-state", |t| t == "running").await;
    let fields = browser
        .wait_text("table.fields", |t| t.contains("load-warehouse"))
        .await;
    assert!(fields.contains("workflow"), "{fields}");
    // The workflow run's page stopped polling: while the run page refreshes itself twice (once
    // a second), nothing asks for the workflow run.
    browser
        .eval(
            "window.calls = {workflow: 0, run: 0}; const fetch = window.fetch; \
             window.fetch = (url, init) => { const u = String(url); \
               if (u.startsWith('/api/workflows/runs/')) window.calls.workflow += 1; \
               if (u.startsWith('/api/runs/')) window.calls.run += 1; \
               return fetch(url, init); }; \
             return true;",
            json!([]),
        )
        .await;
    let calls = browser
        .wait_eval(
            "two refreshes of the run page",
            "return window.calls;",
            |c| c["run"].as_i64().is_some_and(|n| n >= 2),
        )
        .await;
    assert_eq!(calls["workflow"], 0, "{calls}");

    // The failed run: Rerun on every node, no Cancel.
    browser
        .open(&base, &format!("#/workflows/runs/{failed}"))
        .await;
    browser.wait_text("#wf-run-state", |t| t == "failed").await;
    assert_eq!(
        dag_states(&browser).await,
        pairs(&[
            ("orders", "succeeded"),
            ("payments", "succeeded"),
            ("join", "succeeded"),
            ("load", "failed"),
            ("report", "skipped"),
            ("rollback", "succeeded"),
            ("cleanup", "succeeded"),
        ])
    );
    browser
        .wait_text("#wf-run-fields", |t| t.contains("node load failed"))
        .await;
    browser
        .wait_text("#wf-nodes tr[data-node=\"report\"]", |t| {
            t.contains("not met: it failed")
        })
        .await;
    assert_eq!(browser.eval(buttons, json!([])).await, json!([0, 7]));
    screenshot_from_top(&browser, "workflow-run-failed").await;
    scroll_to(&browser, "wf-nodes").await;
    browser.screenshot("workflow-run-nodes").await;

    // An operator reruns it from load: the round changes, load and the nodes after it wait
    // again, the run is running (Cancel instead of Rerun), and the page follows it.
    browser
        .click("#wf-nodes tr[data-node=\"load\"] button.rerun:not([disabled])")
        .await;
    let notice = browser
        .wait_text("#notice", |t| t.starts_with("Rerunning"))
        .await;
    assert!(
        notice.starts_with(&format!(
            "Rerunning workflow run #{failed} from load in round 1: load, "
        )),
        "{notice}"
    );
    browser.wait_text("#wf-round", |t| t == "1").await;
    browser.wait_text("#wf-run-state", |t| t == "running").await;
    browser
        .wait_text(
            "#wf-dag a.wf-node[data-node=\"report\"][data-state=\"waiting\"]",
            |_| true,
        )
        .await;
    assert_eq!(
        dag_states(&browser).await,
        pairs(&[
            ("orders", "succeeded"),
            ("payments", "succeeded"),
            ("join", "succeeded"),
            ("load", "waiting"),
            ("report", "waiting"),
            ("rollback", "waiting"),
            ("cleanup", "waiting"),
        ])
    );
    browser
        .wait_eval("Cancel instead of Rerun", buttons, |v| *v == json!([1, 0]))
        .await;
    let earlier = browser
        .eval(
            "return document.querySelector('#wf-nodes tr[data-node=\"load\"] .earlier-runs').textContent;",
            json!([]),
        )
        .await;
    assert_eq!(earlier, "1", "load's failed run is an earlier round's");
    let rerun: (i32, String, Vec<String>, String) = sqlx::query_as(
        "SELECT round, node, nodes, actor FROM chime_workflow_reruns WHERE run_id = $1",
    )
    .bind(failed)
    .fetch_one(&pool)
    .await
    .expect("the rerun is recorded");
    assert_eq!(
        (rerun.0, rerun.1.as_str(), rerun.3.as_str()),
        (1, "load", "token:alice")
    );
    assert_eq!(rerun.2.len(), 4, "{rerun:?}");
    screenshot_from_top(&browser, "workflow-run-rerun").await;

    // The finished run.
    browser
        .open(&base, &format!("#/workflows/runs/{finished}"))
        .await;
    browser
        .wait_text("#wf-run-state", |t| t == "succeeded")
        .await;
    assert_eq!(
        dag_states(&browser).await,
        pairs(&[
            ("orders", "succeeded"),
            ("payments", "succeeded"),
            ("join", "succeeded"),
            ("load", "succeeded"),
            ("report", "succeeded"),
            ("rollback", "skipped"),
            ("cleanup", "succeeded"),
        ])
    );
    browser
        .wait_text("#wf-progress", |t| {
            t == "7 of 7 nodes ended: 6 succeeded, 1 skipped"
        })
        .await;
    screenshot_from_top(&browser, "workflow-run-finished").await;

    // The workflow's job: the jobs list and its page link to the workflow; its run's page
    // links to the workflow run's.
    browser.open(&base, "#/jobs").await;
    let href = |css: &'static str| {
        let browser = &browser;
        async move {
            browser
                .eval(
                    "const a = document.querySelector(arguments[0]); return a && a.getAttribute('href');",
                    json!([css]),
                )
                .await
        }
    };
    assert_eq!(
        href("tr[data-job=\"nightly-etl\"] a.workflow-link").await,
        "#/workflows/nightly-etl"
    );
    browser.open(&base, "#/jobs/nightly-etl").await;
    assert_eq!(href("#workflow-link").await, "#/workflows/nightly-etl");
    browser.open(&base, &format!("#/runs/{finished}")).await;
    browser.wait_text("#run-state", |t| t == "succeeded").await;
    assert_eq!(
        href("#workflow-run-link").await,
        format!("#/workflows/runs/{finished}")
    );

    // 50 nodes: drawn readably (at least 60%, scrolling where wider), running.
    let fifty_run = workflow_run_row(&pool, "fifty", "running", None, json!({})).await;
    let states = |nodes: &[Value], state: &dyn Fn(usize) -> Option<&'static str>| {
        nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                state(i).map(|s| {
                    (
                        n["name"].as_str().expect("name").to_owned(),
                        "step".to_owned(),
                        s,
                        None,
                    )
                })
            })
            .collect::<Vec<_>>()
    };
    node_run_rows(
        &pool,
        fifty_run,
        group,
        &states(&fifty, &|i| match i {
            0..19 => Some("succeeded"),
            19..24 => Some("succeeded"),
            24..28 => Some("running"),
            28 => Some("retrying"),
            29 | 30 => Some("queued"),
            _ => None,
        }),
    )
    .await;
    browser
        .open(&base, &format!("#/workflows/runs/{fifty_run}"))
        .await;
    browser.wait_text("#wf-run-state", |t| t == "running").await;
    let drawn = dag_states(&browser).await;
    assert_eq!(drawn.len(), 50);
    assert_eq!(drawn.iter().filter(|(_, s)| s == "waiting").count(), 19);
    assert_eq!(
        browser
            .eval(DAG_EDGES, json!([]))
            .await
            .as_array()
            .map(Vec::len),
        Some(edge_count(&fifty))
    );
    let scale = browser
        .eval(
            "return Number(document.getElementById('wf-dag').getAttribute('data-scale'));",
            json!([]),
        )
        .await;
    assert!(
        scale.as_f64().is_some_and(|s| (0.6..=1.0).contains(&s)),
        "{scale}"
    );
    screenshot_from_top(&browser, "workflow-run-50").await;

    // 1,000 nodes: the page opens and follows a node's change in place without freezing.
    let big = workflow_run_row(&pool, "thousand", "running", None, json!({})).await;
    node_run_rows(
        &pool,
        big,
        group,
        &states(&thousand, &|i| match i {
            0..500 => Some("succeeded"),
            500..550 => Some("running"),
            _ => None,
        }),
    )
    .await;
    let started = std::time::Instant::now();
    browser
        .open(&base, &format!("#/workflows/runs/{big}"))
        .await;
    let opened = started.elapsed();
    assert_eq!(
        browser
            .eval(
                "return [document.querySelectorAll('#wf-dag a.wf-node').length, \
                 document.querySelectorAll('#wf-dag path.wf-edge').length, \
                 document.querySelectorAll('#wf-nodes tbody tr').length];",
                json!([])
            )
            .await,
        json!([1000, edge_count(&thousand), 1000])
    );
    browser
        .eval(
            "document.getElementById('wf-dag').kept = true; return true;",
            json!([]),
        )
        .await;
    let changed = std::time::Instant::now();
    node_run_rows(
        &pool,
        big,
        group,
        &[("s11-0".to_owned(), "step".to_owned(), "running", None)],
    )
    .await;
    browser
        .wait_text(
            "#wf-dag a.wf-node[data-node=\"s11-0\"][data-state=\"running\"]",
            |_| true,
        )
        .await;
    let followed = changed.elapsed();
    assert_eq!(
        browser
            .eval(
                "return document.getElementById('wf-dag').kept === true;",
                json!([])
            )
            .await,
        true
    );
    eprintln!("1,000 nodes: the page opened in {opened:?}, followed a change in {followed:?}");
    assert!(
        opened < Duration::from_secs(15) && followed < Duration::from_secs(10),
        "opened in {opened:?}, followed in {followed:?}"
    );
    screenshot_from_top(&browser, "workflow-run-1000").await;

    // Cancel of the running run, from its page.
    browser
        .open(&base, &format!("#/workflows/runs/{running}"))
        .await;
    browser
        .click("button.cancel-workflow:not([disabled])")
        .await;
    browser
        .wait_text("#notice", |t| {
            t == format!("Cancel of workflow run #{running}: cancel_requested")
        })
        .await;
    browser
        .wait_text("#wf-run-fields", |t| t.contains("requested"))
        .await;
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");

    // A viewer reads the same pages without Rerun or Cancel.
    browser.click("#logout").await;
    login(&browser, &base, &viewer, "token:grafana (viewer)").await;
    browser
        .open(&base, &format!("#/workflows/runs/{finished}"))
        .await;
    browser
        .wait_text("#wf-run-state", |t| t == "succeeded")
        .await;
    assert_eq!(dag_states(&browser).await.len(), 7);
    assert_eq!(browser.eval(buttons, json!([])).await, json!([0, 0]));
    browser
        .open(&base, &format!("#/workflows/runs/{failed}"))
        .await;
    browser.wait_text("#wf-run-state", |t| t == "running").await;
    assert_eq!(browser.eval(buttons, json!([])).await, json!([0, 0]));
    browser.open(&base, "#/workflows/nightly-etl").await;
    screenshot_from_top(&browser, "workflow-viewer").await;
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");

    browser.quit().await;
    drop(browser);
    instance.stop().await;
    t.finish().await;
}
