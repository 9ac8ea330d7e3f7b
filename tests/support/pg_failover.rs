//! A PostgreSQL primary/standby pair for the failover tests, and the switchable TCP proxy their
//! clients connect through: a [`PrivatePostgres`] primary streaming to a [`Standby`] made with
//! `pg_basebackup -R` on its own port and data directory, optionally with synchronous
//! replication ([`require_synchronous`]); the standby is promoted after the primary is stopped
//! or crashed, and a [`SwitchProxy`] moves the clients' address to it the way a managed
//! database's endpoint moves: every open connection is closed, new ones reach the new primary.
//!
//! Like [`crate::services`], the servers run as `postgres` (`runuser -u`) when this process is
//! root, and dropping them stops them and deletes their data.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use sqlx::{Connection as _, PgConnection};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::services::{
    PG_BIN, PrivatePostgres, command_as, data_dir, free_port, install_server_tls, run, ssl_options,
};

/// `PG_BIN/program`, as `postgres` when this process is root.
fn pg_command(program: &str) -> Command {
    command_as("postgres", &Path::new(PG_BIN).join(program))
}

/// The port of a [`PrivatePostgres`] (from its URL, `postgres://postgres@127.0.0.1:PORT`).
pub fn port_of(postgres: &PrivatePostgres) -> u16 {
    postgres
        .server_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the server URL ends in its port")
}

/// Checks that `primary` can stream to a standby: `wal_level` at least `replica` and WAL
/// senders allowed (PostgreSQL 15's defaults, which a plain `initdb` has), and a `trust`
/// `replication` entry for 127.0.0.1 in `pg_hba.conf` (`initdb -A trust` writes one).
pub async fn check_replication_ready(primary: &PrivatePostgres) -> anyhow::Result<()> {
    let mut db = PgConnection::connect(&primary.url("postgres")).await?;
    let wal_level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut db)
        .await?;
    let senders: String = sqlx::query_scalar("SHOW max_wal_senders")
        .fetch_one(&mut db)
        .await?;
    if wal_level == "minimal" || senders == "0" {
        bail!("the primary cannot stream: wal_level = {wal_level}, max_wal_senders = {senders}");
    }
    let rules: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_hba_file_rules
         WHERE 'replication' = ANY(database) AND auth_method = 'trust'
           AND (type = 'local' OR address = '127.0.0.1')",
    )
    .fetch_one(&mut db)
    .await?;
    if rules == 0 {
        bail!("pg_hba.conf has no trust entry for replication connections from 127.0.0.1");
    }
    db.close().await?;
    Ok(())
}

/// A hot standby of a primary, cloned with `pg_basebackup -R` (so it has `standby.signal` and
/// `primary_conninfo`) and streaming from it, on its own free port and temporary directory.
pub struct Standby {
    port: u16,
    dir: tempfile::TempDir,
    running: bool,
    /// Its own copies of the primary's certificate and key, when the primary has TLS on.
    tls: Option<(PathBuf, PathBuf)>,
}

impl Standby {
    /// Clones the primary reachable at 127.0.0.1:`source_port` (the primary itself, or a
    /// [`SwitchProxy`] in front of it: the standby keeps streaming from that address) and
    /// starts the copy as a standby, with TLS on like `primary` (the same certificate, so
    /// clients that verify it see no difference after a failover). Blocking.
    pub fn clone_from(source_port: u16, primary: &PrivatePostgres) -> anyhow::Result<Standby> {
        let dir = data_dir("chime-standby-pg-", "postgres")?;
        let tls = primary
            .tls_files()
            .map(|(cert, key)| install_server_tls(cert, key, dir.path()))
            .transpose()?;
        run(
            "pg_basebackup",
            pg_command("pg_basebackup")
                .arg("-D")
                .arg(dir.path().join("data"))
                .args(["-h", "127.0.0.1", "-p", &source_port.to_string()])
                .args(["-U", "postgres", "-X", "stream", "-c", "fast", "-R"]),
        )?;
        if !dir.path().join("data/standby.signal").exists() {
            bail!("pg_basebackup -R wrote no standby.signal");
        }
        let mut standby = Standby {
            port: free_port()?,
            dir,
            running: false,
            tls,
        };
        standby.start_server()?;
        Ok(standby)
    }

