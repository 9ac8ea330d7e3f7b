//! Child processes the process-level tests and benchmarks start, signal and measure:
//! `chime scheduler` instances, `chime-test-worker`s and `chime-bench worker`s. Each one's stdout
//! and stderr go to a log file; its stdout lines are also kept (test and bench workers report
//! each handler start there), and the messages of JSON log lines on stderr are remembered with
//! the instant they first appeared.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use chime_test_kit::{Events, try_wait_for};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, SysconfVar, sysconf};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long stopping or killing a process waits for the rest of its output once it has exited.
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);

/// A running child process, SIGKILLed if dropped.
pub struct Process {
    /// A short name for messages (`scheduler a`, `worker w1`).
    pub name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    stdout: Events<String>,
    messages: Arc<Mutex<HashMap<String, Instant>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Process {
    /// Starts `command` with its stdout and stderr going to `log`, stdout lines kept and the
    /// messages of JSON log lines on stderr remembered.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> anyhow::Result<Process> {
        // This process's own settings must not leak into the child; the command's own stay.
        let given: Vec<_> = command
            .as_std()
            .get_envs()
            .map(|(key, _)| key.to_owned())
            .collect();
        for (key, _) in std::env::vars_os() {
            let key_text = key.to_string_lossy();
            if key_text.starts_with("CHIME_") && !given.contains(&key) {
                command.env_remove(&key);
            }
        }
        let log_file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let log_file = Arc::new(Mutex::new(log_file));
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("the child exited at once")?;
        let stdout = Events::new();
        let messages = Arc::new(Mutex::new(HashMap::new()));
        let out = child.stdout.take().context("piped stdout")?;
        let err = child.stderr.take().context("piped stderr")?;
        let kept = stdout.clone();
        let seen = messages.clone();
        let readers = vec![
            read_lines(out, log_file.clone(), move |line| {
                kept.record(line.to_owned());
            }),
            read_lines(err, log_file, move |line| {
                if let Some(message) = log_message(line) {
                    seen.lock()
                        .expect("not poisoned")
                        .entry(message)
                        .or_insert_with(Instant::now);
                }
            }),
        ];
        Ok(Process {
            name: name.to_owned(),
            child,
            pid,
            log: log.to_owned(),
            stdout,
            messages,
            readers,
        })
    }

    /// Starts `chime scheduler --jobs JOBS` as instance `instance`.
    pub fn scheduler(
        chime: &Path,
        instance: &str,
        env: &SchedulerEnv<'_>,
        log_dir: &Path,
    ) -> anyhow::Result<Process> {
        let mut command = Command::new(chime);
        command
            .arg("scheduler")
            .arg("--jobs")
            .arg(env.jobs)
            .env("CHIME_DATABASE_URL", env.database_url)
            .env("CHIME_QUEUE_PREFIX", env.prefix)
            .env("CHIME_INSTANCE_ID", instance)
            // Any free port: several instances run side by side.
            .env("CHIME_BIND", "127.0.0.1:0")
            .env("RUST_LOG", "info,sqlx=warn,lapin=warn")
            .env("NO_COLOR", "1");
        if env.json_logs {
            command.env("CHIME_LOG_FORMAT", "json");
        }
        match env.amqp_urls {
            [one] => command.env("CHIME_AMQP_URL", one),
            several => command.env("CHIME_AMQP_URLS", several.join(",")),
        };
        if let Some(ca) = env.amqp_ca_file {
            command.env("CHIME_AMQP_TLS__CA_FILE", ca);
        }
        Process::spawn(
            &format!("scheduler {instance}"),
            command,
            &log_dir.join(format!("{instance}.log")),
        )
    }

