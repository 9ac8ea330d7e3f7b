//! Child processes the process-level scenarios start, signal and measure: `chime scheduler`
//! instances and `chime-bench worker`s. Their output goes to a log file in the sandbox; stdout
//! lines are also kept (workers report handler starts there), and the messages of JSON log lines
//! on stderr are remembered with the instant they first appeared.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, SysconfVar, sysconf};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::sandbox::Sandbox;

/// A running child process, killed if dropped.
pub struct Process {
    /// A short name for messages (`scheduler a`, `worker b`).
    pub name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    stdout: Arc<Mutex<Vec<String>>>,
    messages: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Process {
    /// Starts `command`, logging its output to `log`.
    pub fn spawn(name: &str, mut command: Command, log: PathBuf) -> anyhow::Result<Process> {
        // Settings of the bench's own environment must not leak into the children.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CHIME_") {
                command.env_remove(&key);
            }
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("the child exited at once")?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let messages = Arc::new(Mutex::new(HashMap::new()));
        let out = child.stdout.take().context("piped stdout")?;
        let err = child.stderr.take().context("piped stderr")?;
        let (lines_tx, mut lines_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let kept = stdout.clone();
        let out_tx = lines_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().expect("not poisoned").push(line.clone());
                let _ = out_tx.send(line);
            }
        });
        let seen = messages.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(message) = log_message(&line) {
                    seen.lock()
                        .expect("not poisoned")
                        .entry(message)
                        .or_insert_with(Instant::now);
                }
                let _ = lines_tx.send(line);
            }
        });
        let log_path = log.clone();
        tokio::spawn(async move {
            let Ok(mut file) = tokio::fs::File::create(&log_path).await else {
                return;
            };
            while let Some(line) = lines_rx.recv().await {
                let _ = file.write_all(line.as_bytes()).await;
                let _ = file.write_all(b"\n").await;
            }
            let _ = file.flush().await;
        });
        Ok(Process {
            name: name.to_owned(),
            child,
            pid,
            log,
            stdout,
            messages,
        })
    }

    /// Starts `chime scheduler --jobs <jobs>` against the sandbox as instance `instance`.
    pub fn scheduler(
        chime: &Path,
        sandbox: &Sandbox,
        instance: &str,
        jobs: &Path,
    ) -> anyhow::Result<Process> {
        let mut command = Command::new(chime);
        command
            .arg("scheduler")
            .arg("--jobs")
            .arg(jobs)
            .env("CHIME_DATABASE_URL", &sandbox.database_url)
            .env("CHIME_AMQP_URL", &sandbox.amqp_url)
            .env("CHIME_QUEUE_PREFIX", &sandbox.prefix)
            .env("CHIME_INSTANCE_ID", instance)
            // Any free port: several instances run side by side.
            .env("CHIME_BIND", "127.0.0.1:0")
            .env("CHIME_LOG_FORMAT", "json")
            .env("RUST_LOG", "info,sqlx=warn,lapin=warn")
            .env("NO_COLOR", "1");
        Process::spawn(
            &format!("scheduler {instance}"),
            command,
            sandbox.path(&format!("{instance}.log")),
        )
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lines the process wrote to stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().expect("not poisoned").clone()
    }

    /// When a JSON log line with this message first appeared on stderr.
    pub fn logged(&self, message: &str) -> Option<Instant> {
        self.messages
            .lock()
            .expect("not poisoned")
            .get(message)
            .copied()
    }

    /// Fails if the process has exited, pointing at its log.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited early ({status}); its log: {}\n{}",
                self.name,
                self.log.display(),
                tail(&self.log)
            );
        }
        Ok(())
    }

    /// Waits until the process logs `message`, failing if it exits or `timeout` passes.
    pub async fn wait_for_log(&mut self, message: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while self.logged(message).is_none() {
            self.ensure_running()?;
            if Instant::now() >= deadline {
                bail!(
                    "{} did not log {message:?} within {timeout:?}; its log: {}",
                    self.name,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Ok(())
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.signal(Signal::SIGKILL)?;
        self.child.wait().await?;
        Ok(())
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid).context("pid fits in i32")?;
        kill(Pid::from_raw(pid), signal)
            .with_context(|| format!("sending {signal} to {}", self.name))
    }

    /// SIGTERM, then waits up to `timeout` for a graceful exit (SIGKILL after it). Returns
    /// whether the process exited by itself and successfully.
    pub async fn stop(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        if self.child.try_wait()?.is_some() {
            return Ok(false);
        }
        self.signal(Signal::SIGTERM)?;
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => Ok(status?.success()),
            Err(_) => {
                eprintln!("{} did not stop within {timeout:?}; killing it", self.name);
                self.kill().await?;
                Ok(false)
            }
        }
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