    fn start_server(&mut self) -> anyhow::Result<()> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 \
             -c hot_standby=on -c wal_receiver_status_interval=1s",
            self.port,
            self.dir.path().display()
        );
        if let Some(tls) = &self.tls {
            options.push_str(&ssl_options(tls));
        }
        run(
            "pg_ctl start (standby)",
            pg_command("pg_ctl")
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .arg("-l")
                .arg(self.dir.path().join("server.log"))
                .args(["-w", "-t", "60", "-o", &options, "start"]),
        )?;
        self.running = true;
        Ok(())
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Promotes it to a primary (`pg_ctl promote`, waiting until it accepts writes). Blocking.
    pub fn promote(&self) -> anyhow::Result<()> {
        run(
            "pg_ctl promote",
            pg_command("pg_ctl")
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .args(["-w", "-t", "60", "promote"]),
        )
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        if self.running {
            let _ = run(
                "pg_ctl stop (standby)",
                pg_command("pg_ctl")
                    .arg("-D")
                    .arg(self.dir.path().join("data"))
                    .args(["-w", "-t", "60", "-m", "immediate", "stop"]),
            );
        }
    }
}

/// Waits until the primary streams to its (one) standby, in `sync_state` `sync` when
/// `synchronous`.
pub async fn wait_streaming(
    primary: &PrivatePostgres,
    synchronous: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let mut db = PgConnection::connect(&primary.url("postgres")).await?;
    let what = if synchronous {
        "the standby to stream synchronously"
    } else {
        "the standby to stream"
    };
    crate::try_wait_for(timeout, what, async || {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT state, sync_state FROM pg_stat_replication ORDER BY pid LIMIT 1",
        )
        .fetch_optional(&mut db)
        .await
        .map_err(|e| e.to_string())?;
        match row {
            Some((state, sync)) if state == "streaming" && (!synchronous || sync == "sync") => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    db.close().await?;
    Ok(())
}

/// Makes every commit on `primary` wait until the standby has it
/// (`synchronous_standby_names = '*'`, `synchronous_commit = on`; `ALTER SYSTEM` and a reload,
/// after the standby was cloned, so the standby's own copy of the settings does not ask for a
/// standby of its own once promoted), and waits until the standby is the synchronous one.
pub async fn require_synchronous(primary: &PrivatePostgres) -> anyhow::Result<()> {
    let mut db = PgConnection::connect(&primary.url("postgres")).await?;
    for statement in [
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "ALTER SYSTEM SET synchronous_commit = 'on'",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(statement).execute(&mut db).await?;
    }
    db.close().await?;
    wait_streaming(primary, true, Duration::from_secs(30)).await
}

/// A TCP proxy on 127.0.0.1 forwarding to a target that can be switched, as a managed
/// database's endpoint is: [`SwitchProxy::switch`] closes every open connection (clients see
/// their connections drop, as when the old primary goes away) and sends new ones to the new
/// target; [`SwitchProxy::cut`] closes them and refuses new ones until the next switch.
pub struct SwitchProxy {
    port: u16,
    target: Arc<watch::Sender<Option<String>>>,
    stop: CancellationToken,
}

impl SwitchProxy {
    /// Starts a proxy on a free loopback port forwarding to `target` (`host:port`).
    pub async fn start(target: &str) -> anyhow::Result<SwitchProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let port = listener.local_addr()?.port();
        let (target, _) = watch::channel(Some(target.to_owned()));
        let target = Arc::new(target);
        let stop = CancellationToken::new();
        let (targets, stopped) = (target.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((mut client, _)) = accepted else {
                    continue;
                };
                // Subscribed before the target is read: a switch after this read is seen.
                let mut moved = targets.subscribe();
                let Some(to) = moved.borrow_and_update().clone() else {
                    continue;
                };
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = moved.changed() => {}
                        () = stopped.cancelled() => {}
                    }
                });
            }
        });
        Ok(SwitchProxy { port, target, stop })
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/name`: database `name` behind the proxy.
    pub fn postgres_url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Closes every open connection and forwards new ones to `target` (`host:port`).
    pub fn switch(&self, target: &str) {
        self.target.send_replace(Some(target.to_owned()));
    }

    /// Closes every open connection and refuses new ones until [`SwitchProxy::switch`].
    pub fn cut(&self) {
        self.target.send_replace(None);
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
