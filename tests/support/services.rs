//! Private PostgreSQL and RabbitMQ instances for the chaos tests, which stop and restart them,
//! and for the TLS tests, which need servers with TLS on (`start_with_tls`): each on its own
//! free ports and in its own temporary data directory, so the shared services (5432, 5672)
//! other tests use are never touched. Dropping an instance stops it and deletes its data.
//!
//! PostgreSQL refuses to run as root and RabbitMQ runs as its own user, so when this process is
//! root the server commands run as `postgres` / `rabbitmq` (`runuser -u`), in directories those
//! users own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// PostgreSQL 15's server binaries (Debian's layout).
pub(crate) const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// RabbitMQ's own scripts, not Debian's wrappers (which always switch to the default node).
const RABBIT_BIN: &str = "/usr/lib/rabbitmq/bin";
/// RabbitMQ's home, where its Erlang cookie lives; the CLI needs the same cookie as the node.
const RABBIT_HOME: &str = "/var/lib/rabbitmq";

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding port 0")?;
    Ok(listener.local_addr()?.port())
}

pub(crate) fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self belongs to this process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `program args…`, as `user` when this process is root.
pub(crate) fn command_as(user: &str, program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.arg("-u").arg(user).arg("--").arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// A temporary directory the service's user owns.
pub(crate) fn data_dir(prefix: &str, user: &str) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary directory")?;
    if is_root() {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{user}:"))
            .arg(dir.path())
            .status()
            .context("running chown")?;
        if !status.success() {
            bail!("chown {user} {} failed", dir.path().display());
        }
    }
    Ok(dir)
}

/// Runs `command` to completion; its output in the error when it fails.
pub(crate) fn run(what: &str, command: &mut Command) -> anyhow::Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Copies `from` into `dir` as `name`, owned by `user` (when root) and readable by it only:
/// PostgreSQL refuses a key file others can read.
fn install_file(from: &Path, dir: &Path, name: &str, user: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let to = dir.join(name);
    std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))?;
    if is_root() {
        run(
            "chown",
            Command::new("chown").arg(format!("{user}:")).arg(&to),
        )?;
    }
    Ok(to)
}

/// Copies a server certificate and key into `dir` for `postgres` (the key readable by it only).
pub(crate) fn install_server_tls(
    cert: &Path,
    key: &Path,
    dir: &Path,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    Ok((
        install_file(cert, dir, "server.pem", "postgres")?,
        install_file(key, dir, "server.key", "postgres")?,
    ))
}

/// The `pg_ctl -o` options that turn TLS on with a certificate and key.
pub(crate) fn ssl_options((cert, key): &(PathBuf, PathBuf)) -> String {
    format!(
        " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
        cert.display(),
        key.display()
    )
}

/// A private PostgreSQL server (trust auth, user `postgres`).
pub struct PrivatePostgres {
    port: u16,
    dir: tempfile::TempDir,
    running: bool,
    /// `ssl=on` with this certificate and key (in the data directory), if TLS is on.
    tls: Option<(PathBuf, PathBuf)>,
}

impl PrivatePostgres {
    /// Initialises a cluster in a temporary directory and starts it on a free port.
    pub fn start() -> anyhow::Result<PrivatePostgres> {
        PrivatePostgres::start_inner(None)
    }

    /// [`PrivatePostgres::start`] with TLS on (`ssl=on`), presenting the certificate chain in
    /// `cert_file` with the key in `key_file` (PEM; copied into the instance's directory).
    /// Clients may still connect without TLS (`sslmode` decides).
    pub fn start_with_tls(cert_file: &Path, key_file: &Path) -> anyhow::Result<PrivatePostgres> {
        PrivatePostgres::start_inner(Some((cert_file, key_file)))
    }

    fn start_inner(tls: Option<(&Path, &Path)>) -> anyhow::Result<PrivatePostgres> {
        let dir = data_dir("chime-chaos-pg-", "postgres")?;
        let tls = tls
            .map(|(cert, key)| install_server_tls(cert, key, dir.path()))
            .transpose()?;
        run(
            "initdb",
            command_as("postgres", &Path::new(PG_BIN).join("initdb"))
                .arg("-D")
                .arg(dir.path().join("data"))
                .args(["-A", "trust", "-U", "postgres", "--no-sync"]),
        )?;
        let mut pg = PrivatePostgres {
            port: free_port()?,
            dir,
            running: false,
            tls,
        };
        pg.start_server()?;
        Ok(pg)
    }

