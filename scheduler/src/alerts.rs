//! Alerts, a leader duty: post a webhook when a run is `dead`, an attempt timed out or was lost
//! with its worker, several runs of a job in a row failed, or a workflow run failed or was
//! stopped by its timeout (docs/workflows.md).
//!
//! Events are read from the runs and attempts tables (a cursor on their finish time, re-reading
//! a short overlap so records committed a little late are not missed). Each alert is recorded
//! in `chime_alerts` *before* it is sent, once per (kind, run, attempt) under the leader's fence,
//! so a new leader never sends it again; an alert within `min_interval` of the last one sent for
//! the same (job, kind) is recorded as suppressed instead. Sending happens on its own task with
//! a timeout: a slow or failing webhook is logged and recorded, never fatal, and never holds up
//! the leader.
//!
//! Where an alert goes: the job's own `alerts.webhook`, else its group's override in settings,
//! else the settings' `alerts.webhook`; the same order for the format. A job with none of them
//! gets no alerts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{AlertSettings, webhook_target};
use crate::job::{AlertFormat, AlertSpec};
use crate::store::{AlertEvent, AlertKind, AlertRecord, Fence, Store};

/// How long a webhook may take before the attempt counts as failed.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// How often new events are looked for.
const TICK: Duration = Duration::from_secs(1);
/// On taking office, events this old are still considered (the previous leader may have died
/// before alerting; those it did alert are recorded and not sent twice).
const LOOKBACK: Duration = Duration::from_secs(300);
/// Events are re-read this far behind the cursor, for records committed late (a worker whose
/// database write was retried; its `finished_at` is the attempt's end, not the commit).
const OVERLAP: Duration = Duration::from_secs(15);
/// Without any webhook in settings, how often to check whether a job names one.
const TARGET_CHECK: Duration = Duration::from_secs(30);
/// Events read per query.
const PAGE: i64 = 200;
/// Webhook posts in flight at most; further alerts wait.
const MAX_IN_FLIGHT: usize = 16;

/// Where and how one job's alerts are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Webhook URL.
    pub webhook: String,
    /// Body format.
    pub format: AlertFormat,
    /// Rate limit per (job, kind).
    pub min_interval: Duration,
    /// Consecutive failures that trigger an alert (0: never).
    pub consecutive_failures: u32,
}

/// Resolves a job's route: job, then group override, then settings; `None` without a webhook.
pub fn route(settings: &AlertSettings, group: &str, job: Option<&AlertSpec>) -> Option<Route> {
    let group_settings = settings.groups.get(group);
    let webhook = job
        .and_then(|j| j.webhook.clone())
        .or_else(|| group_settings.and_then(|g| g.webhook.clone()))
        .or_else(|| settings.webhook.clone())?;
    Some(Route {
        webhook,
        format: job
            .and_then(|j| j.format)
            .or_else(|| group_settings.and_then(|g| g.format))
            .unwrap_or(settings.format),
        min_interval: group_settings
            .and_then(|g| g.min_interval)
            .unwrap_or(settings.min_interval),
        consecutive_failures: group_settings
            .and_then(|g| g.consecutive_failures)
            .unwrap_or(settings.consecutive_failures),
    })
}

/// What an alert says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// Kind.
    pub kind: AlertKind,
    /// Job name.
    pub job: String,
    /// Executor group.
    pub group: String,
    /// Run id.
    pub run_id: i64,
    /// Attempt concerned.
    pub attempt: i32,
    /// Error recorded.
    pub error: Option<String>,
    /// When it happened.
    pub at: DateTime<Utc>,
    /// For consecutive failures: how many in a row.
    pub streak: u32,
}

