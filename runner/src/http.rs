//! `kind = "http"` handlers: call a declared HTTP endpoint, map its status to the run's outcome,
//! log its (capped) response body as the task's output and, on an expected status, store it as
//! the run's output (`ctx.set_output`, what a map/reduce reducer reads): the JSON value when it
//! is JSON that fits [`MAX_TASK_OUTPUT_BYTES`], else `{"status": N, "body": "<text cut to fit>"}`.
//!
//! The URL is a template checked against the handler's `allow` list of URL prefixes twice: at
//! load (its fixed part, before any placeholder) and at every run (after the params, each
//! percent-encoded, filled it in). Redirects are not followed. Header values may come from the
//! runner's environment (`{env:TOKEN}`, read at load); they are never logged, and every value
//! that went into a header is replaced by `[redacted]` in every log line and error of the run.

use std::collections::BTreeMap;
use std::time::Duration;

use chime_protocol::limits::{MAX_TASK_OUTPUT_BYTES, jsonb_text_len};
use chime_worker::{JobContext, JobError, Level};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, Url};
use serde_json::Value;
use tokio::time::Instant;

use crate::config::{Check, RawHandler, limits::*, quoted};
use crate::output::{Output, Redactor, human_bytes, pump};
use crate::params::{ParamError, RunValues, excerpt};
use crate::template::{Segment, Template};

/// Longest delay a `Retry-After` header may ask for before the next attempt.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60 * 60);

/// What a param value keeps unencoded in a URL: RFC 3986's unreserved characters.
const URL_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One `allow` entry: scheme, host, port and a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowPrefix {
    source: String,
    scheme: String,
    host: String,
    port: u16,
    path: String,
}

impl AllowPrefix {
    /// Parses an entry such as `https://billing.internal:8443/jobs/`.
    pub fn parse(source: &str) -> Result<AllowPrefix, String> {
        let url = Url::parse(source).map_err(|e| {
            format!(
                "is not a URL ({e}); write a prefix such as \"https://billing.internal:8443/jobs/\""
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("must be an http:// or https:// URL".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("must not hold credentials; put them in a header".into());
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(
                "is a prefix of scheme, host, port and path: remove the query and fragment".into(),
            );
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err("must name a host".into());
        };
        Ok(AllowPrefix {
            source: source.to_owned(),
            scheme: url.scheme().to_owned(),
            host: host.to_owned(),
            port,
            path: url.path().to_owned(),
        })
    }

    fn same_origin(&self, url: &Url) -> bool {
        url.scheme() == self.scheme
            && url.host_str() == Some(self.host.as_str())
            && url.port_or_known_default() == Some(self.port)
    }

    /// True when `path` is this prefix's path or under it (at a segment boundary when the
    /// prefix does not end with `/`).
    fn covers_path(&self, path: &str) -> bool {
        if self.path.ends_with('/') {
            path.starts_with(&self.path)
        } else {
            path == self.path
                || path
                    .strip_prefix(&self.path)
                    .is_some_and(|rest| rest.starts_with('/'))
        }
    }

    /// True when `url` is within this prefix.
    pub fn covers(&self, url: &Url) -> bool {
        self.same_origin(url) && self.covers_path(url.path())
    }
}

/// HTTP statuses, as ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSet(Vec<(u16, u16)>);

impl StatusSet {
    /// True when `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        self.0.iter().any(|(lo, hi)| (*lo..=*hi).contains(&status))
    }

    fn overlap(&self, other: &StatusSet) -> Option<u16> {
        (100..=599).find(|s| self.contains(*s) && other.contains(*s))
    }

    fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(lo, hi)| {
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}-{hi}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Parses one entry: `200`, `"2xx"` or `"500-599"`.
    fn parse_entry(value: &Value) -> Option<(u16, u16)> {
        let valid = |s: u16| (100..=599).contains(&s);
        match value {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|s| valid(*s))
                .map(|s| (s, s)),
            Value::String(s) => {
                if let Some(class) = s.strip_suffix("xx").and_then(|c| c.parse::<u16>().ok()) {
                    return (1..=5)
                        .contains(&class)
                        .then(|| (class * 100, class * 100 + 99));
                }
                if let Some((lo, hi)) = s.split_once('-') {
                    let (lo, hi) = (
                        lo.trim().parse::<u16>().ok()?,
                        hi.trim().parse::<u16>().ok()?,
                    );
                    return (valid(lo) && valid(hi) && lo <= hi).then_some((lo, hi));
                }
                s.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|s| valid(*s))
                    .map(|s| (s, s))
            }
            _ => None,
        }
    }
}