    /// The server URL, without a database.
    pub fn server_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.server_url())
    }

    /// The certificate and key the server presents (copies in its directory), if TLS is on.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        self.tls.as_ref().map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// [`PrivatePostgres::url`] with TLS required and the server verified against `ca`
    /// (chain and host name): `sslmode=verify-full&sslrootcert=CA`.
    pub fn verify_full_url(&self, name: &str, ca: &Path) -> String {
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            self.url(name),
            ca.display()
        )
    }

    /// Starts the server again after [`PrivatePostgres::stop`], on the same port and data.
    pub fn start_server(&mut self) -> anyhow::Result<()> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        if let Some(tls) = &self.tls {
            options.push_str(&ssl_options(tls));
        }
        run(
            "pg_ctl start",
            command_as("postgres", &Path::new(PG_BIN).join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .arg("-l")
                .arg(self.dir.path().join("server.log"))
                .args(["-w", "-t", "60", "-o", &options, "start"]),
        )?;
        self.running = true;
        Ok(())
    }

    /// Stops the server: `fast` disconnects clients and shuts down cleanly; `immediate` is a
    /// crash (no shutdown checkpoint; recovery at the next start).
    pub fn stop(&mut self, mode: &str) -> anyhow::Result<()> {
        run(
            "pg_ctl stop",
            command_as("postgres", &Path::new(PG_BIN).join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .args(["-w", "-t", "60", "-m", mode, "stop"]),
        )?;
        self.running = false;
        Ok(())
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.stop("immediate");
        }
    }
}

/// The TLS listener of a [`PrivateRabbit`] (`listeners.ssl` with `ssl_options`), PEM files.
#[derive(Debug, Clone)]
pub struct RabbitTls {
    /// CA certificates the node trusts for client certificates.
    pub ca_file: PathBuf,
    /// The node's certificate chain.
    pub cert_file: PathBuf,
    /// The node's private key.
    pub key_file: PathBuf,
    /// `verify = verify_peer` and `fail_if_no_peer_cert = true`: a client without a
    /// certificate signed by `ca_file` is refused.
    pub require_client_cert: bool,
}

/// A private RabbitMQ node (`guest`/`guest` allowed from 127.0.0.1; no plugins, or only the
/// management plugin), run as a child process and controlled with `rabbitmqctl -n NODE`.
pub struct PrivateRabbit {
    node: String,
    port: u16,
    tls_port: Option<u16>,
    management_port: Option<u16>,
    dist_port: u16,
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl PrivateRabbit {
    /// Starts a node named `chime-chaos-<pid>-<n>@localhost` on free ports and waits until it
    /// has booted.
    pub fn start() -> anyhow::Result<PrivateRabbit> {
        PrivateRabbit::start_with(false, None)
    }

    /// [`PrivateRabbit::start`] with a TLS listener on another free port of 127.0.0.1 as well
    /// ([`PrivateRabbit::tls_url`]) besides the plaintext one ([`PrivateRabbit::url`]).
    pub fn start_with_tls(tls: &RabbitTls) -> anyhow::Result<PrivateRabbit> {
        PrivateRabbit::start_with(false, Some(tls))
    }

    /// [`PrivateRabbit::start`] with the management plugin enabled in the node's own
    /// `enabled_plugins` file (the shared broker's plugins are untouched), its HTTP API on
    /// another free port of 127.0.0.1, collecting statistics every second.
    pub fn start_with_management() -> anyhow::Result<PrivateRabbit> {
        PrivateRabbit::start_with(true, None)
    }

    /// A node with the management plugin or not, with a TLS listener or not.
    pub(crate) fn start_with(
        management: bool,
        tls: Option<&RabbitTls>,
    ) -> anyhow::Result<PrivateRabbit> {
        let dir = data_dir("chime-chaos-rabbit-", "rabbitmq")?;
        let port = free_port()?;
        let mut dist_port = free_port()?;
        while dist_port == port {
            dist_port = free_port()?;
        }
        let mut management_port = None;
        let mut config = format!("listeners.tcp.1 = 127.0.0.1:{port}\nloopback_users = none\n");
        let mut plugins = "[].\n";
        if management {
            let mut http = free_port()?;
            while http == port || http == dist_port {
                http = free_port()?;
            }
            config.push_str(&format!(
                "management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {http}\n\
                 collect_statistics_interval = 1000\n"
            ));
            plugins = "[rabbitmq_management].\n";
            management_port = Some(http);
        }
        let mut tls_port = None;
        if let Some(tls) = tls {
            let mut ssl = free_port()?;
            while [port, dist_port].contains(&ssl) || management_port == Some(ssl) {
                ssl = free_port()?;
            }
            let install = |from: &Path, name: &str| -> anyhow::Result<PathBuf> {
                let to = dir.path().join(name);
                std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
                Ok(to)
            };
            let (verify, fail) = if tls.require_client_cert {
                ("verify_peer", "true")
            } else {
                ("verify_none", "false")
            };
            config.push_str(&format!(
                "listeners.ssl.1 = 127.0.0.1:{ssl}
                 ssl_options.cacertfile = {}
                 ssl_options.certfile = {}
                 ssl_options.keyfile = {}
                 ssl_options.verify = {verify}
                 ssl_options.fail_if_no_peer_cert = {fail}
",
                install(&tls.ca_file, "ca.pem")?.display(),
                install(&tls.cert_file, "server.pem")?.display(),
                install(&tls.key_file, "server.key")?.display(),
            ));
            tls_port = Some(ssl);
        }
        std::fs::write(dir.path().join("rabbitmq.conf"), config)?;
        std::fs::write(dir.path().join("enabled_plugins"), plugins)?;
        if is_root() {
            run(
                "chown",
                Command::new("chown")
                    .arg("-R")
                    .arg("rabbitmq:")
                    .arg(dir.path()),
            )?;
        }
        let mut rabbit = PrivateRabbit {
            node: format!("{}@localhost", crate::unique("chime-chaos-")),
            port,
            tls_port,
            management_port,
            dist_port,
            dir,
            child: None,
        };
        rabbit.start_node()?;
        Ok(rabbit)
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `amqps://guest:guest@127.0.0.1:PORT/%2f` of the TLS listener, when the node has one.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("amqps://guest:guest@127.0.0.1:{port}/%2f"))
    }

