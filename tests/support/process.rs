//! Child processes the process-level tests start and signal: `chime scheduler` instances and
//! `chime-test-worker`s. Each one's stderr goes to a log file; its stdout lines are kept (the
//! test worker reports each handler start there).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// A running child process, SIGKILLed if dropped.
pub struct Process {
    /// A short name for messages (`scheduler a`, `worker w1`).
    pub name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    stdout: Arc<Mutex<Vec<String>>>,
}

impl Process {
    /// Starts `command` with stderr going to `log` and stdout lines kept.
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
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("the child exited at once")?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().context("piped stdout")?;
        let kept = stdout.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().expect("not poisoned").push(line);
            }
        });
        Ok(Process {
            name: name.to_owned(),
            child,
            pid,
            log: log.to_owned(),
            stdout,
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
            .env("CHIME_AMQP_URL", env.amqp_url)
            .env("CHIME_QUEUE_PREFIX", env.prefix)
            .env("CHIME_INSTANCE_ID", instance)
            // Any free port: several instances run side by side.
            .env("CHIME_BIND", "127.0.0.1:0")
            .env("RUST_LOG", "info,sqlx=warn,lapin=warn")
            .env("NO_COLOR", "1");
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
            .env("CHIME_TEST_AMQP_URL", env.amqp_url)
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

    /// Where its stderr goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Lines the process wrote to stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().expect("not poisoned").clone()
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid).context("pid fits in i32")?;
        kill(Pid::from_raw(pid), signal)
            .with_context(|| format!("sending {signal} to {}", self.name))
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_none() {
            self.signal(Signal::SIGKILL)?;
        }
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, then waits up to `timeout` for a graceful exit (SIGKILL after it). Returns
    /// whether the process exited by itself and successfully.
    pub async fn stop(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        if self.child.try_wait()?.is_some() {
            return Ok(false);
        }
        // A frozen process would sit on SIGTERM forever.
        self.signal(Signal::SIGCONT)?;
        self.signal(Signal::SIGTERM)?;
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => Ok(status?.success()),
            Err(_) => {
                self.kill().await?;
                Ok(false)
            }
        }
    }

    /// Fails if the process has exited.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); its log: {}",
                self.name,
                self.log.display()
            );
        }
        Ok(())
    }
}

/// Where a scheduler process finds its services and jobs.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerEnv<'a> {
    /// PostgreSQL URL of the cluster's database.
    pub database_url: &'a str,
    /// RabbitMQ URL.
    pub amqp_url: &'a str,
    /// Queue prefix.
    pub prefix: &'a str,
    /// The job file.
    pub jobs: &'a Path,
}

/// Where a worker process finds its services, and what it consumes.
#[derive(Debug, Clone, Copy)]
pub struct WorkerEnv<'a> {
    /// PostgreSQL URL.
    pub database_url: &'a str,
    /// RabbitMQ URL.
    pub amqp_url: &'a str,
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