impl Alert {
    /// One line for people.
    pub fn text(&self) -> String {
        let error = self
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        let (job, group, run, attempt) = (&self.job, &self.group, self.run_id, self.attempt);
        match self.kind {
            AlertKind::Dead => {
                format!(
                    "Chime: run {run} of job {job:?} (group {group}) is dead after attempt {attempt}{error}"
                )
            }
            AlertKind::Timeout => format!(
                "Chime: attempt {attempt} of run {run} of job {job:?} (group {group}) timed out{error}"
            ),
            AlertKind::WorkerLost => format!(
                "Chime: attempt {attempt} of run {run} of job {job:?} (group {group}) was lost with its worker{error}"
            ),
            AlertKind::ConsecutiveFailures => format!(
                "Chime: job {job:?} (group {group}) failed {} runs in a row; latest run {run}{error}",
                self.streak
            ),
            AlertKind::WorkflowFailed => {
                format!("Chime: workflow run {run} of {job:?} failed{error}")
            }
            AlertKind::WorkflowTimeout => {
                format!("Chime: workflow run {run} of {job:?} was stopped{error}")
            }
        }
    }

    /// The webhook body in `format`.
    pub fn body(&self, format: AlertFormat) -> serde_json::Value {
        match format {
            AlertFormat::Slack => json!({ "text": self.text() }),
            AlertFormat::Generic => json!({
                "kind": self.kind.as_str(),
                "job": self.job,
                "group": self.group,
                "run_id": self.run_id,
                "attempt": self.attempt,
                "error": self.error,
                "at": self.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "text": self.text(),
            }),
        }
    }
}

/// Runs the alert duty for `fence`'s term until `stop`; cancels `stop` if the lease is lost.
pub async fn run(
    store: Store,
    fence: Fence,
    settings: Arc<AlertSettings>,
    stop: CancellationToken,
) {
    let client = match client() {
        Ok(client) => client,
        Err(e) => {
            warn!(error = %e, "cannot build the HTTP client; alerts are off");
            return;
        }
    };
    let mut alerter = Alerter {
        store,
        fence,
        settings,
        client,
        cursor: None,
        seen: HashMap::new(),
        sending: JoinSet::new(),
        targets_checked: None,
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
            Some(_) = alerter.sending.join_next(), if !alerter.sending.is_empty() => continue,
        }
        match alerter.pass().await {
            Ok(true) => {}
            Ok(false) => {
                warn!(
                    term = alerter.fence.term,
                    "lease lost while alerting; leader duties stop"
                );
                stop.cancel();
                break;
            }
            Err(e) => warn!(error = %format!("{e:#}"), "alert pass failed; next pass retries"),
        }
    }
    // Let posts already under way finish (each is bounded by the webhook timeout).
    let _ = tokio::time::timeout(WEBHOOK_TIMEOUT, async {
        while alerter.sending.join_next().await.is_some() {}
    })
    .await;
    alerter.sending.abort_all();
}

/// The HTTP client for webhooks: rustls, a total timeout per request.
fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(WEBHOOK_TIMEOUT)
        .connect_timeout(WEBHOOK_TIMEOUT)
        .user_agent(concat!("chime/", env!("CARGO_PKG_VERSION")))
        .build()
}

struct Alerter {
    store: Store,
    fence: Fence,
    settings: Arc<AlertSettings>,
    client: reqwest::Client,
    /// Latest event time handled.
    cursor: Option<DateTime<Utc>>,
    /// Events handled within the overlap, with their time.
    seen: HashMap<(&'static str, i64, i32), DateTime<Utc>>,
    sending: JoinSet<()>,
    /// When a job was last looked for a webhook of its own, and whether one had.
    targets_checked: Option<(tokio::time::Instant, bool)>,
}

impl Alerter {
    /// Whether any alert can have a target: a webhook in settings, or a job naming one (checked
    /// every [`TARGET_CHECK`], so the duty costs nothing where alerts are not configured).
    async fn has_targets(&mut self) -> anyhow::Result<bool> {
        if self.settings.any_webhook() {
            return Ok(true);
        }
        match self.targets_checked {
            Some((at, found)) if at.elapsed() < TARGET_CHECK => Ok(found),
            _ => {
                let found = self.store.any_job_alert_webhook().await?;
                self.targets_checked = Some((tokio::time::Instant::now(), found));
                Ok(found)
            }
        }
    }

