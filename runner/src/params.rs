//! A run's values as templates see them: its params (by name, with the handler's defaults) and
//! its context (`{ctx:…}`, the shard of a sharded job's task included), each checked before it
//! goes anywhere.
//!
//! Params only ever *fill* declared placeholders: a value is one string, never parsed as argv,
//! shell text, a URL or a template. Values are strings or numbers of at most
//! [`MAX_PARAM_VALUE_BYTES`] bytes without NUL bytes; anything else is refused, naming the param.

use std::collections::BTreeMap;

use chime_worker::{JobContext, Shard};
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
    /// A `{ctx:shard_…}` placeholder in a run that is not a sharded job's task.
    #[error(
        "`{{ctx:{field}}}` has no value: run {run_id} is not a task of a sharded job (its \
         trigger carries no shard); use the shard placeholders only in handlers of sharded jobs"
    )]
    NotAShard {
        /// The placeholder's field name (`shard_index`, …).
        field: &'static str,
        /// The run.
        run_id: i64,
    },
    /// `{ctx:shard_param}` for a shard whose job has no `shard_params` entry for its index.
    #[error(
        "`{{ctx:shard_param}}` has no value: shard {index} of {total} has no entry in the job's \
         shard_params; give the job shard_params (one per shard) or use {{ctx:shard_index}}"
    )]
    NoShardParam {
        /// The shard's index.
        index: u32,
        /// How many shards the run has.
        total: u32,
    },
    /// A shard param whose text is unusable (too long, or holding a NUL byte).
    #[error(
        "`{{ctx:shard_param}}` of shard {index} is {problem}: at most {MAX_PARAM_VALUE_BYTES} \
         bytes without NUL bytes fill a placeholder"
    )]
    BadShardParam {
        /// The shard's index.
        index: u32,
        /// What is wrong with it.
        problem: String,
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
    shard: Option<&'a Shard>,
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
            shard: ctx.shard(),
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

    /// The shard, or why a `{ctx:field}` placeholder has no value without one.
    fn shard(&self, field: ContextField) -> Result<&Shard, ParamError> {
        self.shard.ok_or(ParamError::NotAShard {
            field: field.name(),
            run_id: self.run_id,
        })
    }

    /// A context value as text; a shard field fails for a run without a shard. A shard param
    /// that is a JSON string is its text, any other value its compact JSON.
    pub fn context(&self, field: ContextField) -> Result<String, ParamError> {
        Ok(match field {
            ContextField::RunId => self.run_id.to_string(),
            ContextField::Job => self.job.to_owned(),
            ContextField::Attempt => self.attempt.to_string(),
            ContextField::ScheduledAt => self.scheduled_at.clone(),
            ContextField::ShardIndex => self.shard(field)?.index.to_string(),
            ContextField::ShardTotal => self.shard(field)?.total.to_string(),
            ContextField::ShardParam => {
                let shard = self.shard(field)?;
                let text = match self.shard_param(shard)? {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let problem = if text.len() > MAX_PARAM_VALUE_BYTES {
                    Some(format!("{} bytes long", text.len()))
                } else if text.contains('\0') {
                    Some("holding a NUL byte".to_owned())
                } else {
                    None
                };
                if let Some(problem) = problem {
                    return Err(ParamError::BadShardParam {
                        index: shard.index,
                        problem,
                    });
                }
                text
            }
        })
    }

    fn shard_param<'s>(&self, shard: &'s Shard) -> Result<&'s Value, ParamError> {
        shard.param.as_ref().ok_or(ParamError::NoShardParam {
            index: shard.index,
            total: shard.total,
        })
    }

    /// A context value as JSON (numbers for the run id, the attempt and the shard's index and
    /// total; the shard param as the job gave it).
    pub fn context_json(&self, field: ContextField) -> Result<Value, ParamError> {
        Ok(match field {
            ContextField::RunId => Value::from(self.run_id),
            ContextField::Attempt => Value::from(self.attempt),
            ContextField::ShardIndex => Value::from(self.shard(field)?.index),
            ContextField::ShardTotal => Value::from(self.shard(field)?.total),
            ContextField::ShardParam => self.shard_param(self.shard(field)?)?.clone(),
            _ => Value::String(self.context(field)?),
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use chime_worker::{Task, TaskKind};
    use serde_json::json;

    fn shard_task(param: Option<Value>) -> Task {
        Task {
            parent_run_id: 41,
            key: "shard/2".into(),
            kind: TaskKind::Shard,
            shard: Some(Shard {
                index: 2,
                total: 3,
                param,
            }),
            worker: None,
            step: None,
            depth: None,
        }
    }

    /// Runs `check` on the values of a test run (with `task`, if any) inside a handler.
    async fn with_values(
        task: Option<Task>,
        check: impl Fn(&RunValues<'_>) + Send + Sync + 'static,
    ) {
        let mut job = chime_worker::testing::TestJob::new("j").run_id(42);
        if let Some(task) = task {
            job = job.task(task);
        }
        let check = std::sync::Arc::new(check);
        let run = job
            .run(
                move |ctx: JobContext, params: Value| {
                    let check = check.clone();
                    async move {
                        let defaults = BTreeMap::new();
                        let values = RunValues::new(&ctx, &params, &defaults).unwrap();
                        check(&values);
                        Ok(())
                    }
                },
                Value::Null,
            )
            .await;
        assert_eq!(run.result, Ok(()));
    }

    #[tokio::test]
    async fn a_shard_task_fills_its_shard_as_text_and_as_json() {
        let cases = [
            (json!("Guangzhou"), "Guangzhou"),
            (json!(7), "7"),
            (
                json!({"region": "eu", "ids": [1, 2]}),
                r#"{"ids":[1,2],"region":"eu"}"#,
            ),
        ];
        for (param, text) in cases {
            let expected = param.clone();
            with_values(Some(shard_task(Some(param))), move |v| {
                assert_eq!(v.context(ContextField::ShardIndex).unwrap(), "2");
                assert_eq!(v.context(ContextField::ShardTotal).unwrap(), "3");
                assert_eq!(v.context(ContextField::ShardParam).unwrap(), text);
                assert_eq!(v.context_json(ContextField::ShardIndex).unwrap(), json!(2));
                assert_eq!(v.context_json(ContextField::ShardTotal).unwrap(), json!(3));
                assert_eq!(v.context_json(ContextField::ShardParam).unwrap(), expected);
            })
            .await;
        }
    }

    #[tokio::test]
    async fn shard_placeholders_without_a_shard_name_the_placeholder_and_why() {
        with_values(None, |v| {
            let err = v.context(ContextField::ShardTotal).unwrap_err();
            assert_eq!(
                err,
                ParamError::NotAShard {
                    field: "shard_total",
                    run_id: 42
                }
            );
            let message = err.to_string();
            assert!(
                message.starts_with(
                    "`{ctx:shard_total}` has no value: run 42 is not a task of a sharded job"
                ),
                "{message}"
            );
            assert!(v.context_json(ContextField::ShardParam).is_err());
            assert_eq!(v.context(ContextField::RunId).unwrap(), "42");
        })
        .await;
        with_values(Some(shard_task(None)), |v| {
            assert_eq!(v.context(ContextField::ShardIndex).unwrap(), "2");
            let err = v.context(ContextField::ShardParam).unwrap_err();
            assert_eq!(err, ParamError::NoShardParam { index: 2, total: 3 });
            assert!(err.to_string().contains("shard_params"), "{err}");
        })
        .await;
        with_values(Some(shard_task(Some(json!("a\0b")))), |v| {
            let err = v.context(ContextField::ShardParam).unwrap_err();
            assert!(err.to_string().contains("NUL"), "{err}");
        })
        .await;
    }
}
