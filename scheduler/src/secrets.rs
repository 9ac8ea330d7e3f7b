//! What counts as a secret in a job, and how it is hidden from those who must not see it.
//!
//! Two things in a job definition are secrets: the values of *sensitive params* (in `params`
//! and in a sharded job's `shard_params`) and alert webhook URLs (a Slack or Teams hook's path
//! is its password). A param is sensitive when the
//! job lists its key in `secret_params`, or when the key reads as a credential by convention
//! ([`is_sensitive_key`]: `password`, `secret`, `token`, `api_key`, … as a word of the key, at any
//! depth). Their values are replaced by [`REDACTED`] for viewers (jobs, runs, run errors and
//! log lines), always in the audit log (kept 400 days), and in the error texts recorded there.
//! Operators and admins read definitions in full: they trigger and edit jobs with them.
//!
//! **Invariant:** the pure functions here never fail and never panic, whatever JSON they get.

use serde_json::Value;

use crate::config::webhook_target;
use crate::job::{JobSpec, Kind};

/// What a hidden value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Words that make a param key sensitive by convention (compared per word of the key, case
/// folded; `apiKey`, `api-key` and `API_KEY` are the words `api` and `key`, see
/// [`key_words`]).
const SENSITIVE_WORDS: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "apikey",
    "credential",
    "credentials",
    "passphrase",
];

/// Pairs of adjacent words that make a key sensitive (`api_key`, `private_key`, `access_key`).
const SENSITIVE_PAIRS: &[(&str, &str)] = &[
    ("api", "key"),
    ("private", "key"),
    ("access", "key"),
    ("secret", "key"),
    ("auth", "key"),
];

/// Values shorter than this are not searched for in free text: scrubbing `"1"` out of an error
/// would garble it and protect nothing.
const MIN_SCRUBBED_LEN: usize = 4;

/// The words of a key: split at `_`, `-`, `.`, spaces and lower-to-upper case changes, folded.
fn key_words(key: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in key.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = false;
            continue;
        }
        if c.is_uppercase() && previous_lower && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Whether a param key is sensitive: listed in the job's `secret_params`, or a credential by
/// convention (one of its words is `password`, `secret`, `token`, `apikey`, … or two adjacent
/// words are `api key`, `private key`, `access key`, …).
pub fn is_sensitive_key(key: &str, declared: &[String]) -> bool {
    if declared.iter().any(|d| d == key) {
        return true;
    }
    let words = key_words(key);
    words.iter().any(|w| SENSITIVE_WORDS.contains(&w.as_str()))
        || words
            .windows(2)
            .any(|pair| SENSITIVE_PAIRS.contains(&(pair[0].as_str(), pair[1].as_str())))
}

/// `params` with the value of every sensitive key replaced by [`REDACTED`], at any depth (a
/// `null` stays `null`: there is nothing to hide).
pub fn redact_params(params: &Value, declared: &[String]) -> Value {
    match params {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let value = if is_sensitive_key(key, declared) && !value.is_null() {
                        Value::String(REDACTED.to_owned())
                    } else {
                        redact_params(value, declared)
                    };
                    (key.clone(), value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| redact_params(item, declared))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The texts that must not appear in free text written about these params (errors, log lines):
/// the values of sensitive keys, at any depth, as their JSON text and, for strings, as is.
pub fn secret_values(params: &Value, declared: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    collect_secrets(params, declared, false, &mut found);
    found.retain(|s| s.chars().count() >= MIN_SCRUBBED_LEN);
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found.dedup();
    found
}

fn collect_secrets(value: &Value, declared: &[String], secret: bool, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                collect_secrets(
                    value,
                    declared,
                    secret || is_sensitive_key(key, declared),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for item in items {
                collect_secrets(item, declared, secret, out);
            }
        }
        Value::Null => {}
        Value::String(s) if secret => {
            out.push(s.clone());
            out.push(Value::String(s.clone()).to_string());
        }
        other if secret => out.push(other.to_string()),
        _ => {}
    }
}

/// `text` with every occurrence of each of `secrets` replaced by [`REDACTED`].
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_owned();
    for secret in secrets {
        if !secret.is_empty() && text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), REDACTED);
        }
    }
    text
}