    /// Handles new events. Returns false when the fence no longer holds.
    async fn pass(&mut self) -> anyhow::Result<bool> {
        if !self.has_targets().await? {
            // Nothing would be sent: move on, so a webhook configured later starts from then.
            self.cursor = Some(self.store.db_now().await?);
            return Ok(true);
        }
        let cursor = match self.cursor {
            Some(c) => c,
            None => {
                let now = self.store.db_now().await?;
                let start = now - chrono::Duration::from_std(LOOKBACK)?;
                self.cursor = Some(start);
                start
            }
        };
        let from = cursor - chrono::Duration::from_std(OVERLAP)?;
        let mut specs: HashMap<String, Option<AlertSpec>> = HashMap::new();
        let mut after: (DateTime<Utc>, i64, &'static str) = (from, 0, "");
        loop {
            let page = self.store.alert_events(after, PAGE).await?;
            let full = i64::try_from(page.len()).unwrap_or(0) >= PAGE;
            for event in page {
                after = (event.at, event.run_id, label(&event));
                let key = (label(&event), event.run_id, event.attempt);
                if self.seen.contains_key(&key) {
                    continue;
                }
                if !self.handle(&event, &mut specs).await? {
                    return Ok(false);
                }
                self.seen.insert(key, event.at);
                if self.cursor.is_none_or(|c| c < event.at) {
                    self.cursor = Some(event.at);
                }
            }
            if !full {
                break;
            }
        }
        let horizon = self.cursor.unwrap_or(cursor) - chrono::Duration::from_std(OVERLAP)?;
        self.seen.retain(|_, at| *at >= horizon);
        Ok(true)
    }

    /// Alerts about one event as its route says. Returns false when the fence no longer holds.
    async fn handle(
        &mut self,
        event: &AlertEvent,
        specs: &mut HashMap<String, Option<AlertSpec>>,
    ) -> anyhow::Result<bool> {
        if !specs.contains_key(&event.job) {
            let spec = self
                .store
                .job(&event.job)
                .await?
                .and_then(|j| j.spec.alerts);
            specs.insert(event.job.clone(), spec);
        }
        let spec = specs.get(&event.job).and_then(Option::as_ref);
        let Some(route) = route(&self.settings, &event.group, spec) else {
            return Ok(true);
        };
        let alert = |kind, streak| Alert {
            kind,
            job: event.job.clone(),
            group: event.group.clone(),
            run_id: event.run_id,
            attempt: event.attempt,
            error: event.error.clone(),
            at: event.at,
            streak,
        };
        if let Some(kind) = event.kind
            && !self.send(alert(kind, 0), &route).await?
        {
            return Ok(false);
        }
        let run_ended = matches!(
            event.kind,
            None | Some(AlertKind::Dead | AlertKind::WorkflowFailed | AlertKind::WorkflowTimeout)
        );
        if run_ended && route.consecutive_failures > 0 {
            let streak = self
                .store
                .failure_streak(&event.job, event.run_id, route.consecutive_failures)
                .await?;
            if streak >= route.consecutive_failures
                && !self
                    .send(alert(AlertKind::ConsecutiveFailures, streak), &route)
                    .await?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records the alert, then posts it on its own task unless suppressed. Returns false when
    /// the fence no longer holds.
    async fn send(&mut self, alert: Alert, route: &Route) -> anyhow::Result<bool> {
        let body = alert.body(route.format);
        let record = AlertRecord {
            kind: alert.kind,
            job: alert.job.clone(),
            group: alert.group.clone(),
            run_id: alert.run_id,
            attempt: alert.attempt,
            target: webhook_target(&route.webhook),
            payload: body.clone(),
            min_interval: route.min_interval,
        };
        let claimed = match self.store.record_alert(&self.fence, &record).await? {
            None => return Ok(false),
            Some(None) => return Ok(true),
            Some(Some(claimed)) => claimed,
        };
        if claimed.suppressed {
            info!(run_id = alert.run_id, job = %alert.job, kind = alert.kind.as_str(),
                  "alert suppressed by the rate limit (recorded)");
            return Ok(true);
        }
        while self.sending.len() >= MAX_IN_FLIGHT {
            self.sending.join_next().await;
        }
        let (store, client, url) = (
            self.store.clone(),
            self.client.clone(),
            route.webhook.clone(),
        );
        self.sending.spawn(async move {
            let target = webhook_target(&url);
            let outcome = post(&client, &url, &body).await;
            match &outcome {
                Ok(()) => info!(run_id = alert.run_id, job = %alert.job,
                                kind = alert.kind.as_str(), %target, "alert sent"),
                Err(e) => warn!(run_id = alert.run_id, job = %alert.job,
                                kind = alert.kind.as_str(), %target, error = %e,
                                "alert webhook failed"),
            }
            let error = outcome.err();
            if let Err(e) = store
                .finish_alert(claimed.id, error.is_none(), error.as_deref())
                .await
            {
                warn!(error = %format!("{e:#}"), "cannot record an alert's delivery");
            }
        });
        Ok(true)
    }
}

/// The event's kind as a sort and de-duplication key.
fn label(event: &AlertEvent) -> &'static str {
    event.kind.map_or("failed", AlertKind::as_str)
}

/// Most bytes of a failing webhook's answer that are read (its start goes into the error); the
/// rest is never read, so a webhook streaming gigabytes costs the leader nothing.
pub const MAX_ERROR_BODY_BYTES: usize = 4 * 1024;

/// The start of `response`'s body, at most `max` bytes (fewer if the body ends or breaks), as
/// text.
async fn read_capped(mut response: reqwest::Response, max: usize) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < max {
        match tokio::time::timeout(WEBHOOK_TIMEOUT, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                let room = max - bytes.len();
                bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Posts `body`; an error says what went wrong (status, timeout, connection).
async fn post(client: &reqwest::Client, url: &str, body: &serde_json::Value) -> Result<(), String> {
    let response = client.post(url).json(body).send().await.map_err(|e| {
        if e.is_timeout() {
            format!("no answer within {WEBHOOK_TIMEOUT:?}")
        } else {
            // Without the URL: it may hold a secret.
            format!("request failed: {}", e.without_url())
        }
    })?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        let text = read_capped(response, MAX_ERROR_BODY_BYTES).await;
        let text: String = text.chars().take(200).collect();
        Err(format!("webhook answered {status}: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GroupAlertSettings;

    fn settings() -> AlertSettings {
        let mut s = AlertSettings {
            webhook: Some("https://hooks.example.com/all".into()),
            ..AlertSettings::default()
        };
        s.groups.insert(
            "billing".into(),
            GroupAlertSettings {
                webhook: Some("https://hooks.example.com/billing".into()),
                format: Some(AlertFormat::Slack),
                min_interval: Some(Duration::from_secs(600)),
                consecutive_failures: Some(5),
            },
        );
        s
    }

    /// Regression: a failing webhook streaming a huge answer had it read in full (1.2 GB each
    /// took the leader from 324 MB to 2.44 GB).
    #[tokio::test]
    async fn a_failing_webhooks_endless_answer_is_read_only_to_the_cap() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            socket
                .write_all(
                    b"HTTP/1.1 500 Internal Server Error\r\n\
                      Content-Length: 4000000000\r\n\r\n",
                )
                .await
                .unwrap();
            let chunk = vec![b'x'; 64 * 1024];
            let mut written = 0usize;
            // Until the client hangs up (or 1 GiB, which would mean it never does).
            while written < (1 << 30) {
                if socket.write_all(&chunk).await.is_err() {
                    break;
                }
                written += chunk.len();
            }
            written
        });
        let error = post(&client().unwrap(), &url, &serde_json::json!({}))
            .await
            .unwrap_err();
        assert!(error.starts_with("webhook answered 500"), "{error}");
        assert!(error.len() < 300, "{} bytes of error", error.len());
        let written = server.await.unwrap();
        // What the socket buffers absorbed before the hang-up, not the body.
        assert!(
            written < 64 << 20,
            "{written} bytes were sent before the client hung up"
        );
    }

    #[test]
    fn routes_prefer_the_job_then_the_group_then_the_settings() {
        let s = settings();
        let r = route(&s, "orders", None).unwrap();
        assert_eq!(r.webhook, "https://hooks.example.com/all");
        assert_eq!(r.format, AlertFormat::Generic);
        assert_eq!(r.min_interval, Duration::from_secs(60));
        assert_eq!(r.consecutive_failures, 3);

        let r = route(&s, "billing", None).unwrap();
        assert_eq!(r.webhook, "https://hooks.example.com/billing");
        assert_eq!(r.format, AlertFormat::Slack);
        assert_eq!(r.min_interval, Duration::from_secs(600));
        assert_eq!(r.consecutive_failures, 5);

        let job = AlertSpec {
            webhook: Some("http://127.0.0.1:9/job".into()),
            format: Some(AlertFormat::Generic),
        };
        let r = route(&s, "billing", Some(&job)).unwrap();
        assert_eq!(r.webhook, "http://127.0.0.1:9/job");
        assert_eq!(r.format, AlertFormat::Generic);
        assert_eq!(r.consecutive_failures, 5, "not a job setting");

        let format_only = AlertSpec {
            webhook: None,
            format: Some(AlertFormat::Slack),
        };
        let r = route(&s, "orders", Some(&format_only)).unwrap();
        assert_eq!(
            (r.webhook.as_str(), r.format),
            ("https://hooks.example.com/all", AlertFormat::Slack)
        );

        assert_eq!(route(&AlertSettings::default(), "orders", None), None);
        assert_eq!(
            route(&AlertSettings::default(), "orders", Some(&format_only)),
            None
        );
    }

    fn alert(kind: AlertKind) -> Alert {
        Alert {
            kind,
            job: "nightly".into(),
            group: "reports".into(),
            run_id: 42,
            attempt: 3,
            error: Some("boom".into()),
            at: "2026-11-30T07:00:00Z".parse().unwrap(),
            streak: 4,
        }
    }

    #[test]
    fn generic_body_has_every_field() {
        let body = alert(AlertKind::Dead).body(AlertFormat::Generic);
        assert_eq!(
            body,
            json!({
                "kind": "dead",
                "job": "nightly",
                "group": "reports",
                "run_id": 42,
                "attempt": 3,
                "error": "boom",
                "at": "2026-11-30T07:00:00.000Z",
                "text": "Chime: run 42 of job \"nightly\" (group reports) is dead after attempt 3: boom",
            })
        );
    }

    #[test]
    fn slack_body_is_only_text() {
        assert_eq!(
            alert(AlertKind::ConsecutiveFailures).body(AlertFormat::Slack),
            json!({"text": "Chime: job \"nightly\" (group reports) failed 4 runs in a row; latest run 42: boom"})
        );
        assert_eq!(
            alert(AlertKind::Timeout).text(),
            "Chime: attempt 3 of run 42 of job \"nightly\" (group reports) timed out: boom"
        );
        let mut lost = alert(AlertKind::WorkerLost);
        lost.error = None;
        assert_eq!(
            lost.text(),
            "Chime: attempt 3 of run 42 of job \"nightly\" (group reports) was lost with its worker"
        );
    }
}
