//! `kind = "shell"` handlers: run a declared program in its own process group, stream its
//! output as run log lines, map its exit to the run's outcome.
//!
//! The program and its arguments come from the config file only. A run's params fill declared
//! `{placeholders}`, each into exactly one argument (no word splitting, no shell); with
//! `shell = true` the `command` runs through `/bin/sh -c` and params reach it only as
//! environment variables (`env_from_params`), never as text of the command.
//!
//! Stopping: on the handler's `timeout`, the run's cancellation (job timeout, operator cancel,
//! the worker's drain) the whole process group gets SIGTERM, then SIGKILL after `kill_grace`.
//! Processes the program leaves behind in its group when it exits get the same. If the handler
//! is dropped half-way (the SDK abandons it), the group gets SIGKILL.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::pin::{Pin, pin};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use chime_worker::{JobContext, JobError, Level};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

use crate::config::{Check, FORBIDDEN_PARAM_ENV, RawHandler, is_env_name, limits::*, quoted};
use crate::output::{Output, Redactor, human_bytes, pump};
use crate::params::{ParamError, RunValues, excerpt};
use crate::template::{Segment, Template};

/// The environment variables a child inherits from the runner when `inherit_env` is not set.
/// Deliberately short: the runner's own environment (its database URL, say) is not the job's.
pub const DEFAULT_INHERIT_ENV: &[&str] =
    &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER"];

/// How long the runner keeps reading output after the process group was killed; a process that
/// left the group (`setsid`) may hold the pipes open forever.
pub const PIPE_DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// What runs.
#[derive(Debug, Clone)]
pub enum Program {
    /// `argv`: the program and its arguments; the program is fixed text.
    Argv(Vec<Template>),
    /// `shell = true` with `command`: `/bin/sh -c command`, params in the environment only.
    Shell(String),
}

/// Which of the runner's environment variables the child gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InheritEnv {
    /// `inherit_env = "all"`.
    All,
    /// `inherit_env = ["PATH", …]` (default [`DEFAULT_INHERIT_ENV`]).
    Only(Vec<String>),
}

/// What a non-zero exit code not listed in `retry_codes` or `fail_codes` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtherCodes {
    /// A retryable failure (the default).
    Retry,
    /// A failure that is not retried.
    Fail,
}

/// A checked shell handler.
#[derive(Debug, Clone)]
pub struct ShellSpec {
    /// What runs.
    pub program: Program,
    /// Extra environment, as written.
    pub env: BTreeMap<String, String>,
    /// Params copied into environment variables of the same name.
    pub env_from_params: Vec<String>,
    /// What the child inherits.
    pub inherit_env: InheritEnv,
    /// The working directory (the runner's when `None`).
    pub workdir: Option<PathBuf>,
    /// The handler's own time limit (the job's timeout applies too).
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Most output bytes logged.
    pub max_output: u64,
    /// Exit codes that are retryable failures.
    pub retry_codes: BTreeSet<i32>,
    /// Exit codes that fail without retry.
    pub fail_codes: BTreeSet<i32>,
    /// Other non-zero codes.
    pub other_codes: OtherCodes,
    /// Defaults of params, as text.
    pub defaults: BTreeMap<String, String>,
    /// Whether a param value may start with `-` at the start of an argument.
    pub allow_option_params: bool,
}

impl ShellSpec {
    /// A spec running `argv` with every other field at its default (for tests and embedding).
    pub fn argv(argv: &[&str]) -> Result<ShellSpec, crate::template::TemplateError> {
        Ok(ShellSpec {
            program: Program::Argv(
                argv.iter()
                    .map(|a| Template::parse(a, false))
                    .collect::<Result<_, _>>()?,
            ),
            env: BTreeMap::new(),
            env_from_params: Vec::new(),
            inherit_env: InheritEnv::Only(
                DEFAULT_INHERIT_ENV.iter().map(|s| s.to_string()).collect(),
            ),
            workdir: None,
            timeout: None,
            kill_grace: DEFAULT_KILL_GRACE,
            max_output: DEFAULT_MAX_OUTPUT,
            retry_codes: BTreeSet::new(),
            fail_codes: BTreeSet::new(),
            other_codes: OtherCodes::Retry,
            defaults: BTreeMap::new(),
            allow_option_params: false,
        })
    }