    /// `http://127.0.0.1:PORT` of the management API, when the node has the plugin.
    pub fn management_url(&self) -> Option<String> {
        self.management_port
            .map(|port| format!("http://127.0.0.1:{port}"))
    }

    /// The node name, for `rabbitmqctl -n`.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts the node again after [`PrivateRabbit::stop`] (same ports, same data: durable
    /// queues and their messages survive) and waits until it has booted.
    pub fn start_node(&mut self) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.path("console.log"))?;
        let child = command_as("rabbitmq", &Path::new(RABBIT_BIN).join("rabbitmq-server"))
            .env("HOME", RABBIT_HOME)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.path("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.path("log"))
            .env("RABBITMQ_PID_FILE", self.path("pid"))
            .env("RABBITMQ_CONFIG_FILE", self.path("rabbitmq"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.path("enabled_plugins"),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting rabbitmq-server")?;
        self.child = Some(child);
        // The node registers with epmd only after a moment; until then `await_startup` fails
        // at once rather than waiting.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if self
                .ctl(&["await_startup", "--timeout", "60"])
                .output()
                .is_ok_and(|o| o.status.success())
            {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "rabbitmq-server exited during boot ({status}); see {}",
                    self.path("console.log").display()
                );
            }
            if Instant::now() >= deadline {
                bail!("RabbitMQ node {} did not boot within 90 s", self.node);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Stops the node (`rabbitmqctl stop`, which waits until the Erlang VM has exited).
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let pid_file = self.path("pid");
        let pid_file = pid_file.to_string_lossy().into_owned();
        run("rabbitmqctl stop", &mut self.ctl(&["stop", &pid_file]))?;
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        Ok(())
    }

    /// Kills the node's Erlang VM with SIGKILL (a crash: no clean shutdown) and reaps it.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        let pid: i32 = std::fs::read_to_string(self.path("pid"))
            .context("reading the node's pid file")?
            .trim()
            .parse()
            .context("the node's pid file holds a number")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .context("killing the RabbitMQ node")?;
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        // The VM is gone once its pid no longer exists.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() >= deadline {
                bail!("RabbitMQ node {} survived SIGKILL", self.node);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Makes this node a member of `seed`'s cluster: `stop_app`, `join_cluster`, `start_app`.
    /// The node's own data is reset by joining, so call it before any client has used it.
    /// Both nodes run as `rabbitmq` with the same `HOME`, so they share its Erlang cookie.
    pub fn join_cluster(&mut self, seed: &str) -> anyhow::Result<()> {
        run("rabbitmqctl stop_app", &mut self.ctl(&["stop_app"]))?;
        run(
            "rabbitmqctl join_cluster",
            &mut self.ctl(&["join_cluster", seed]),
        )?;
        run("rabbitmqctl start_app", &mut self.ctl(&["start_app"]))?;
        run(
            "rabbitmqctl await_startup",
            &mut self.ctl(&["await_startup", "--timeout", "60"]),
        )
    }

    /// Whether the node's VM was started by this process and has not been stopped or killed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `rabbitmqctl -n NODE args…`, as `rabbitmq` when root.
    pub(crate) fn ctl(&self, args: &[&str]) -> Command {
        let mut command = command_as("rabbitmq", &Path::new(RABBIT_BIN).join("rabbitmqctl"));
        command
            .env("HOME", RABBIT_HOME)
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .stdin(Stdio::null());
        command
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if self.child.is_some() && self.stop().is_err() {
            // rabbitmqctl could not reach it: kill the VM by the pid it wrote.
            if let Some(pid) = std::fs::read_to_string(self.path("pid"))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