/// A JSON body with string templates.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyTemplate {
    /// A value without strings to fill (null, boolean, number).
    Fixed(Value),
    /// A string: a template (`"{tenant}"` alone is replaced by the param's JSON value).
    Text(Template),
    /// An array.
    Array(Vec<BodyTemplate>),
    /// An object (keys as written).
    Object(Vec<(String, BodyTemplate)>),
}

/// A checked HTTP handler.
#[derive(Debug, Clone)]
pub struct HttpSpec {
    /// The method.
    pub method: Method,
    /// The URL template.
    pub url: Template,
    /// Where the URL may point.
    pub allow: Vec<AllowPrefix>,
    /// Headers: name and value template (`{env:…}` already read into `env`).
    pub headers: Vec<(HeaderName, Template)>,
    /// Values of the `{env:…}` placeholders of headers, read at load.
    env: BTreeMap<String, String>,
    /// The JSON body template.
    pub body: Option<BodyTemplate>,
    /// Statuses that succeed.
    pub expect: StatusSet,
    /// Statuses that are retryable failures (others fail without retry).
    pub retry_statuses: StatusSet,
    /// The request's time limit, response body included.
    pub timeout: Duration,
    /// Most response bytes read.
    pub max_response: u64,
    /// Defaults of params, as text.
    pub defaults: BTreeMap<String, String>,
    client: reqwest::Client,
}

impl HttpSpec {
    /// One line for `--check` (header values never shown).
    pub fn describe(&self) -> String {
        let headers = self
            .headers
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "{} {} (allow {}; headers [{headers}]; expect {}; retry on {}; timeout {}, max_response {})",
            self.method,
            quoted(self.url.source()),
            self.allow
                .iter()
                .map(|a| quoted(&a.source))
                .collect::<Vec<_>>()
                .join(", "),
            self.expect.describe(),
            self.retry_statuses.describe(),
            humantime::format_duration(self.timeout),
            human_bytes(self.max_response),
        )
    }
}