    /// One line for `--check`.
    pub fn describe(&self) -> String {
        let what = match &self.program {
            Program::Argv(argv) => argv
                .iter()
                .map(|a| quoted(a.source()))
                .collect::<Vec<_>>()
                .join(" "),
            Program::Shell(command) => format!("/bin/sh -c {}", quoted(command)),
        };
        let timeout = self.timeout.map_or("the job's".to_owned(), |t| {
            humantime::format_duration(t).to_string()
        });
        format!(
            "{what} (timeout {timeout}, kill_grace {}, max_output {})",
            humantime::format_duration(self.kill_grace),
            human_bytes(self.max_output)
        )
    }
}

/// Checks the fields of a `kind = "shell"` handler.
pub(crate) fn spec(raw: &RawHandler, check: &mut Check<'_>) -> Option<ShellSpec> {
    let before = check.errors_len();
    let defaults = check.defaults(raw);
    let program = match (&raw.argv, raw.shell.unwrap_or(false), &raw.command) {
        (Some(_), true, _) => {
            check.error(
                "shell",
                Some("true".into()),
                "with shell = true, write the command in `command`, not `argv`",
            );
            None
        }
        (Some(_), false, Some(_)) => {
            check.error(
                "command",
                None,
                "give either argv (no shell) or shell = true with command, not both",
            );
            None
        }
        (None, false, Some(command)) => {
            check.bad("command", command, "runs through /bin/sh only with shell = true; set it, or use argv = [\"program\", \"arg\"] without a shell");
            None
        }
        (None, false, None) => {
            check.error("argv", None, "missing; give the program and its arguments, such as argv = [\"pg_dump\", \"-Fc\", \"{database}\"]");
            None
        }
        (None, true, None) => {
            check.error("command", None, "missing; with shell = true give the shell command, such as command = \"pg_dump \\\"$DATABASE\\\" | gzip\"");
            None
        }
        (None, true, Some(command)) => {
            if command.trim().is_empty() {
                check.bad("command", command, "is empty; give the shell command");
                None
            } else if command.len() > MAX_COMMAND_BYTES || command.contains('\0') {
                check.error(
                    "command",
                    Some(format!("{} bytes", command.len())),
                    format!("must be at most {MAX_COMMAND_BYTES} bytes without NUL bytes"),
                );
                None
            } else {
                Some(Program::Shell(command.clone()))
            }
        }
        (Some(argv), false, None) => argv_program(argv, check),
    };
    let env = match &raw.env {
        None => BTreeMap::new(),
        Some(env) => {
            check.count("env", env.len(), MAX_ENTRIES);
            for (name, value) in env {
                if !is_env_name(name) {
                    check.bad(&format!("env.{name}"), value, "the variable name must be letters, digits and `_`, not starting with a digit");
                } else if value.len() > MAX_COMMAND_BYTES || value.contains('\0') {
                    check.error(
                        &format!("env.{name}"),
                        Some(format!("{} bytes", value.len())),
                        format!("must be at most {MAX_COMMAND_BYTES} bytes without NUL bytes"),
                    );
                }
            }
            env.clone()
        }
    };
    let env_from_params = match &raw.env_from_params {
        None => Vec::new(),
        Some(names) => {
            check.count("env_from_params", names.len(), MAX_ENTRIES);
            for (i, name) in names.iter().enumerate() {
                let field = format!("env_from_params[{i}]");
                if !is_env_name(name) {
                    check.bad(&field, name, "must be a param name usable as a variable name: letters, digits and `_`, not starting with a digit");
                } else if FORBIDDEN_PARAM_ENV.contains(&name.as_str())
                    || name.starts_with("LD_")
                    || name.starts_with("DYLD_")
                {
                    check.bad(&field, name, "changes how programs load or shells start, so a param may not set it; pass the value under another name");
                } else if env.contains_key(name) {
                    check.bad(&field, name, "is also set in `env`; remove one of them");
                } else if name.starts_with("CHIME_") {
                    check.bad(&field, name, "CHIME_* variables carry the run's own values (CHIME_RUN_ID, …); use another name");
                }
            }
            names.clone()
        }
    };
    let inherit_env = match &raw.inherit_env {
        None => InheritEnv::Only(DEFAULT_INHERIT_ENV.iter().map(|s| s.to_string()).collect()),
        Some(Value::String(s)) if s == "all" => InheritEnv::All,
        Some(Value::Array(items)) => {
            check.count("inherit_env", items.len(), MAX_ENTRIES);
            let mut names = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item.as_str() {
                    Some(name) if is_env_name(name) => names.push(name.to_owned()),
                    _ => check.error(
                        &format!("inherit_env[{i}]"),
                        Some(excerpt(&item.to_string(), 80)),
                        "must be a variable name such as \"PATH\"",
                    ),
                }
            }
            InheritEnv::Only(names)
        }
        Some(other) => {
            check.error(
                "inherit_env",
                Some(excerpt(&other.to_string(), 80)),
                "must be \"all\" or a list of variable names such as [\"PATH\", \"PGPASSWORD\"]",
            );
            InheritEnv::All
        }
    };
    let workdir = raw.workdir.as_ref().and_then(|dir| {
        if dir.is_empty()
            || dir.len() > MAX_TEMPLATE_BYTES
            || dir.contains('\0')
            || !dir.starts_with('/')
        {
            check.bad(
                "workdir",
                dir,
                format!("must be an absolute path of at most {MAX_TEMPLATE_BYTES} bytes"),
            );
            None
        } else {
            Some(PathBuf::from(dir))
        }
    });
    let timeout = raw
        .timeout
        .as_ref()
        .and_then(|t| check.duration("timeout", t, MAX_TIMEOUT));
    let kill_grace = match &raw.kill_grace {
        None => Some(DEFAULT_KILL_GRACE),
        Some(t) => check.duration("kill_grace", t, MAX_KILL_GRACE),
    };
    let max_output = match &raw.max_output {
        None => Some(DEFAULT_MAX_OUTPUT),
        Some(v) => check.bytes("max_output", v, MIN_MAX_OUTPUT, MAX_MAX_OUTPUT),
    };
    let retry_codes = codes(check, "retry_codes", raw.retry_codes.as_deref());
    let fail_codes = codes(check, "fail_codes", raw.fail_codes.as_deref());
    if let Some(both) = retry_codes.intersection(&fail_codes).next() {
        check.error(
            "fail_codes",
            Some(both.to_string()),
            format!("exit code {both} is in both retry_codes and fail_codes; keep it in one"),
        );
    }
    let other_codes = match raw.other_codes.as_deref() {
        None | Some("retry") => OtherCodes::Retry,
        Some("fail") => OtherCodes::Fail,
        Some(other) => {
            check.bad("other_codes", other, "must be \"retry\" or \"fail\"");
            OtherCodes::Retry
        }
    };
    if check.errors_len() > before {
        return None;
    }
    Some(ShellSpec {
        program: program?,
        env,
        env_from_params,
        inherit_env,
        workdir,
        timeout,
        kill_grace: kill_grace?,
        max_output: max_output?,
        retry_codes,
        fail_codes,
        other_codes,
        defaults,
        allow_option_params: raw.allow_option_params.unwrap_or(false),
    })
}