/// `value` with `secrets` replaced by [`REDACTED`] in each of its strings (and object keys),
/// as [`scrub`] does in a text: a handler's output may repeat a secret param.
pub fn scrub_json(value: &Value, secrets: &[String]) -> Value {
    if secrets.is_empty() {
        return value.clone();
    }
    match value {
        Value::String(text) => Value::String(scrub(text, secrets)),
        Value::Array(items) => Value::Array(items.iter().map(|v| scrub_json(v, secrets)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, v)| (scrub(key, secrets), scrub_json(v, secrets)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The job's declared `secret_params` in a definition or change set (the JSON form of a job),
/// ignoring anything that is not a list of strings: this runs before validation.
pub fn declared_in(definition: &Value) -> Vec<String> {
    definition
        .get("secret_params")
        .and_then(Value::as_array)
        .map(|keys| {
            keys.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A job definition or change set (JSON, possibly invalid) with its secrets hidden: sensitive
/// params redacted and `alerts.webhook` cut to its scheme and host. `also_declared` adds the
/// `secret_params` of the job being changed, for change sets that do not repeat them.
pub fn redact_definition(definition: &Value, also_declared: &[String]) -> Value {
    let Value::Object(map) = definition else {
        return definition.clone();
    };
    let mut declared = declared_in(definition);
    declared.extend(also_declared.iter().cloned());
    let mut map = map.clone();
    for key in ["params", "shard_params"] {
        if let Some(params) = map.get_mut(key) {
            *params = redact_params(params, &declared);
        }
    }
    if let Some(Value::Object(alerts)) = map.get_mut("alerts")
        && let Some(Value::String(url)) = alerts.get_mut("webhook")
    {
        *url = webhook_target(url);
    }
    Value::Object(map)
}

/// The texts of a definition or change set that must not appear in an error recorded about it:
/// its sensitive param values and its webhook URL.
pub fn definition_secrets(definition: &Value, also_declared: &[String]) -> Vec<String> {
    let mut declared = declared_in(definition);
    declared.extend(also_declared.iter().cloned());
    let mut secrets: Vec<String> = ["params", "shard_params"]
        .into_iter()
        .filter_map(|key| definition.get(key))
        .flat_map(|params| secret_values(params, &declared))
        .collect();
    if let Some(url) = definition
        .get("alerts")
        .and_then(|a| a.get("webhook"))
        .and_then(Value::as_str)
        && url.len() >= MIN_SCRUBBED_LEN
    {
        secrets.push(url.to_owned());
    }
    secrets
}

/// A job definition with its secrets hidden, for a caller who may not see them.
pub fn redact_spec(spec: &JobSpec) -> JobSpec {
    let mut spec = spec.clone();
    spec.params = redact_params(&spec.params, &spec.secret_params);
    if let Kind::Sharded { params, .. } = &mut spec.kind {
        for shard in params {
            *shard = redact_params(shard, &spec.secret_params);
        }
    }
    if let Some(alerts) = &mut spec.alerts
        && let Some(url) = &mut alerts.webhook
    {
        *url = webhook_target(url);
    }
    spec
}

/// An audit entry's `detail` with its secrets hidden: `definition` and `changes` as
/// [`redact_definition`], `params` as [`redact_params`], and the recorded `error` scrubbed of every
/// value either held. `declared` is the job's own `secret_params`, if the job exists.
pub fn redact_audit_detail(detail: &Value, declared: &[String]) -> Value {
    let Value::Object(map) = detail else {
        return detail.clone();
    };
    let mut secrets = Vec::new();
    let mut map = map.clone();
    for key in ["definition", "changes"] {
        if let Some(definition) = map.get_mut(key) {
            secrets.extend(definition_secrets(definition, declared));
            *definition = redact_definition(definition, declared);
        }
    }
    if let Some(params) = map.get_mut("params") {
        secrets.extend(secret_values(params, declared));
        *params = redact_params(params, declared);
    }
    if let Some(Value::String(error)) = map.get_mut("error") {
        *error = scrub(error, &secrets);
    }
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn none() -> Vec<String> {
        Vec::new()
    }

    #[test]
    fn sensitive_keys_by_convention_and_by_declaration() {
        let cases = [
            ("db_password", true),
            ("DB_PASSWORD", true),
            ("dbPassword", true),
            ("password", true),
            ("api_key", true),
            ("apiKey", true),
            ("api-key", true),
            ("x-api-key", true),
            ("apikey", true),
            ("client_secret", true),
            ("auth_token", true),
            ("private_key", true),
            ("aws_access_key_id", true),
            ("credentials", true),
            ("batch", false),
            ("keyboard", false),
            ("monkey", false),
            ("passport_number", false),
            ("region", false),
            ("primary_key", false),
        ];
        for (key, sensitive) in cases {
            assert_eq!(is_sensitive_key(key, &none()), sensitive, "{key}");
        }
        assert!(is_sensitive_key("iban", &["iban".to_owned()]));
        assert!(!is_sensitive_key("iban", &["ibans".to_owned()]));
    }

    #[test]
    fn params_are_redacted_at_any_depth_and_nothing_else_changes() {
        let params = json!({
            "batch": 500,
            "db_password": "hunter22",
            "nested": {"api_key": 123456, "region": "eu", "list": [{"token": "abcd"}]},
            "iban": "DE0012",
            "empty_secret": null,
        });
        let redacted = redact_params(&params, &["iban".to_owned()]);
        assert_eq!(
            redacted,
            json!({
                "batch": 500,
                "db_password": REDACTED,
                "nested": {"api_key": REDACTED, "region": "eu", "list": [{"token": REDACTED}]},
                "iban": REDACTED,
                "empty_secret": null,
            })
        );
        assert_eq!(redact_params(&json!([1, "x"]), &none()), json!([1, "x"]));
    }

    #[test]
    fn secret_values_are_scrubbed_from_free_text() {
        let params = json!({"db_password": "hunter22", "nested": {"token": 987654}, "pin": "1"});
        let secrets = secret_values(&params, &["pin".to_owned()]);
        let error = "invalid type: string \"hunter22\", expected u32; token 987654; pin 1";
        let scrubbed = scrub(error, &secrets);
        assert!(!scrubbed.contains("hunter22"), "{scrubbed}");
        assert!(!scrubbed.contains("987654"), "{scrubbed}");
        // Too short to search for without garbling the text.
        assert!(scrubbed.ends_with("pin 1"), "{scrubbed}");
    }

    #[test]
    fn definitions_hide_params_and_webhooks_for_the_audit_log() {
        let definition = json!({
            "name": "nightly",
            "secret_params": ["iban"],
            "params": {"iban": "DE0012345", "db_password": "hunter22", "batch": 5},
            "alerts": {"webhook": "https://hooks.slack.com/services/T000/B000/XXXX", "format": "slack"},
        });
        let redacted = redact_definition(&definition, &none());
        let text = redacted.to_string();
        for secret in ["DE0012345", "hunter22", "T000", "XXXX"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(redacted["params"]["batch"], 5);
        assert_eq!(redacted["alerts"]["webhook"], "https://hooks.slack.com/***");
        let secrets = definition_secrets(&definition, &none());
        let error = "alerts.webhook \"https://hooks.slack.com/services/T000/B000/XXXX\" failed";
        assert!(!scrub(error, &secrets).contains("XXXX"));
        // A change set that does not repeat secret_params uses the job's.
        let change = json!({"params": {"iban": "DE99"}});
        assert_eq!(
            redact_definition(&change, &["iban".to_owned()])["params"]["iban"],
            REDACTED
        );
    }

    /// A sharded job's own params per shard are hidden like its params, by the same keys.
    #[test]
    fn shard_params_are_hidden_like_params() {
        let definition = json!({
            "name": "per-region",
            "group": "g",
            "kind": "sharded",
            "shards": 3,
            "secret_params": ["iban"],
            "shard_params": {"0": {"iban": "DE0012345", "region": "eu"},
                             "2": {"db_password": "hunter22"}},
        });
        let redacted = redact_definition(&definition, &none());
        let text = redacted.to_string();
        for secret in ["DE0012345", "hunter22"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(redacted["shard_params"]["0"]["region"], "eu");
        let secrets = definition_secrets(&definition, &none());
        assert!(secrets.contains(&"DE0012345".to_owned()), "{secrets:?}");
        assert!(secrets.contains(&"hunter22".to_owned()), "{secrets:?}");

        let spec =
            crate::config::validate_job(definition.as_object().expect("object")).expect("valid");
        let shown = serde_json::to_value(redact_spec(&spec)).expect("serialises");
        assert_eq!(
            shown["shard_params"],
            json!([{"iban": REDACTED, "region": "eu"}, null, {"db_password": REDACTED}])
        );
    }

    #[test]
    fn audit_details_hide_definitions_params_and_errors() {
        let detail = json!({
            "definition": {"name": "j", "params": {"db_password": "hunter22"}},
            "params": {"iban": "DE0012345"},
            "error": "bad value \"hunter22\" and DE0012345",
        });
        let redacted = redact_audit_detail(&detail, &["iban".to_owned()]).to_string();
        assert!(!redacted.contains("hunter22"), "{redacted}");
        assert!(!redacted.contains("DE0012345"), "{redacted}");
        assert!(redacted.contains(REDACTED), "{redacted}");
    }

    proptest::proptest! {
        #[test]
        fn redaction_never_panics_and_keeps_the_shape(text in ".{0,200}") {
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
            let redacted = redact_definition(&value, &none());
            proptest::prop_assert_eq!(redacted.is_object(), value.is_object());
            let _ = scrub(&text, &definition_secrets(&value, &none()));
        }
    }
}