/// Checks the fields of a `kind = "http"` handler.
pub(crate) fn spec(raw: &RawHandler, check: &mut Check<'_>) -> Option<HttpSpec> {
    let before = check.errors_len();
    let defaults = check.defaults(raw);
    let allow: Vec<AllowPrefix> = match &raw.allow {
        None => {
            check.error("allow", None, "missing; list the URL prefixes this handler may call, such as allow = [\"https://billing.internal:8443/jobs/\"]");
            Vec::new()
        }
        Some(list) if list.is_empty() => {
            check.error(
                "allow",
                Some("[]".into()),
                "is empty; list the URL prefixes this handler may call",
            );
            Vec::new()
        }
        Some(list) => {
            check.count("allow", list.len(), MAX_ALLOW);
            list.iter()
                .enumerate()
                .filter_map(|(i, entry)| match AllowPrefix::parse(entry) {
                    Ok(prefix) => Some(prefix),
                    Err(problem) => {
                        check.bad(&format!("allow[{i}]"), entry, problem);
                        None
                    }
                })
                .collect()
        }
    };
    let url = match &raw.url {
        None => {
            check.error("url", None, "missing; give the endpoint, such as url = \"https://billing.internal:8443/jobs/{tenant}/settle\"");
            None
        }
        Some(text) => check_url(text, &allow, check),
    };
    let mut env = BTreeMap::new();
    let mut headers = Vec::new();
    if let Some(raw_headers) = &raw.headers {
        check.count("headers", raw_headers.len(), MAX_ENTRIES);
        for (name, value) in raw_headers {
            let field = format!("headers.{name}");
            let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
                check.error(
                    &field,
                    None,
                    "is not a valid header name: use letters, digits and `-`",
                );
                continue;
            };
            // Values may be secrets: never echoed in messages.
            if value.len() > MAX_TEMPLATE_BYTES {
                check.error(
                    &field,
                    Some(format!("{} bytes", value.len())),
                    format!("must be at most {MAX_TEMPLATE_BYTES} bytes"),
                );
                continue;
            }
            match Template::parse(value, true) {
                Err(e) => check.error(&field, None, e.to_string()),
                Ok(template) => {
                    for segment in template.segments() {
                        if let Segment::Env(var) = segment {
                            match std::env::var(var) {
                                Ok(v) if !v.is_empty() && HeaderValue::from_str(&v).is_ok() => {
                                    env.insert(var.clone(), v);
                                }
                                Ok(v) if !v.is_empty() => check.error(&field, None, format!("environment variable {var} holds characters a header cannot (line breaks, control characters); fix its value")),
                                _ => check.error(&field, None, format!("environment variable {var} is not set (or empty); export it before starting the runner")),
                            }
                        }
                    }
                    if template.is_literal()
                        && HeaderValue::from_str(&template.fixed_prefix()).is_err()
                    {
                        check.error(
                            &field,
                            None,
                            "holds characters a header cannot (line breaks, control characters)",
                        );
                    }
                    headers.push((header, template));
                }
            }
        }
    }
    let body = raw.body.as_ref().and_then(|b| {
        let mut failed = false;
        let template = body_template(b, "body", check, &mut failed, 0);
        let size = b.to_string().len();
        if size > MAX_BODY_BYTES {
            check.error(
                "body",
                Some(format!("{size} bytes")),
                format!(
                    "must be at most {} as JSON",
                    human_bytes(MAX_BODY_BYTES as u64)
                ),
            );
            failed = true;
        }
        (!failed).then_some(template)
    });
    let method = match raw.method.as_deref() {
        None if body.is_some() => Some(Method::POST),
        None => Some(Method::GET),
        Some(m) => match m.to_ascii_uppercase().as_str() {
            "GET" => Some(Method::GET),
            "POST" => Some(Method::POST),
            "PUT" => Some(Method::PUT),
            "PATCH" => Some(Method::PATCH),
            "DELETE" => Some(Method::DELETE),
            "HEAD" => Some(Method::HEAD),
            _ => {
                check.bad("method", m, "must be GET, POST, PUT, PATCH, DELETE or HEAD");
                None
            }
        },
    };
    let expect = statuses(
        check,
        "expect",
        raw.expect.as_deref(),
        StatusSet(vec![(200, 299)]),
    );
    let retry_statuses = statuses(
        check,
        "retry_statuses",
        raw.retry_statuses.as_deref(),
        StatusSet(vec![(429, 429), (500, 599)]),
    );
    if let Some(both) = expect.overlap(&retry_statuses) {
        check.error(
            "retry_statuses",
            Some(both.to_string()),
            format!("status {both} is also in expect; keep it in one"),
        );
    }
    let timeout = match &raw.timeout {
        None => Some(DEFAULT_HTTP_TIMEOUT),
        Some(t) => check.duration("timeout", t, MAX_TIMEOUT),
    };
    let max_response = match &raw.max_response {
        None => Some(DEFAULT_MAX_RESPONSE),
        Some(v) => check.bytes("max_response", v, MIN_MAX_OUTPUT, MAX_MAX_OUTPUT),
    };
    if check.errors_len() > before {
        return None;
    }
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            check.error(
                "kind",
                Some("\"http\"".into()),
                format!("the HTTP client could not be built: {e}"),
            );
            return None;
        }
    };
    Some(HttpSpec {
        method: method?,
        url: url?,
        allow,
        headers,
        env,
        body,
        expect,
        retry_statuses,
        timeout: timeout?,
        max_response: max_response?,
        defaults,
        client,
    })
}