fn argv_program(argv: &[String], check: &mut Check<'_>) -> Option<Program> {
    if argv.is_empty() {
        check.error("argv", Some("[]".into()), "is empty; give the program and its arguments, such as [\"pg_dump\", \"-Fc\", \"{database}\"]");
        return None;
    }
    if !check.count("argv", argv.len(), MAX_ARGV) {
        return None;
    }
    let mut templates = Vec::new();
    for (i, arg) in argv.iter().enumerate() {
        let field = format!("argv[{i}]");
        if arg.len() > MAX_TEMPLATE_BYTES || arg.contains('\0') {
            check.error(
                &field,
                Some(format!("{} bytes", arg.len())),
                format!("must be at most {MAX_TEMPLATE_BYTES} bytes without NUL bytes"),
            );
            continue;
        }
        match Template::parse(arg, false) {
            Err(e) => check.bad(&field, arg, e.to_string()),
            Ok(t) if i == 0 && !t.is_literal() => check.bad(
                &field,
                arg,
                "the program is fixed text: a placeholder may fill arguments, never the program",
            ),
            Ok(_) if i == 0 && arg.is_empty() => check.bad(
                &field,
                arg,
                "the program is empty; name it, such as \"pg_dump\"",
            ),
            Ok(t) => templates.push(t),
        }
    }
    (templates.len() == argv.len()).then_some(Program::Argv(templates))
}

