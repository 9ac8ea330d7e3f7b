//! A run's values as templates see them: its params (by name, with the handler's defaults) and
//! its context (`{ctx:…}`), each checked before it goes anywhere.
//!
//! Params only ever *fill* declared placeholders: a value is one string, never parsed as argv,
//! shell text, a URL or a template. Values are strings or numbers of at most
//! [`MAX_PARAM_VALUE_BYTES`] bytes without NUL bytes; anything else is refused, naming the param.

use std::collections::BTreeMap;

use chime_worker::JobContext;
use serde_json::{Map, Value};

use crate::template::ContextField;

/// Longest param value that may fill a placeholder, in bytes.
pub const MAX_PARAM_VALUE_BYTES: usize = 4096;

/// Why a run's params cannot fill a handler's templates. Every message names the param.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// The run's params are not a JSON object.
    #[error(
        "params must be a JSON object of named values (such as {{\"database\": \"orders\"}}), \
         not {0}"
    )]
    NotAnObject(&'static str),
    /// A placeholder's param is absent and has no default.
    #[error(
        "param `{0}` is missing: the handler uses `{{{0}}}`; pass it in the trigger's params or \
         give it a default in the handler's `defaults`"
    )]
    Missing(String),
    /// A value that is not a string or a number.
    #[error("param `{name}` is {kind}: only strings and numbers fill `{{{name}}}`")]
    WrongType {
        /// The param.
        name: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// A value over [`MAX_PARAM_VALUE_BYTES`].
    #[error("param `{name}` is {len} bytes long: at most {MAX_PARAM_VALUE_BYTES} bytes")]
    TooLong {
        /// The param.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A value with a NUL byte (it cannot be passed to a process).
    #[error("param `{0}` contains a NUL byte, which no argument or environment value can hold")]
    Nul(String),
    /// A value starting with `-` at the start of an argument: the program would read it as an
    /// option.
    #[error(
        "param `{name}` = {value:?} starts with `-` and would be read as an option of the \
         program; pass a value without a leading `-` (or set allow_option_params = true on the \
         handler if options from params are intended)"
    )]
    OptionLike {
        /// The param.
        name: String,
        /// The argument it starts, cut to 80 characters.
        value: String,
    },
}

/// The values of one run: params (with defaults) and context.
#[derive(Debug)]
pub struct RunValues<'a> {
    params: Option<&'a Map<String, Value>>,
    defaults: &'a BTreeMap<String, String>,
    run_id: i64,
    job: &'a str,
    attempt: u32,
    scheduled_at: String,
}

/// JSON's name for the kind of `value`.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> RunValues<'a> {
    /// The values of the run behind `ctx`, whose raw params are `params` (`null` counts as none).
    pub fn new(
        ctx: &'a JobContext,
        params: &'a Value,
        defaults: &'a BTreeMap<String, String>,
    ) -> Result<RunValues<'a>, ParamError> {
        let params = match params {
            Value::Null => None,
            Value::Object(map) => Some(map),
            other => return Err(ParamError::NotAnObject(kind(other))),
        };
        Ok(RunValues {
            params,
            defaults,
            run_id: ctx.run_id(),
            job: ctx.job(),
            attempt: ctx.attempt(),
            scheduled_at: ctx
                .scheduled_at()
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        })
    }

    /// The raw JSON of param `name` (its default as a string when absent).
    pub fn json(&self, name: &str) -> Result<Value, ParamError> {
        match self.params.and_then(|p| p.get(name)) {
            Some(Value::Null) | None => self
                .defaults
                .get(name)
                .map(|d| Value::String(d.clone()))
                .ok_or_else(|| ParamError::Missing(name.to_owned())),
            Some(value) => Ok(value.clone()),
        }
    }

    /// Param `name` as text: a string as is, a number as JSON writes it; checked.
    pub fn text(&self, name: &str) -> Result<String, ParamError> {
        let text = match self.json(name)? {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            other => {
                return Err(ParamError::WrongType {
                    name: name.to_owned(),
                    kind: kind(&other),
                });
            }
        };
        if text.len() > MAX_PARAM_VALUE_BYTES {
            return Err(ParamError::TooLong {
                name: name.to_owned(),
                len: text.len(),
            });
        }
        if text.contains('\0') {
            return Err(ParamError::Nul(name.to_owned()));
        }
        Ok(text)
    }

    /// A context value as text.
    pub fn context(&self, field: ContextField) -> String {
        match field {
            ContextField::RunId => self.run_id.to_string(),
            ContextField::Job => self.job.to_owned(),
            ContextField::Attempt => self.attempt.to_string(),
            ContextField::ScheduledAt => self.scheduled_at.clone(),
        }
    }

    /// A context value as JSON (numbers for the run id and the attempt).
    pub fn context_json(&self, field: ContextField) -> Value {
        match field {
            ContextField::RunId => Value::from(self.run_id),
            ContextField::Attempt => Value::from(self.attempt),
            _ => Value::String(self.context(field)),
        }
    }
}

/// Cuts `text` to at most `max` characters for a message, marking the cut with "…".
pub fn excerpt(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}
