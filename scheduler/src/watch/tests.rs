//! The job file watcher on real files (inotify): a burst of writes gives one reload, a file
//! replaced by rename and a ConfigMap-style `..data` swap give a reload each time; and the
//! debounce on paused time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, CreateKind, EventKind, ModifyKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;

/// Longest wait for a reload that must come, on a loaded machine.
const ARRIVES: Duration = Duration::from_secs(30);

#[test]
fn the_directory_of_each_file_or_pattern_is_watched_once() {
    let p = |s: &str| PathBuf::from(s);
    let d = |dir: &str, recursive| WatchedDir {
        dir: p(dir),
        recursive,
    };
    for (patterns, want) in [
        (
            vec![p("/etc/chime/jobs/jobs.toml")],
            vec![d("/etc/chime/jobs", false)],
        ),
        (
            vec![p("/etc/chime/jobs/*.toml"), p("/etc/chime/jobs/*.yaml")],
            vec![d("/etc/chime/jobs", false)],
        ),
        (vec![p("jobs.toml")], vec![d(".", false)]),
        (vec![p("*.toml")], vec![d(".", false)]),
        (vec![p("jobs/*/cron.toml")], vec![d("jobs", true)]),
        (
            vec![
                p("jobs/**/*.toml"),
                p("jobs/team/a.toml"),
                p("other/b.toml"),
            ],
            vec![d("jobs", true), d("other", false)],
        ),
    ] {
        assert_eq!(watched_dirs(&patterns), want, "{patterns:?}");
    }
}

/// A watcher on `patterns` with `quiet`, and its reload channel.
fn watch(patterns: &[PathBuf], quiet: Duration) -> (mpsc::Receiver<()>, CancellationToken) {
    let (tx, rx) = mpsc::channel(4);
    let stop = CancellationToken::new();
    let debounce = Debounce {
        quiet,
        max_delay: Duration::from_secs(30),
    };
    spawn(patterns, tx, debounce, stop.clone());
    (rx, stop)
}

async fn reloads(rx: &mut mpsc::Receiver<()>, what: &str) {
    tokio::time::timeout(ARRIVES, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no reload after {what} within {ARRIVES:?}"))
        .expect("the watcher is running");
}

/// Waits until no reload has come for `calm`; returns how many came.
async fn settle(rx: &mut mpsc::Receiver<()>, calm: Duration) -> usize {
    let mut extra = 0;
    while let Ok(Some(())) = tokio::time::timeout(calm, rx.recv()).await {
        extra += 1;
    }
    extra
}

fn job_file(name: &str) -> String {
    format!("[[jobs]]\nname = \"{name}\"\ngroup = \"g\"\nschedule = \"* * * * *\"\n")
}

#[tokio::test]
async fn several_writes_in_a_burst_give_one_reload() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.toml");
    std::fs::write(&file, job_file("a")).unwrap();
    // A quiet window far longer than five writes take, even on a loaded machine.
    let quiet = Duration::from_secs(1);
    let (mut rx, stop) = watch(std::slice::from_ref(&file), quiet);
    for i in 0..5 {
        std::fs::write(&file, job_file(&format!("a{i}"))).unwrap();
    }
    reloads(&mut rx, "five writes").await;
    assert_eq!(
        settle(&mut rx, quiet * 3).await,
        0,
        "one reload for the burst"
    );
    // Reading the file (as the reload does) changes nothing.
    let _ = std::fs::read_to_string(&file).unwrap();
    assert_eq!(settle(&mut rx, quiet * 3).await, 0, "a read is no change");
    stop.cancel();
}

#[tokio::test]
async fn a_file_replaced_by_rename_reloads_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.toml");
    std::fs::write(&file, job_file("a")).unwrap();
    let (mut rx, stop) = watch(&[dir.path().join("*.toml")], Duration::from_millis(300));
    for round in 0..3 {
        // As `sed -i` and editors save: a new file, renamed over the old one (a new inode).
        let new = dir.path().join(format!(".jobs.toml.{round}"));
        std::fs::write(&new, job_file(&format!("r{round}"))).unwrap();
        std::fs::rename(&new, &file).unwrap();
        reloads(&mut rx, &format!("rename {round}")).await;
        settle(&mut rx, Duration::from_secs(1)).await;
    }
    stop.cancel();
}

/// What kubelet's atomic writer does to a mounted ConfigMap: a new timestamped directory, a
/// `..data_tmp` link to it renamed over `..data`, the old directory removed. The job file is a
/// link `jobs.toml → ..data/jobs.toml` that never changes itself.
fn configmap_swap(mount: &Path, version: usize, old: Option<&Path>) -> PathBuf {
    let stamped = mount.join(format!("..2026_12_02_12_00_0{version}.000000001"));
    std::fs::create_dir(&stamped).unwrap();
    std::fs::write(stamped.join("jobs.toml"), job_file(&format!("v{version}"))).unwrap();
    let tmp = mount.join("..data_tmp");
    std::os::unix::fs::symlink(stamped.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, mount.join("..data")).unwrap();
    if let Some(old) = old {
        std::fs::remove_dir_all(old).unwrap();
    }
    stamped
}