/// Checks the URL template: placeholders only after the host, and its fixed part within an
/// `allow` prefix whatever fills the placeholders.
fn check_url(text: &str, allow: &[AllowPrefix], check: &mut Check<'_>) -> Option<Template> {
    if text.len() > MAX_TEMPLATE_BYTES {
        check.error(
            "url",
            Some(format!("{} bytes", text.len())),
            format!("must be at most {MAX_TEMPLATE_BYTES} bytes"),
        );
        return None;
    }
    let template = match Template::parse(text, false) {
        Ok(t) => t,
        Err(e) => {
            check.bad("url", text, e.to_string());
            return None;
        }
    };
    let fixed = template.fixed_prefix();
    let path_start = fixed
        .split_once("://")
        .and_then(|(scheme, rest)| rest.find('/').map(|i| scheme.len() + 3 + i));
    if !template.is_literal() && path_start.is_none() {
        check.bad("url", text, "placeholders may fill the path and query only: write the scheme, host and port out, followed by `/`");
        return None;
    }
    let parsed = match Url::parse(&fixed) {
        Ok(u) => u,
        Err(e) => {
            check.bad("url", text, format!("is not a URL ({e}); write it like \"https://billing.internal:8443/jobs/{{tenant}}\""));
            return None;
        }
    };
    if !matches!(parsed.scheme(), "http" | "https") {
        check.bad("url", text, "must be an http:// or https:// URL");
        return None;
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        check.bad("url", text, "must not hold credentials; put them in a header such as Authorization = \"Bearer {env:TOKEN}\"");
        return None;
    }
    // Where the first placeholder is: in the path (the path may still grow) or after it.
    let path_is_open =
        !template.is_literal() && !fixed[path_start.unwrap_or(0)..].contains(['?', '#']);
    let covered = allow.iter().any(|prefix| {
        prefix.same_origin(&parsed)
            && if path_is_open {
                let path = parsed.path();
                if prefix.path.ends_with('/') {
                    path.starts_with(&prefix.path)
                } else {
                    path.strip_prefix(&prefix.path)
                        .is_some_and(|rest| rest.starts_with('/'))
                }
            } else {
                prefix.covers_path(parsed.path())
            }
    });
    if !covered && !allow.is_empty() {
        check.bad(
            "url",
            text,
            format!(
                "is not within the allow list ({}): its fixed part {} must start with one of the prefixes; add the endpoint's prefix to `allow` or fix the URL",
                allow.iter().map(|a| quoted(&a.source)).collect::<Vec<_>>().join(", "),
                quoted(&fixed)
            ),
        );
        return None;
    }
    Some(template)
}

fn body_template(
    value: &Value,
    field: &str,
    check: &mut Check<'_>,
    failed: &mut bool,
    depth: usize,
) -> BodyTemplate {
    if depth > 32 {
        check.error(field, None, "nests deeper than 32 levels; flatten the body");
        *failed = true;
        return BodyTemplate::Fixed(Value::Null);
    }
    match value {
        Value::String(text) => match Template::parse(text, false) {
            Ok(t) => BodyTemplate::Text(t),
            Err(e) => {
                check.bad(field, text, e.to_string());
                *failed = true;
                BodyTemplate::Fixed(Value::Null)
            }
        },
        Value::Array(items) => BodyTemplate::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| body_template(v, &format!("{field}[{i}]"), check, failed, depth + 1))
                .collect(),
        ),
        Value::Object(map) => BodyTemplate::Object(
            map.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        body_template(v, &format!("{field}.{k}"), check, failed, depth + 1),
                    )
                })
                .collect(),
        ),
        other => BodyTemplate::Fixed(other.clone()),
    }
}

fn statuses(
    check: &mut Check<'_>,
    field: &str,
    raw: Option<&[Value]>,
    default: StatusSet,
) -> StatusSet {
    let Some(raw) = raw else {
        return default;
    };
    if raw.is_empty() {
        check.error(
            field,
            Some("[]".into()),
            "is empty; list statuses such as [200, \"5xx\", \"500-503\"]",
        );
    }
    let mut ranges = Vec::new();
    for (i, entry) in raw.iter().enumerate() {
        match StatusSet::parse_entry(entry) {
            Some(range) => ranges.push(range),
            None => check.error(&format!("{field}[{i}]"), Some(excerpt(&entry.to_string(), 80)), "is not a status: write 100 to 599, a class such as \"5xx\", or a range such as \"500-503\""),
        }
    }
    StatusSet(ranges)
}

fn param_error(e: ParamError) -> JobError {
    JobError::fail(format!("cannot fill the handler's placeholders: {e}"))
}

