//! Templates: config strings with `{name}` placeholders, parsed once at load and filled per run.
//!
//! A placeholder is `{param}` (a run param, by name), `{ctx:run_id}`, `{ctx:job}`,
//! `{ctx:attempt}` or `{ctx:scheduled_at}` (the run's own values), `{ctx:shard_index}`,
//! `{ctx:shard_total}` or `{ctx:shard_param}` (a sharded job's task's shard; any other run
//! refuses them when it fills them), or `{env:NAME}` (the runner's environment, in HTTP headers
//! only, read once at load). `{{` and `}}` stand for
//! literal braces. Filling a template never re-reads the filled text, so a param holding
//! `{other}` or `}}` stays exactly that text.

use std::fmt;

/// Longest param or environment variable name inside a placeholder, in bytes.
pub const MAX_PLACEHOLDER_NAME: usize = 63;

/// A run value available to every template as `{ctx:…}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextField {
    /// `{ctx:run_id}`: the run id (stable across attempts; an idempotency key).
    RunId,
    /// `{ctx:job}`: the job's name.
    Job,
    /// `{ctx:attempt}`: the attempt number, from 1.
    Attempt,
    /// `{ctx:scheduled_at}`: the run's scheduled instant, RFC 3339 in UTC.
    ScheduledAt,
    /// `{ctx:shard_index}`: a shard task's 0-based index.
    ShardIndex,
    /// `{ctx:shard_total}`: how many shards the task's run has.
    ShardTotal,
    /// `{ctx:shard_param}`: the job's `shard_params` entry for the task's index.
    ShardParam,
}

impl ContextField {
    /// Every field, in the order the docs list them.
    pub const ALL: [ContextField; 7] = [
        ContextField::RunId,
        ContextField::Job,
        ContextField::Attempt,
        ContextField::ScheduledAt,
        ContextField::ShardIndex,
        ContextField::ShardTotal,
        ContextField::ShardParam,
    ];

    /// The name after `ctx:`.
    pub fn name(self) -> &'static str {
        match self {
            ContextField::RunId => "run_id",
            ContextField::Job => "job",
            ContextField::Attempt => "attempt",
            ContextField::ScheduledAt => "scheduled_at",
            ContextField::ShardIndex => "shard_index",
            ContextField::ShardTotal => "shard_total",
            ContextField::ShardParam => "shard_param",
        }
    }

    /// True for the fields only a sharded job's task has.
    pub fn is_shard(self) -> bool {
        matches!(
            self,
            ContextField::ShardIndex | ContextField::ShardTotal | ContextField::ShardParam
        )
    }

    fn parse(name: &str) -> Option<ContextField> {
        ContextField::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Text used as written (braces already unescaped).
    Literal(String),
    /// `{name}`: the run param `name`.
    Param(String),
    /// `{ctx:field}`.
    Context(ContextField),
    /// `{env:NAME}`: the runner's environment variable `NAME`.
    Env(String),
}

/// Why a template does not parse. The message says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` without its `}`.
    #[error("`{{` at byte {0} is not closed; write `{{{{` for a literal brace")]
    Unclosed(usize),
    /// A `}` outside a placeholder.
    #[error("`}}` at byte {0} closes nothing; write `}}}}` for a literal brace")]
    StrayClose(usize),
    /// `{}` or a name with characters other than letters, digits and `_`.
    #[error(
        "placeholder `{{{0}}}` is not a name: use letters, digits and `_` (at most \
         {MAX_PLACEHOLDER_NAME} bytes, not starting with a digit), or write `{{{{` and `}}}}` \
         for literal braces"
    )]
    BadName(String),
    /// `{ctx:…}` with an unknown field.
    #[error(
        "`{{ctx:{0}}}` is not a run value: use ctx:run_id, ctx:job, ctx:attempt, \
         ctx:scheduled_at, ctx:shard_index, ctx:shard_total or ctx:shard_param"
    )]
    UnknownContext(String),
    /// `{env:…}` where the environment is not allowed.
    #[error("`{{env:{0}}}` is only allowed in HTTP header values")]
    EnvNotAllowed(String),
    /// `{other:…}`.
    #[error("`{{{0}:…}}` is not a placeholder kind: use a param name, ctx:… or env:…")]
    UnknownKind(String),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    segments: Vec<Segment>,
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    name.len() <= MAX_PLACEHOLDER_NAME
        && (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Template {
    /// Parses `source`; `{env:…}` placeholders are accepted only when `allow_env` is true.
    pub fn parse(source: &str, allow_env: bool) -> Result<Template, TemplateError> {
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut rest = source.char_indices().peekable();
        while let Some((at, c)) = rest.next() {
            match c {
                '{' if rest.peek().map(|(_, c)| *c) == Some('{') => {
                    rest.next();
                    literal.push('{');
                }
                '}' if rest.peek().map(|(_, c)| *c) == Some('}') => {
                    rest.next();
                    literal.push('}');
                }
                '}' => return Err(TemplateError::StrayClose(at)),
                '{' => {
                    let start = at + 1;
                    let end = source[start..]
                        .find('}')
                        .map(|i| start + i)
                        .ok_or(TemplateError::Unclosed(at))?;
                    let inner = &source[start..end];
                    while rest.peek().is_some_and(|(i, _)| *i <= end) {
                        rest.next();
                    }
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut literal)));
                    }
                    segments.push(placeholder(inner, allow_env)?);
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        Ok(Template {
            source: source.to_owned(),
            segments,
        })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Its pieces, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The param names it uses, in order of appearance (repeated names once).
    pub fn params(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for segment in &self.segments {
            if let Segment::Param(name) = segment
                && !names.contains(&name.as_str())
            {
                names.push(name);
            }
        }
        names
    }

    /// True when the template has no placeholder.
    pub fn is_literal(&self) -> bool {
        self.segments
            .iter()
            .all(|s| matches!(s, Segment::Literal(_)))
    }

    /// The text before the first placeholder (unescaped).
    pub fn fixed_prefix(&self) -> String {
        let mut prefix = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => prefix.push_str(text),
                _ => break,
            }
        }
        prefix
    }

    /// When the whole template is one placeholder, that placeholder.
    pub fn single(&self) -> Option<&Segment> {
        match self.segments.as_slice() {
            [only] if !matches!(only, Segment::Literal(_)) => Some(only),
            _ => None,
        }
    }

    /// Fills the template: literals as written, every placeholder through `fill`, which may
    /// refuse (a missing param, say) with an error that is returned as is.
    pub fn render<E>(
        &self,
        mut fill: impl FnMut(&Segment) -> Result<String, E>,
    ) -> Result<String, E> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => out.push_str(text),
                other => out.push_str(&fill(other)?),
            }
        }
        Ok(out)
    }
}