    /// Starts a `chime-test-worker` process as worker `id` of `group`.
    pub fn worker(
        binary: &Path,
        id: &str,
        env: &WorkerEnv<'_>,
        log_dir: &Path,
    ) -> anyhow::Result<Process> {
        let mut command = Command::new(binary);
        command
            .env("CHIME_TEST_DATABASE_URL", env.database_url)
            .env("CHIME_TEST_AMQP_URLS", env.amqp_urls.join(","))
            .env("CHIME_TEST_PREFIX", env.prefix)
            .env("CHIME_TEST_GROUP", env.group)
            .env("CHIME_TEST_WORKER_ID", id)
            .env("CHIME_TEST_CAPACITY", env.capacity.to_string())
            .env("CHIME_TEST_CHAOS_JOBS", env.chaos_jobs.to_string())
            .env(
                "RUST_LOG",
                "warn,chime_worker::worker=info,chime_worker::consumer=info",
            )
            .env("NO_COLOR", "1");
        if let Some(ca) = env.amqp_ca_file {
            command.env("CHIME_TEST_AMQP_CA_FILE", ca);
        }
        Process::spawn(
            &format!("worker {id}"),
            command,
            &log_dir.join(format!("{id}.log")),
        )
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where its output goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Lines the process wrote to stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.all()
    }

    /// When a JSON log line with this message first appeared on stderr.
    pub fn logged(&self, message: &str) -> Option<Instant> {
        self.messages
            .lock()
            .expect("not poisoned")
            .get(message)
            .copied()
    }

    /// Waits until the process logs `message` (a JSON log line), failing if it exits or
    /// `timeout` passes.
    pub async fn wait_for_log(&mut self, message: &str, timeout: Duration) -> anyhow::Result<()> {
        let what = format!("{} to log {message:?}", self.name);
        let logged = try_wait_for(timeout, &what, async || match self.ensure_running() {
            Ok(()) => self.logged(message).map(|_| Ok(())),
            Err(exited) => Some(Err(exited)),
        })
        .await;
        match logged {
            Ok(outcome) => outcome,
            Err(timed_out) => bail!("{timed_out}; its log: {}", self.log.display()),
        }
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid).context("pid fits in i32")?;
        kill(Pid::from_raw(pid), signal)
            .with_context(|| format!("sending {signal} to {}", self.name))
    }

    /// SIGKILL, then reap (and wait for the rest of its output).
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_none() {
            self.signal(Signal::SIGKILL)?;
        }
        self.child.wait().await?;
        self.drain_output().await;
        Ok(())
    }

    /// SIGTERM, then waits up to `timeout` for a graceful exit (SIGKILL after it). Returns
    /// whether the process exited by itself and successfully.
    pub async fn stop(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        if self.child.try_wait()?.is_some() {
            self.drain_output().await;
            return Ok(false);
        }
        // A frozen process would sit on SIGTERM forever.
        self.signal(Signal::SIGCONT)?;
        self.signal(Signal::SIGTERM)?;
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                self.drain_output().await;
                Ok(status.success())
            }
            Err(_) => {
                eprintln!("{} did not stop within {timeout:?}; killing it", self.name);
                self.kill().await?;
                Ok(false)
            }
        }
    }

    /// Waits (a little) for the output the exited process left in its pipes to reach the log.
    async fn drain_output(&mut self) {
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(OUTPUT_DRAIN, reader).await;
        }
    }

    /// Fails if the process has exited, pointing at its log.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); its log: {}\n{}",
                self.name,
                self.log.display(),
                tail(&self.log)
            );
        }
        Ok(())
    }

    /// CPU time (user + system, all threads) the process has used.
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        let path = format!("/proc/{}/stat", self.pid);
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        // Fields after the command name, which is in parentheses and may contain spaces:
        // state is field 3, utime 14, stime 15 (proc(5)).
        let after = stat.rsplit_once(')').context("malformed /proc/PID/stat")?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| -> anyhow::Result<u64> {
            Ok(fields.get(i).context("short /proc/PID/stat")?.parse()?)
        };
        let total = ticks(11)? + ticks(12)?;
        let per_second = sysconf(SysconfVar::CLK_TCK)?.context("CLK_TCK is defined")?;
        Ok(Duration::from_secs_f64(total as f64 / per_second as f64))
    }

    /// Resident memory now and its peak (`VmRSS`, `VmHWM`), in bytes.
    pub fn memory(&self) -> anyhow::Result<(u64, u64)> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let kib = |key: &str| -> anyhow::Result<u64> {
            let line = status
                .lines()
                .find(|l| l.starts_with(key))
                .with_context(|| format!("{key} missing from {path}"))?;
            let number = line
                .split_whitespace()
                .nth(1)
                .with_context(|| format!("malformed {key} line"))?;
            Ok(number.parse::<u64>()? * 1024)
        };
        Ok((kib("VmRSS:")?, kib("VmHWM:")?))
    }
}