/// The URL of one run: params and context percent-encoded into the template, parsed, and
/// checked against the allow list.
pub fn render_url(spec: &HttpSpec, values: &RunValues<'_>) -> Result<Url, JobError> {
    let text = spec
        .url
        .render(|segment| match segment {
            Segment::Param(name) => {
                Ok(utf8_percent_encode(&values.text(name)?, URL_VALUE).to_string())
            }
            Segment::Context(field) => {
                Ok(utf8_percent_encode(&values.context(*field)?, URL_VALUE).to_string())
            }
            Segment::Env(_) | Segment::Literal(_) => Ok(String::new()),
        })
        .map_err(param_error)?;
    let url = Url::parse(&text).map_err(|e| {
        JobError::fail(format!(
            "the URL {text:?} after filling the params is not a URL: {e}"
        ))
    })?;
    if !url.username().is_empty()
        || url.password().is_some()
        || !spec.allow.iter().any(|a| a.covers(&url))
    {
        return Err(JobError::fail(format!(
            "refused: the URL {:?} after filling the params is outside the handler's allow list ({}); the params must not change where the request goes",
            url.as_str(),
            spec.allow
                .iter()
                .map(|a| a.source.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(url)
}

/// The body of one run: a string that is exactly `{param}` becomes the param's JSON value;
/// other strings are filled as text.
pub fn render_body(template: &BodyTemplate, values: &RunValues<'_>) -> Result<Value, ParamError> {
    Ok(match template {
        BodyTemplate::Fixed(v) => v.clone(),
        BodyTemplate::Text(t) => match t.single() {
            Some(Segment::Param(name)) => {
                let value = values.json(name)?;
                if value.to_string().len() > MAX_BODY_BYTES {
                    return Err(ParamError::TooLong {
                        name: name.clone(),
                        len: value.to_string().len(),
                    });
                }
                value
            }
            Some(Segment::Context(field)) => values.context_json(*field)?,
            _ => Value::String(t.render(|segment| match segment {
                Segment::Param(name) => values.text(name),
                Segment::Context(field) => values.context(*field),
                Segment::Env(_) | Segment::Literal(_) => Ok(String::new()),
            })?),
        },
        BodyTemplate::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| render_body(i, values))
                .collect::<Result<_, _>>()?,
        ),
        BodyTemplate::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), render_body(v, values)?)))
                .collect::<Result<_, ParamError>>()?,
        ),
    })
}

/// The headers of one run, and a redactor knowing each of their values.
fn render_headers(
    spec: &HttpSpec,
    values: &RunValues<'_>,
) -> Result<(HeaderMap, Redactor), JobError> {
    let mut headers = HeaderMap::new();
    let mut redactor = Redactor::default();
    for value in spec.env.values() {
        redactor.add(value.clone());
    }
    for (name, template) in &spec.headers {
        let text = template
            .render(|segment| match segment {
                Segment::Param(p) => values.text(p),
                Segment::Context(field) => values.context(*field),
                Segment::Env(var) => Ok(spec.env.get(var).cloned().unwrap_or_default()),
                Segment::Literal(_) => Ok(String::new()),
            })
            .map_err(param_error)?;
        let value = HeaderValue::from_str(&text).map_err(|_| {
            JobError::fail(format!("header {name} would hold characters a header cannot (line breaks, control characters) after filling the params"))
        })?;
        redactor.add(text);
        headers.append(name.clone(), value);
    }
    Ok((headers, redactor))
}

/// What came back.
struct Response {
    status: reqwest::StatusCode,
    retry_after: Option<Duration>,
    body: Vec<u8>,
    cut: bool,
}

async fn exchange(request: reqwest::RequestBuilder, max: u64) -> Result<Response, reqwest::Error> {
    let mut response = request.send().await?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
    let mut body = Vec::new();
    let mut cut = false;
    while let Some(chunk) = response.chunk().await? {
        let room = (max as usize).saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            cut = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Response {
        status,
        retry_after,
        body,
        cut,
    })
}