fn codes(check: &mut Check<'_>, field: &str, codes: Option<&[i64]>) -> BTreeSet<i32> {
    let mut set = BTreeSet::new();
    for (i, code) in codes.unwrap_or_default().iter().enumerate() {
        if (1..=255).contains(code) {
            set.insert(*code as i32);
        } else {
            check.error(
                &format!("{field}[{i}]"),
                Some(code.to_string()),
                "must be an exit code from 1 to 255 (0 is success)",
            );
        }
    }
    set
}

/// Why an attempt could not build its process.
fn param_error(e: ParamError) -> JobError {
    JobError::fail(format!("cannot fill the handler's placeholders: {e}"))
}

/// The argv of one run: every template filled, each into one argument.
pub fn render_argv(spec: &ShellSpec, values: &RunValues<'_>) -> Result<Vec<String>, ParamError> {
    let Program::Argv(argv) = &spec.program else {
        return Ok(Vec::new());
    };
    argv.iter()
        .map(|template| {
            let arg = template.render(|segment| match segment {
                Segment::Param(name) => values.text(name),
                Segment::Context(field) => values.context(*field),
                // Refused at load: `{env:…}` only parses in HTTP headers.
                Segment::Env(_) | Segment::Literal(_) => Ok(String::new()),
            })?;
            // A leading `-` that the config did not write came from a param: the program
            // would read the argument as an option.
            if arg.starts_with('-')
                && !template.fixed_prefix().starts_with('-')
                && !spec.allow_option_params
                && let Some(name) = template.params().first()
            {
                return Err(ParamError::OptionLike {
                    name: (*name).to_owned(),
                    value: excerpt(&arg, 80),
                });
            }
            Ok(arg)
        })
        .collect()
}

/// The child's environment for one run.
pub fn render_env(
    spec: &ShellSpec,
    values: &RunValues<'_>,
) -> Result<Vec<(String, String)>, ParamError> {
    let mut env: BTreeMap<String, String> = match &spec.inherit_env {
        InheritEnv::All => std::env::vars().collect(),
        InheritEnv::Only(names) => names
            .iter()
            .filter_map(|n| std::env::var(n).ok().map(|v| (n.clone(), v)))
            .collect(),
    };
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    for name in &spec.env_from_params {
        env.insert(name.clone(), values.text(name)?);
    }
    // CHIME_RUN_ID, CHIME_JOB, CHIME_ATTEMPT, CHIME_SCHEDULED_AT; a shard task's
    // CHIME_SHARD_INDEX, CHIME_SHARD_TOTAL and (when its job has one) CHIME_SHARD_PARAM.
    for field in crate::template::ContextField::ALL {
        let value = match values.context(field) {
            Ok(value) => value,
            Err(ParamError::NotAShard { .. } | ParamError::NoShardParam { .. }) => continue,
            Err(e) => return Err(e),
        };
        env.insert(format!("CHIME_{}", field.name().to_uppercase()), value);
    }
    Ok(env.into_iter().collect())
}