/// Copies each line of `stream` to the log file and hands it to `each`, until the stream ends.
fn read_lines(
    stream: impl AsyncRead + Unpin + Send + 'static,
    log: Arc<Mutex<std::fs::File>>,
    mut each: impl FnMut(&str) + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            {
                let mut file = log.lock().expect("not poisoned");
                let _ = writeln!(file, "{line}");
            }
            each(&line);
        }
    })
}

/// The message of a JSON log line from `tracing_subscriber`'s JSON format.
fn log_message(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    value
        .get("fields")?
        .get("message")?
        .as_str()
        .map(str::to_owned)
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Where a scheduler process finds its services and jobs.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerEnv<'a> {
    /// PostgreSQL URL of the cluster's database.
    pub database_url: &'a str,
    /// The broker's addresses: one (`CHIME_AMQP_URL`) or a cluster's (`CHIME_AMQP_URLS`).
    pub amqp_urls: &'a [String],
    /// CA certificates trusted for `amqps://` addresses (`CHIME_AMQP_TLS__CA_FILE`).
    pub amqp_ca_file: Option<&'a Path>,
    /// Queue prefix.
    pub prefix: &'a str,
    /// The job file.
    pub jobs: &'a Path,
    /// Log JSON lines (`CHIME_LOG_FORMAT=json`), whose messages [`Process::logged`] reads.
    pub json_logs: bool,
}

/// Where a worker process finds its services, and what it consumes.
#[derive(Debug, Clone, Copy)]
pub struct WorkerEnv<'a> {
    /// PostgreSQL URL.
    pub database_url: &'a str,
    /// The broker's addresses, tried in order.
    pub amqp_urls: &'a [String],
    /// CA certificates trusted for `amqps://` addresses.
    pub amqp_ca_file: Option<&'a Path>,
    /// Queue prefix.
    pub prefix: &'a str,
    /// Executor group.
    pub group: &'a str,
    /// Concurrent handlers.
    pub capacity: u16,
    /// Handle the chaos suite's jobs `chaos-0000` … (this many).
    pub chaos_jobs: usize,
}

/// `name` next to the running executable (or next to its `deps/` directory, for a test
/// binary): how tests and commands in this crate find `chime` and `chime-test-worker`, which
/// `cargo test --workspace` and `cargo build --workspace` build into the same directory.
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("this executable has no directory")?;
    let mut candidates = vec![dir.join(name)];
    if dir.file_name().is_some_and(|n| n == "deps")
        && let Some(profile) = dir.parent()
    {
        candidates.push(profile.join(name));
    }
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .with_context(|| {
            format!(
                "{name} is not built next to {} (build the whole workspace first: `cargo build \
                 --workspace`)",
                exe.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_message_of_a_json_log_line() {
        let line = r#"{"timestamp":"2026-01-01T00:00:00Z","level":"INFO","fields":{"message":"scheduler started","instance":"a"},"target":"chime_scheduler::service"}"#;
        assert_eq!(log_message(line).as_deref(), Some("scheduler started"));
        assert_eq!(log_message("plain text"), None);
    }
}