/// Runs one attempt of an HTTP handler.
pub async fn run(spec: &HttpSpec, ctx: JobContext, params: Value) -> Result<(), JobError> {
    let values = RunValues::new(&ctx, &params, &spec.defaults).map_err(param_error)?;
    let (headers, redactor) = render_headers(spec, &values)?;
    let output = Output::new(ctx.log().clone(), spec.max_response, redactor);
    let url = match render_url(spec, &values) {
        Ok(url) => url,
        Err(e) => {
            output.note(Level::Error, e.message());
            return Err(JobError::fail(output.redactor().redact(e.message())));
        }
    };
    let body = match &spec.body {
        None => None,
        Some(template) => {
            let body = render_body(template, &values).map_err(param_error)?;
            let bytes = serde_json::to_vec(&body)
                .map_err(|e| JobError::fail(format!("the body does not encode as JSON: {e}")))?;
            if bytes.len() > MAX_BODY_BYTES {
                return Err(JobError::fail(format!(
                    "the body is {} bytes after filling the params; at most {}",
                    bytes.len(),
                    human_bytes(MAX_BODY_BYTES as u64)
                )));
            }
            Some(bytes)
        }
    };
    let target = format!("{} {}", spec.method, url);
    output.note(Level::Info, &target);
    let mut request = spec
        .client
        .request(spec.method.clone(), url)
        .headers(headers)
        .timeout(spec.timeout);
    if let Some(body) = body {
        request = request.header(CONTENT_TYPE, "application/json").body(body);
    }
    let started = Instant::now();
    let result = tokio::select! {
        r = tokio::time::timeout(spec.timeout, exchange(request, spec.max_response)) => r,
        () = ctx.cancelled() => {
            let message = format!("{target}: the run was cancelled (job timeout, operator cancel or worker shutdown) before the response came");
            output.note(Level::Warn, &message);
            return Err(JobError::cancel(output.redactor().redact(&message)));
        }
    };
    let elapsed = started.elapsed();
    let response = match result {
        Err(_) => {
            let message = format!(
                "{target}: no complete response within {} (timeout)",
                humantime::format_duration(spec.timeout)
            );
            output.note(Level::Warn, &message);
            return Err(JobError::retry(output.redactor().redact(&message)));
        }
        Ok(Err(e)) => {
            let what = if e.is_timeout() {
                "timed out"
            } else if e.is_connect() {
                "could not connect"
            } else {
                "failed"
            };
            let message = format!("{target}: {what}: {}", error_chain(&e));
            output.note(Level::Warn, &message);
            return Err(JobError::retry(output.redactor().redact(&message)));
        }
        Ok(Ok(response)) => response,
    };
    let status = response.status;
    output.note(
        Level::Info,
        &format!(
            "HTTP {status} in {} ms, {} bytes of body{}",
            elapsed.as_millis(),
            response.body.len(),
            if response.cut { " read" } else { "" }
        ),
    );
    pump(&response.body[..], Level::Info, &output).await;
    if response.cut {
        output.note(
            Level::Warn,
            &format!(
                "… the response body was cut at {} (max_response); the rest was not read",
                human_bytes(spec.max_response)
            ),
        );
    }
    output.finish();
    let code = status.as_u16();
    if spec.expect.contains(code) {
        let stored = response_output(code, &response.body, response.cut, output.redactor());
        return ctx.set_output(&stored).await.map_err(|e| {
            let message = output.with_tail(&format!(
                "{target}: HTTP {status}, but storing the response as the run's output failed: {e}"
            ));
            if e.is_retryable() {
                JobError::retry(message)
            } else {
                JobError::fail(message)
            }
        });
    }
    if spec.retry_statuses.contains(code) {
        let message = output.with_tail(&format!(
            "{target}: HTTP {status} (in retry_statuses: retried under the job's retry policy)"
        ));
        return Err(match response.retry_after {
            Some(after) => JobError::retry_after(after, message),
            None => JobError::retry(message),
        });
    }
    Err(JobError::fail(output.with_tail(&format!(
        "{target}: HTTP {status} (neither in expect nor in retry_statuses: not retried)"
    ))))
}

/// Bytes `c` takes inside a JSON string.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `value` with every secret replaced in its strings and keys; a number holding one becomes the
/// string `[redacted]`.
fn redact_json(value: Value, redactor: &Redactor) -> Value {
    match value {
        Value::String(s) => Value::String(redactor.redact(&s)),
        Value::Number(n) => {
            let text = n.to_string();
            if redactor.redact(&text) == text {
                Value::Number(n)
            } else {
                Value::String("[redacted]".into())
            }
        }
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| redact_json(v, redactor))
                .collect(),
        ),
        Value::Object(entries) => Value::Object(
            entries
                .into_iter()
                .map(|(k, v)| (redactor.redact(&k), redact_json(v, redactor)))
                .collect(),
        ),
        other => other,
    }
}

