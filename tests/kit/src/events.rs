//! Capturing what a worker or its handlers did: one ordered list of events that handlers (or a
//! log subscriber) record into and tests read or wait on.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::wait::wait_for;

/// Events in the order they were recorded. Clones share the list: hand one to each handler (or
/// to [`capture_logs`]) and keep one to look at.
///
/// Each handle also has a read position, for tests that wait for what happens *next*:
/// [`Events::take_new`] and the `wait_for_*` methods consume the events after it, while
/// [`Events::all`] always sees everything.
pub struct Events<T> {
    shared: Arc<Mutex<Vec<T>>>,
    read: usize,
}

impl<T> Clone for Events<T> {
    fn clone(&self) -> Self {
        Events {
            shared: self.shared.clone(),
            read: self.read,
        }
    }
}

impl<T> Default for Events<T> {
    fn default() -> Self {
        Events {
            shared: Arc::default(),
            read: 0,
        }
    }
}

impl<T> fmt::Debug for Events<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("len", &self.len())
            .field("read", &self.read)
            .finish()
    }
}

impl<T> Events<T> {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    fn list(&self) -> MutexGuard<'_, Vec<T>> {
        // A handler that panicked while recording must not hide every later event.
        self.shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends `event`; returns its index, for [`Events::update`].
    pub fn record(&self, event: T) -> usize {
        let mut list = self.list();
        list.push(event);
        list.len() - 1
    }

    /// Changes the event at `index` (a handler recording when it ended, say).
    pub fn update(&self, index: usize, change: impl FnOnce(&mut T)) {
        change(&mut self.list()[index]);
    }

    /// How many events so far.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads every event so far without copying them.
    pub fn with<R>(&self, read: impl FnOnce(&[T]) -> R) -> R {
        read(&self.list())
    }
}

impl<T: Clone> Events<T> {
    /// Every event so far.
    pub fn all(&self) -> Vec<T> {
        self.list().clone()
    }

    /// The event at this handle's read position, if there is one yet; the position moves
    /// past it.
    pub fn take_next(&mut self) -> Option<T> {
        let next = self.list().get(self.read).cloned();
        self.read += usize::from(next.is_some());
        next
    }

    /// The events after this handle's read position, which moves past them.
    pub fn take_new(&mut self) -> Vec<T> {
        let list = self.list();
        let new = list[self.read.min(list.len())..].to_vec();
        drop(list);
        self.read += new.len();
        new
    }
}

impl<T: Clone + fmt::Debug> Events<T> {
    /// Waits until every predicate in `wanted` has matched some new event (in any order);
    /// fails the test after `timeout`, showing which matched and the events seen. The read
    /// position stops right after the event that completed the match.
    pub async fn wait_for_all(
        &mut self,
        timeout: Duration,
        what: &str,
        wanted: &[&dyn Fn(&T) -> bool],
    ) {
        let mut matched = vec![false; wanted.len()];
        let mut seen = Vec::new();
        wait_for(timeout, what, || {
            let mut done = matched.iter().all(|hit| *hit);
            while !done && let Some(event) = self.take_next() {
                for (want, hit) in wanted.iter().zip(matched.iter_mut()) {
                    *hit |= want(&event);
                }
                seen.push(event);
                done = matched.iter().all(|hit| *hit);
            }
            std::future::ready(if done {
                Ok(())
            } else {
                Err(format!(
                    "matched {matched:?} of what was wanted in {seen:#?}"
                ))
            })
        })
        .await
    }

    /// Waits until a new event matches `wanted`.
    pub async fn wait_for_one(
        &mut self,
        timeout: Duration,
        what: &str,
        wanted: impl Fn(&T) -> bool,
    ) {
        self.wait_for_all(timeout, what, &[&wanted]).await
    }

    /// Waits until `n` new events have matched `wanted`; the read position stops right after
    /// the `n`th.
    pub async fn wait_for_count(
        &mut self,
        timeout: Duration,
        what: &str,
        wanted: impl Fn(&T) -> bool,
        n: usize,
    ) {
        let mut count = 0;
        wait_for(timeout, what, || {
            while count < n
                && let Some(event) = self.take_next()
            {
                count += usize::from(wanted(&event));
            }
            std::future::ready(if count >= n {
                Ok(())
            } else {
                Err(format!("{count} of {n}"))
            })
        })
        .await
    }
}

impl Events<String> {
    /// Waits until a new event is exactly `message` (a captured log message).
    pub async fn wait_for_message(&mut self, timeout: Duration, message: &str) {
        self.wait_for_one(timeout, &format!("the message {message:?}"), |m| {
            m == message
        })
        .await
    }
}

/// Keeps a log capture ([`capture_logs`]) on; capturing stops when it is dropped.
#[must_use = "capturing stops when the guard is dropped"]
pub struct LogGuard(#[allow(dead_code)] tracing::subscriber::DefaultGuard);

impl fmt::Debug for LogGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogGuard")
    }
}

/// Captures the message of every `tracing` event on this thread whose target starts with
/// `target` (`""` for all): what a worker says it did, for tests that wait on it.
///
/// `#[sqlx::test]` and `#[tokio::test]` run on a current-thread runtime, so a thread-local
/// subscriber sees every event of an in-process worker's tasks. Keep the guard alive for as
/// long as events should be captured.
pub fn capture_logs(target: &str) -> (LogGuard, Events<String>) {
    use tracing_subscriber::layer::SubscriberExt as _;

    struct Capture {
        target: String,
        events: Events<String>,
    }
    struct Message(String);
    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if event.metadata().target().starts_with(&self.target) {
                let mut message = Message(String::new());
                event.record(&mut message);
                self.events.record(message.0);
            }
        }
    }
    let events = Events::new();
    let subscriber = tracing_subscriber::registry().with(Capture {
        target: target.to_owned(),
        events: events.clone(),
    });
    (
        LogGuard(tracing::subscriber::set_default(subscriber)),
        events,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_new_moves_past_what_it_returns_and_all_sees_everything() {
        let mut events = Events::new();
        let recorder = events.clone();
        recorder.record(1);
        recorder.record(2);
        assert_eq!(events.take_new(), [1, 2]);
        recorder.record(3);
        assert_eq!(events.take_new(), [3]);
        assert_eq!(events.take_new(), Vec::<i32>::new());
        assert_eq!(events.all(), [1, 2, 3]);
    }

    #[tokio::test]
    async fn captures_the_messages_of_this_threads_events_under_a_target() {
        let (_capturing, mut events) = capture_logs(module_path!());
        tracing::info!("first");
        tracing::warn!(target: "elsewhere", "not this one");
        tracing::info!(n = 2, "second");
        events
            .wait_for_all(
                Duration::from_secs(1),
                "both",
                &[&|m: &String| m == "first", &|m| m == "second"],
            )
            .await;
        assert_eq!(events.all(), ["first", "second"]);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for two hellos; last seen: \"1 of 2\"")]
    async fn a_count_that_is_not_reached_names_how_far_it_got() {
        let mut events = Events::new();
        events.record("hello".to_owned());
        events
            .wait_for_count(Duration::ZERO, "two hellos", |m| m == "hello", 2)
            .await;
    }
}