/// The process group of a running child: SIGKILLed when dropped unless known to be gone.
struct Group {
    pgid: Pid,
    live: bool,
}

impl Group {
    /// Sends `signal` to every process of the group; false when the group is gone.
    fn signal(&self, signal: Signal) -> bool {
        killpg(self.pgid, signal).is_ok()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.live {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

/// How the wait for the child ended.
enum Stop {
    Exited(std::io::Result<ExitStatus>),
    TimedOut(Duration),
    Cancelled,
}

/// Output readers running alongside whatever else the handler awaits.
struct Readers<'a> {
    future: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    done: bool,
}

impl Readers<'_> {
    /// Awaits `future` while the readers keep reading.
    async fn alongside<T>(&mut self, future: impl Future<Output = T>) -> T {
        let mut future = pin!(future);
        loop {
            tokio::select! {
                value = &mut future => return value,
                () = &mut self.future, if !self.done => self.done = true,
            }
        }
    }

    /// Lets the readers finish within `within`; true when they did.
    async fn finish(&mut self, within: Duration) -> bool {
        if !self.done {
            self.done = tokio::time::timeout(within, &mut self.future).await.is_ok();
        }
        self.done
    }
}

/// Runs one attempt of a shell handler.
pub async fn run(spec: &ShellSpec, ctx: JobContext, params: Value) -> Result<(), JobError> {
    let values = RunValues::new(&ctx, &params, &spec.defaults).map_err(param_error)?;
    let env = render_env(spec, &values).map_err(param_error)?;
    let (program, args) = match &spec.program {
        Program::Argv(_) => {
            let mut argv = render_argv(spec, &values).map_err(param_error)?;
            let program = argv.remove(0);
            (program, argv)
        }
        Program::Shell(command) => ("/bin/sh".to_owned(), vec!["-c".to_owned(), command.clone()]),
    };
    let mut command = tokio::process::Command::new(&program);
    command
        .args(&args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(dir) = &spec.workdir {
        command.current_dir(dir);
    }
    let output = Output::new(ctx.log().clone(), spec.max_output, Redactor::default());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let message = match &spec.workdir {
                Some(dir) => format!(
                    "could not start {program:?} in workdir {}: {e}",
                    dir.display()
                ),
                None => format!("could not start {program:?}: {e}"),
            };
            output.note(Level::Error, &message);
            return Err(match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    JobError::fail(message)
                }
                _ => JobError::retry(message),
            });
        }
    };
    let Some(pid) = child.id() else {
        return Err(JobError::retry(
            "the child exited before its id could be read",
        ));
    };
    let mut group = Group {
        pgid: Pid::from_raw(pid as i32),
        live: true,
    };
    tracing::debug!(pid, %program, "started");
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let output_ref = &output;
    let mut readers = Readers {
        future: Box::pin(async move {
            tokio::join!(
                async {
                    if let Some(out) = stdout {
                        pump(out, Level::Info, output_ref).await;
                    }
                },
                async {
                    if let Some(err) = stderr {
                        pump(err, Level::Warn, output_ref).await;
                    }
                },
            );
        }),
        done: false,
    };
    let stop = readers
        .alongside(async {
            let limit = async {
                match spec.timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                status = child.wait() => Stop::Exited(status),
                () = limit => Stop::TimedOut(spec.timeout.unwrap_or_default()),
                () = ctx.cancelled() => Stop::Cancelled,
            }
        })
        .await;
    let grace = spec.kill_grace;
    let (status, stopped) = match stop {
        Stop::Exited(status) => {
            // The program exited; processes it left in its group (holding its pipes or not)
            // are stopped the same way, with kill_grace to finish.
            if group.signal(Signal::SIGTERM) {
                output.note(
                    Level::Warn,
                    "the program exited and left processes in its process group: sent them SIGTERM",
                );
                readers.finish(grace).await;
            }
            (status, None)
        }
        Stop::TimedOut(limit) => {
            let why = format!(
                "timed out after {} (the handler's timeout)",
                humantime::format_duration(limit)
            );
            let (status, how) =
                terminate(&mut group, &mut child, &mut readers, &output, &why, grace).await;
            (status, Some((false, format!("{why}; {how}"))))
        }
        Stop::Cancelled => {
            let why = "the run was cancelled (job timeout, operator cancel or worker shutdown)";
            let (status, how) =
                terminate(&mut group, &mut child, &mut readers, &output, why, grace).await;
            (status, Some((true, format!("{why}; {how}"))))
        }
    };
    // Whatever the program left in its group gets no more time.
    group.signal(Signal::SIGKILL);
    group.live = false;
    if !readers.finish(PIPE_DRAIN_AFTER_KILL).await {
        output.note(
            Level::Warn,
            "stopped reading output: a process outside the job's process group still holds its pipes open",
        );
    }
    drop(readers);
    output.finish();
    if let Some((cancelled, message)) = stopped {
        let message = output.with_tail(&message);
        return Err(if cancelled {
            JobError::cancel(message)
        } else {
            JobError::retry(message)
        });
    }
    let status =
        status.map_err(|e| JobError::retry(format!("could not wait for {program:?}: {e}")))?;
    outcome(spec, status, &output)
}