/// What an expected response stores as the run's output, secrets redacted: the body's JSON value
/// when the body was read whole, is JSON and fits [`MAX_TASK_OUTPUT_BYTES`] (as `jsonb`);
/// otherwise `{"status": N, "body": "<the body as text, cut to fit>"}`.
pub fn response_output(status: u16, body: &[u8], cut: bool, redactor: &Redactor) -> Value {
    if !cut && let Ok(value) = serde_json::from_slice::<Value>(body) {
        let value = redact_json(value, redactor);
        if jsonb_text_len(&value) <= MAX_TASK_OUTPUT_BYTES {
            return value;
        }
    }
    let text = redactor.redact(&String::from_utf8_lossy(body));
    let room =
        MAX_TASK_OUTPUT_BYTES - jsonb_text_len(&serde_json::json!({"status": status, "body": ""}));
    let mut used = 0;
    let end = text
        .char_indices()
        .find_map(|(at, c)| {
            used += escaped_len(c);
            (used > room).then_some(at)
        })
        .unwrap_or(text.len());
    serde_json::json!({"status": status, "body": &text[..end]})
}

/// An error with its sources, `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let line = e.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn redactor() -> Redactor {
        let mut r = Redactor::default();
        r.add("s3cr3t-t0ken");
        r.add("123456789");
        r
    }

    #[test]
    fn a_json_body_that_fits_is_stored_as_its_value_with_secrets_redacted() {
        let body =
            br#"{"token": "s3cr3t-t0ken", "id": 123456789, "rows": [1, 2], "s3cr3t-t0ken": true}"#;
        assert_eq!(
            response_output(200, body, false, &redactor()),
            json!({"token": "[redacted]", "id": "[redacted]", "rows": [1, 2], "[redacted]": true})
        );
        assert_eq!(
            response_output(200, b" 42 ", false, &Redactor::default()),
            json!(42)
        );
        // A JSON string escaping the secret still has it redacted.
        assert_eq!(
            response_output(200, br#""\u0073\u0033cr3t-t0ken""#, false, &redactor()),
            json!("[redacted]")
        );
    }

    #[test]
    fn a_body_that_is_not_json_is_stored_as_status_and_text() {
        assert_eq!(
            response_output(201, b"done, token s3cr3t-t0ken", false, &redactor()),
            json!({"status": 201, "body": "done, token [redacted]"})
        );
        assert_eq!(
            response_output(204, b"", false, &redactor()),
            json!({"status": 204, "body": ""})
        );
        // Cut at max_response: JSON or not, it is not whole.
        assert_eq!(
            response_output(200, b"[1, 2", true, &redactor()),
            json!({"status": 200, "body": "[1, 2"})
        );
        assert_eq!(
            response_output(200, b"12", true, &redactor()),
            json!({"status": 200, "body": "12"})
        );
    }

    #[test]
    fn a_body_too_big_is_cut_to_fit_the_output_limit() {
        // JSON too big: its text, cut.
        let big = json!({"items": vec!["x".repeat(100); 1000]}).to_string();
        let out = response_output(200, big.as_bytes(), false, &redactor());
        assert_eq!(out["status"], 200);
        let text = out["body"].as_str().unwrap();
        assert!(big.starts_with(text) && text.len() < big.len());
        assert!(jsonb_text_len(&out) <= MAX_TASK_OUTPUT_BYTES);
        assert!(
            jsonb_text_len(&out) > MAX_TASK_OUTPUT_BYTES - 4,
            "{}",
            jsonb_text_len(&out)
        );

        // Escapes count at their escaped size; a multi-byte character is never split.
        for filler in ["\"", "\u{1}", "é", "日本"] {
            let body = filler.repeat(MAX_TASK_OUTPUT_BYTES);
            let out = response_output(200, body.as_bytes(), false, &redactor());
            let len = jsonb_text_len(&out);
            assert!(len <= MAX_TASK_OUTPUT_BYTES, "{filler:?}: {len}");
            assert!(len > MAX_TASK_OUTPUT_BYTES - 12, "{filler:?}: {len}");
            assert!(body.starts_with(out["body"].as_str().unwrap()));
        }
    }
}