fn placeholder(inner: &str, allow_env: bool) -> Result<Segment, TemplateError> {
    match inner.split_once(':') {
        None if is_name(inner) => Ok(Segment::Param(inner.to_owned())),
        None => Err(TemplateError::BadName(inner.to_owned())),
        Some(("ctx", field)) => ContextField::parse(field)
            .map(Segment::Context)
            .ok_or_else(|| TemplateError::UnknownContext(field.to_owned())),
        Some(("env", name)) if !is_name(name) => Err(TemplateError::BadName(inner.to_owned())),
        Some(("env", name)) if allow_env => Ok(Segment::Env(name.to_owned())),
        Some(("env", name)) => Err(TemplateError::EnvNotAllowed(name.to_owned())),
        Some((kind, _)) if is_name(kind) => Err(TemplateError::UnknownKind(kind.to_owned())),
        Some(_) => Err(TemplateError::BadName(inner.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str) -> Segment {
        Segment::Param(name.to_owned())
    }

    fn lit(text: &str) -> Segment {
        Segment::Literal(text.to_owned())
    }

    #[test]
    fn parses_params_context_env_and_escaped_braces() {
        let t = Template::parse("/b/{day}-{ctx:run_id}.dump {{x}} {env:TOKEN}", true).unwrap();
        assert_eq!(
            t.segments(),
            [
                lit("/b/"),
                param("day"),
                lit("-"),
                Segment::Context(ContextField::RunId),
                lit(".dump {x} "),
                Segment::Env("TOKEN".into()),
            ]
        );
        assert_eq!(t.params(), ["day"]);
        assert_eq!(t.fixed_prefix(), "/b/");
        assert!(!t.is_literal());
        assert!(Template::parse("pg_dump", false).unwrap().is_literal());
        assert_eq!(
            Template::parse("{a}", false).unwrap().single(),
            Some(&param("a"))
        );
    }

    #[test]
    fn refuses_what_is_not_a_placeholder_with_a_fix() {
        let cases = [
            ("{", TemplateError::Unclosed(0)),
            ("a}", TemplateError::StrayClose(1)),
            ("{}", TemplateError::BadName(String::new())),
            ("{print $1}", TemplateError::BadName("print $1".into())),
            ("{1st}", TemplateError::BadName("1st".into())),
            ("{ctx:host}", TemplateError::UnknownContext("host".into())),
            ("{env:TOKEN}", TemplateError::EnvNotAllowed("TOKEN".into())),
            ("{file:x}", TemplateError::UnknownKind("file".into())),
        ];
        for (source, expected) in cases {
            assert_eq!(Template::parse(source, false), Err(expected), "{source}");
        }
        assert!(
            TemplateError::BadName("print $1".into())
                .to_string()
                .contains("write `{{` and `}}` for literal braces")
        );
    }

    #[test]
    fn shard_placeholders_parse_as_context_fields() {
        let t = Template::parse(
            "{ctx:shard_index}/{ctx:shard_total} {ctx:shard_param}",
            false,
        )
        .unwrap();
        assert_eq!(
            t.segments(),
            [
                Segment::Context(ContextField::ShardIndex),
                lit("/"),
                Segment::Context(ContextField::ShardTotal),
                lit(" "),
                Segment::Context(ContextField::ShardParam),
            ]
        );
        assert!(t.params().is_empty());
        assert_eq!(
            Template::parse("{ctx:shard_param}", false)
                .unwrap()
                .single(),
            Some(&Segment::Context(ContextField::ShardParam))
        );
        let shard: Vec<_> = ContextField::ALL
            .into_iter()
            .filter(|f| f.is_shard())
            .map(ContextField::name)
            .collect();
        assert_eq!(shard, ["shard_index", "shard_total", "shard_param"]);
        let message = TemplateError::UnknownContext("shard".into()).to_string();
        assert!(message.contains("ctx:shard_index"), "{message}");
    }

    #[test]
    fn rendering_never_rereads_filled_text() {
        let t = Template::parse("x={a}", false).unwrap();
        let out: Result<String, ()> = t.render(|_| Ok("{b}}}".to_owned()));
        assert_eq!(out.unwrap(), "x={b}}}");
    }
}