/// Stops a running process group: SIGTERM, then SIGKILL after `grace` if the program has not
/// exited; returns its exit status and what was done.
async fn terminate(
    group: &mut Group,
    child: &mut tokio::process::Child,
    readers: &mut Readers<'_>,
    output: &Output,
    why: &str,
    grace: Duration,
) -> (std::io::Result<ExitStatus>, String) {
    group.signal(Signal::SIGTERM);
    output.note(
        Level::Warn,
        &format!("{why}: sent SIGTERM to the process group"),
    );
    match tokio::time::timeout(grace, readers.alongside(child.wait())).await {
        Ok(status) => (status, "the process group got SIGTERM".to_owned()),
        Err(_) => {
            let grace = humantime::format_duration(grace);
            group.signal(Signal::SIGKILL);
            output.note(
                Level::Warn,
                &format!("still running {grace} after SIGTERM: sent SIGKILL to the process group"),
            );
            let status = readers.alongside(child.wait()).await;
            (
                status,
                format!("the process group got SIGTERM, then SIGKILL after {grace}"),
            )
        }
    }
}

/// The outcome of an exit status under the handler's code lists.
fn outcome(spec: &ShellSpec, status: ExitStatus, output: &Output) -> Result<(), JobError> {
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => {
            let (retry, why) = if spec.retry_codes.contains(&code) {
                (true, "in retry_codes")
            } else if spec.fail_codes.contains(&code) {
                (false, "in fail_codes")
            } else {
                match spec.other_codes {
                    OtherCodes::Retry => (true, "other_codes = \"retry\""),
                    OtherCodes::Fail => (false, "other_codes = \"fail\""),
                }
            };
            let message = output.with_tail(&format!(
                "exited with code {code} ({why}: {})",
                if retry {
                    "retried under the job's retry policy"
                } else {
                    "not retried"
                }
            ));
            Err(if retry {
                JobError::retry(message)
            } else {
                JobError::fail(message)
            })
        }
        (None, Some(signal)) => {
            let name = Signal::try_from(signal)
                .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_owned());
            Err(JobError::retry(
                output.with_tail(&format!("killed by {name} ({signal})")),
            ))
        }
        (None, None) => Err(JobError::retry(
            output.with_tail(&format!("ended without exit code or signal: {status}")),
        )),
    }
}
