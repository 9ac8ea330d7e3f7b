//! `chime scheduler --watch`: the directories that hold the job files are watched, and a burst
//! of changes in them sends one message on the reload channel, the same reload as SIGHUP.
//!
//! Directories, not files: an editor or `sed -i` replaces a file by renaming a new one over it,
//! and Kubernetes updates a mounted ConfigMap by swapping its `..data` symlink in the mounted
//! directory. A watch on the file's inode would miss both, or see the first change only; a watch
//! on its directory sees every one. The directory of a pattern is its part before the first
//! wildcard (`jobs.d/*.toml` → `jobs.d`), watched recursively when a wildcard is in a directory
//! (`jobs/*/cron.toml`, `jobs/**/*.toml`).
//!
//! Debounce ([`Debounce`]): the reload is sent once no relevant change has come for
//! [`Debounce::quiet`] (500 ms by default), and at the latest [`Debounce::max_delay`] (5 s) after
//! the first change of the burst, so a file written in several steps, or a ConfigMap swap (a
//! directory created, a link made and renamed, the old directory removed), is read once, after
//! its last step. Opens and reads (the reload's own among them) are not changes.
//!
//! A watcher that cannot start, a directory that cannot be watched or is removed, and event
//! errors are logged and stop nothing: the scheduler goes on with the jobs it has, and SIGHUP
//! still reloads. What a reload does with an invalid file is the reload's business (the
//! previous jobs stay, the error is logged).

use std::path::{Component, PathBuf};
use std::time::Duration;

use notify::event::EventKind;
use notify::{RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How a burst of changes becomes one reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    /// The reload is sent once no change has come for this long.
    pub quiet: Duration,
    /// …and at the latest this long after the first change of a burst, however long it lasts.
    pub max_delay: Duration,
}

impl Default for Debounce {
    fn default() -> Debounce {
        Debounce {
            quiet: Duration::from_millis(500),
            max_delay: Duration::from_secs(5),
        }
    }
}

/// One directory to watch for the job files of `patterns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedDir {
    /// The directory.
    pub dir: PathBuf,
    /// Whether job files may be in its subdirectories (a wildcard in a directory part).
    pub recursive: bool,
}

/// The directories to watch for the job file patterns `patterns` (the `jobs` setting), each
/// once; a recursive watch covers the directories below it.
pub fn watched_dirs(patterns: &[PathBuf]) -> Vec<WatchedDir> {
    let mut dirs: Vec<WatchedDir> = Vec::new();
    for pattern in patterns {
        let components: Vec<Component<'_>> = pattern.components().collect();
        let wildcard = components
            .iter()
            .position(|c| c.as_os_str().to_string_lossy().contains(['*', '?', '[']));
        let (base, recursive) = match wildcard {
            // A file: its directory.
            None => (
                components[..components.len().saturating_sub(1)].iter(),
                false,
            ),
            // A pattern: the directories before its first wildcard; recursive unless the
            // wildcard is in the file name.
            Some(i) => (components[..i].iter(), i + 1 < components.len()),
        };
        let mut dir: PathBuf = base.collect();
        if dir.as_os_str().is_empty() {
            dir = PathBuf::from(".");
        }
        let watched = WatchedDir { dir, recursive };
        if let Some(same) = dirs.iter_mut().find(|d| d.dir == watched.dir) {
            same.recursive |= watched.recursive;
        } else {
            dirs.push(watched);
        }
    }
    // A directory below a recursively watched one is watched through it.
    let covered: Vec<WatchedDir> = dirs.clone();
    dirs.retain(|d| {
        !covered
            .iter()
            .any(|r| r.recursive && r.dir != d.dir && d.dir.starts_with(&r.dir))
    });
    dirs
}

/// Whether `kind` may change what a reload reads: not an open, a read or a close.
fn is_change(kind: &EventKind) -> bool {
    !matches!(kind, EventKind::Access(_))
}

/// Watches the directories of `patterns` and sends `()` on `reload` after each burst of changes
/// ([`Debounce`]), until `stop` is cancelled or `reload` is closed. Returns at once; everything
/// that goes wrong is logged, nothing is returned (module docs).
pub fn spawn(
    patterns: &[PathBuf],
    reload: mpsc::Sender<()>,
    debounce: Debounce,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let dirs = watched_dirs(patterns);
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    // Called on notify's own thread; an unbounded send never blocks it.
    let handler = move |event: notify::Result<notify::Event>| {
        let _ = events_tx.send(event);
    };
    let watcher = match RecommendedWatcher::new(handler, notify::Config::default()) {
        Ok(mut watcher) => {
            let mut watching = Vec::new();
            for WatchedDir { dir, recursive } in &dirs {
                let mode = if *recursive {
                    RecursiveMode::Recursive
                } else {
                    RecursiveMode::NonRecursive
                };
                match watcher.watch(dir, mode) {
                    Ok(()) => watching.push(dir.display().to_string()),
                    Err(e) => warn!(
                        dir = %dir.display(),
                        error = %e,
                        "cannot watch this job file directory; its changes reload only on SIGHUP"
                    ),
                }
            }
            info!(
                dirs = ?watching,
                quiet_ms = debounce.quiet.as_millis() as u64,
                "watching the job files; a change reloads them"
            );
            Some(watcher)
        }
        Err(e) => {
            warn!(error = %e, "cannot watch the job files; they reload only on SIGHUP");
            None
        }
    };
    let watched: Vec<PathBuf> = dirs.into_iter().map(|d| d.dir).collect();
    tokio::spawn(async move {
        // Owned by the task: dropping it ends the watches.
        let _watcher = watcher;
        debounce_loop(events_rx, watched, reload, debounce, stop).await;
    })
}

/// Turns the watcher's events into debounced reload messages.
async fn debounce_loop(
    mut events: mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
    watched: Vec<PathBuf>,
    reload: mpsc::Sender<()>,
    debounce: Debounce,
    stop: CancellationToken,
) {
    // The instant the pending reload is due, and the latest it may be (first change + max).
    let mut pending: Option<(Instant, Instant)> = None;
    loop {
        let due = pending.map(|(due, _)| due);
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until(due) => {
                pending = None;
                match reload.try_send(()) {
                    Ok(()) => info!("job files changed: reloading them"),
                    // A reload is queued already; it reads the files as they are now.
                    Err(mpsc::error::TrySendError::Full(())) => {}
                    Err(mpsc::error::TrySendError::Closed(())) => return,
                }
            }
            event = events.recv() => {
                let Some(event) = event else { return };
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        warn!(error = %e, "watching the job files failed; reloading to be safe");
                        // What changed is unknown (a lost event, a queue overflow): reload.
                        notify::Event::new(EventKind::Any)
                    }
                };
                if !is_change(&event.kind) {
                    continue;
                }
                if matches!(event.kind, EventKind::Remove(_)) {
                    for dir in event.paths.iter().filter(|p| watched.contains(p)) {
                        warn!(
                            dir = %dir.display(),
                            "a watched job file directory was removed: its job files are no \
                             longer watched (SIGHUP still reloads; restart to watch it again)"
                        );
                    }
                }
                let now = Instant::now();
                let latest = pending.map_or(now + debounce.max_delay, |(_, latest)| latest);
                pending = Some(((now + debounce.quiet).min(latest), latest));
            }
        }
    }
}

/// Sleeps until `at`, or forever when there is nothing due.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