#[tokio::test]
async fn a_configmap_data_link_swap_reloads_every_time() {
    let mount = tempfile::tempdir().unwrap();
    let mut current = configmap_swap(mount.path(), 0, None);
    let file = mount.path().join("jobs.toml");
    std::os::unix::fs::symlink("..data/jobs.toml", &file).unwrap();
    assert!(std::fs::read_to_string(&file).unwrap().contains("v0"));
    let (mut rx, stop) = watch(std::slice::from_ref(&file), Duration::from_millis(300));
    for version in 1..=3 {
        current = configmap_swap(mount.path(), version, Some(&current));
        reloads(&mut rx, &format!("swap {version}")).await;
        assert!(
            std::fs::read_to_string(&file)
                .unwrap()
                .contains(&format!("v{version}"))
        );
        settle(&mut rx, Duration::from_secs(1)).await;
    }
    stop.cancel();
}

#[tokio::test]
async fn a_removed_directory_is_logged_and_the_watcher_keeps_running_until_stopped() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("jobs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("jobs.toml"), job_file("a")).unwrap();
    let (tx, mut rx) = mpsc::channel(4);
    let stop = CancellationToken::new();
    let debounce = Debounce {
        quiet: Duration::from_millis(300),
        max_delay: Duration::from_secs(30),
    };
    let task = spawn(&[dir.join("jobs.toml")], tx, debounce, stop.clone());
    std::fs::remove_dir_all(&dir).unwrap();
    // The reload that follows fails and keeps the old jobs (service); here: it is asked for.
    reloads(&mut rx, "the directory's removal").await;
    assert!(!task.is_finished(), "the watcher goes on");
    // A directory that does not exist at all is logged, not fatal.
    let (tx, _rx) = mpsc::channel(4);
    let missing = spawn(
        &[parent.path().join("nowhere/jobs.toml")],
        tx,
        debounce,
        stop.clone(),
    );
    stop.cancel();
    tokio::time::timeout(ARRIVES, task).await.unwrap().unwrap();
    tokio::time::timeout(ARRIVES, missing)
        .await
        .unwrap()
        .unwrap();
}

fn event(kind: EventKind) -> notify::Result<notify::Event> {
    Ok(notify::Event::new(kind).add_path(PathBuf::from("/etc/chime/jobs/jobs.toml")))
}

/// The debounce alone, fed events on paused time.
fn debouncer(
    debounce: Debounce,
) -> (
    mpsc::UnboundedSender<notify::Result<notify::Event>>,
    mpsc::Receiver<()>,
    CancellationToken,
) {
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (tx, rx) = mpsc::channel(4);
    let stop = CancellationToken::new();
    tokio::spawn(debounce_loop(
        events_rx,
        vec![PathBuf::from("/etc/chime/jobs")],
        tx,
        debounce,
        stop.clone(),
    ));
    (events_tx, rx, stop)
}

#[tokio::test(start_paused = true)]
async fn a_reload_comes_quiet_after_the_last_change_and_never_later_than_max_delay() {
    let debounce = Debounce {
        quiet: Duration::from_millis(500),
        max_delay: Duration::from_secs(2),
    };
    let (events, mut rx, stop) = debouncer(debounce);
    let start = tokio::time::Instant::now();
    // Three changes 200 ms apart: one reload, 500 ms after the last.
    for _ in 0..3 {
        events
            .send(event(EventKind::Modify(ModifyKind::Any)))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    rx.recv().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(400 + 500));
    assert!(rx.try_recv().is_err());

    // Opens and reads are not changes.
    for kind in [AccessKind::Any, AccessKind::Read] {
        events.send(event(EventKind::Access(kind))).unwrap();
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .is_err()
    );

    // Changes every 100 ms for 5 s: a reload every max_delay, not one at the end only.
    let start = tokio::time::Instant::now();
    let feeder = tokio::spawn(async move {
        for _ in 0..50 {
            events
                .send(event(EventKind::Create(CreateKind::File)))
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        events
    });
    rx.recv().await.unwrap();
    assert_eq!(start.elapsed(), debounce.max_delay);
    rx.recv().await.unwrap();
    // The change at 2 s may come just before or just after that reload: the next burst starts
    // at 2 s or at 2.1 s.
    let second = start.elapsed();
    assert!(
        (debounce.max_delay * 2..=debounce.max_delay * 2 + Duration::from_millis(100))
            .contains(&second),
        "{second:?}"
    );
    let _events = feeder.await.unwrap();
    rx.recv().await.unwrap();
    assert!(start.elapsed() <= Duration::from_millis(5_000 + 500));
    stop.cancel();
}
