//! Several addresses of one RabbitMQ cluster (`amqp_urls`, `CHIME_AMQP_URLS`): how a list is
//! written and bounded, and the one rule both the scheduler and the workers connect by — the
//! first address that accepts, in order, starting after the one whose connection was lost.
//!
//! **Invariants.** A list has 1 to [`MAX_AMQP_URLS`] addresses. [`Addresses::connect`] tries
//! each address at most once per call and reports the last failure; it does no IO of its own
//! (the caller's `attempt` opens the connection, with its TLS options and timeout), so the rule
//! is the same whatever client opens the connection.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use crate::limits::MAX_AMQP_URLS;
use crate::redact::redact_url;

/// The addresses of a list separated by commas or line breaks (`CHIME_AMQP_URLS`, or the file
/// `CHIME_AMQP_URLS_FILE` names), trimmed, empty parts skipped. A URL with a literal comma must
/// be percent-encoded (`%2C`), as in any URL.
pub fn split_list(text: &str) -> Vec<String> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Why a list of addresses is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressesError {
    /// No address at all.
    #[error("the list of broker addresses is empty; give at least one amqp:// or amqps:// URL")]
    Empty,
    /// More than [`MAX_AMQP_URLS`].
    #[error(
        "{count} broker addresses; the limit is {MAX_AMQP_URLS} (list a few nodes of the \
         cluster, or one load balancer)"
    )]
    TooMany {
        /// How many were given.
        count: usize,
    },
}

/// Checks the length of a list of addresses (each URL is checked by its reader).
pub fn check_count(count: usize) -> Result<(), AddressesError> {
    match count {
        0 => Err(AddressesError::Empty),
        n if n > MAX_AMQP_URLS => Err(AddressesError::TooMany { count: n }),
        _ => Ok(()),
    }
}

/// A list of broker addresses and where the next connection attempt starts. Shared by the
/// tasks of one connection (`&self` is enough to connect); `Debug` hides passwords.
pub struct Addresses {
    urls: Vec<String>,
    /// Index of the address the next [`Addresses::connect`] tries first.
    next: AtomicUsize,
}

impl std::fmt::Debug for Addresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.urls.iter().map(|url| redact_url(url)))
            .finish()
    }
}

impl Clone for Addresses {
    fn clone(&self) -> Self {
        Addresses {
            urls: self.urls.clone(),
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed)),
        }
    }
}

impl From<String> for Addresses {
    fn from(url: String) -> Addresses {
        Addresses::one(url)
    }
}

impl From<&str> for Addresses {
    fn from(url: &str) -> Addresses {
        Addresses::one(url)
    }
}

impl From<&String> for Addresses {
    fn from(url: &String) -> Addresses {
        Addresses::one(url.as_str())
    }
}

impl PartialEq for Addresses {
    /// The same list (where the next attempt starts is not compared).
    fn eq(&self, other: &Addresses) -> bool {
        self.urls == other.urls
    }
}

impl Eq for Addresses {}

impl Addresses {
    /// The list `urls`, in the order they are tried; 1 to [`MAX_AMQP_URLS`] of them.
    pub fn new(urls: Vec<String>) -> Result<Addresses, AddressesError> {
        check_count(urls.len())?;
        Ok(Addresses {
            urls,
            next: AtomicUsize::new(0),
        })
    }

    /// One address.
    pub fn one(url: impl Into<String>) -> Addresses {
        Addresses {
            urls: vec![url.into()],
            next: AtomicUsize::new(0),
        }
    }

    /// The addresses, in order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The first address (the one whose user the management API is asked as).
    pub fn first(&self) -> &str {
        &self.urls[0]
    }

    /// The addresses, passwords hidden, comma-separated (for logs and errors).
    pub fn redacted(&self) -> String {
        self.urls
            .iter()
            .map(|url| redact_url(url))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Connects through `attempt` to the first address that accepts, trying each once in
    /// order, starting after the address of the last connection made (the first address on the
    /// first call) and wrapping around: a connection that was lost is followed by one to the
    /// next node. Returns the address connected to and the connection, or the last failure
    /// (every address failed).
    pub async fn connect<T, E, F, Fut>(&self, mut attempt: F) -> Result<(String, T), E>
    where
        F: FnMut(&str) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let len = self.urls.len();
        let start = self.next.load(Ordering::Relaxed) % len;
        let mut last = None;
        for offset in 0..len {
            let index = (start + offset) % len;
            let url = &self.urls[index];
            match attempt(url).await {
                Ok(connection) => {
                    self.next.store((index + 1) % len, Ordering::Relaxed);
                    return Ok((url.clone(), connection));
                }
                Err(error) => last = Some(error),
            }
        }
        Err(last.expect("a list of addresses is never empty"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: Future>(future: F) -> F::Output {
        // The attempts below are ready at once: polling once per attempt completes them.
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut context) {
                return out;
            }
        }
    }

    fn urls(n: usize) -> Vec<String> {
        (1..=n)
            .map(|i| format!("amqp://u:pw@n{i}:5672/%2f"))
            .collect()
    }

    #[test]
    fn lists_are_split_on_commas_and_bounded() {
        assert_eq!(
            split_list(" amqp://a:5672 , ,amqp://b:5672,\r\namqp://c:5672"),
            ["amqp://a:5672", "amqp://b:5672", "amqp://c:5672"]
        );
        assert_eq!(
            Addresses::new(Vec::new()).err(),
            Some(AddressesError::Empty)
        );
        assert!(Addresses::new(urls(MAX_AMQP_URLS)).is_ok());
        assert_eq!(
            Addresses::new(urls(MAX_AMQP_URLS + 1)).err(),
            Some(AddressesError::TooMany {
                count: MAX_AMQP_URLS + 1
            })
        );
    }

    #[test]
    fn the_first_reachable_address_wins_and_a_reconnect_starts_at_the_next() {
        let addresses = Addresses::new(urls(3)).unwrap();
        let mut tried = Vec::new();
        let down = ["amqp://u:pw@n1:5672/%2f"];
        let connected = run(addresses.connect(|url| {
            tried.push(url.to_owned());
            let up = !down.contains(&url);
            async move { if up { Ok(()) } else { Err("refused") } }
        }));
        assert_eq!(connected.unwrap().0, "amqp://u:pw@n2:5672/%2f");
        assert_eq!(tried, urls(2));

        // n2's connection is lost: the next attempt starts at n3, then wraps to n1.
        let mut tried = Vec::new();
        let result: Result<(String, ()), &str> = run(addresses.connect(|url| {
            tried.push(url.to_owned());
            async { Err("refused") }
        }));
        assert_eq!(result.unwrap_err(), "refused");
        let all = urls(3);
        assert_eq!(tried, [all[2].clone(), all[0].clone(), all[1].clone()]);
    }

    #[test]
    fn debug_and_redacted_hide_passwords() {
        let addresses = Addresses::new(urls(2)).unwrap();
        let shown = format!("{addresses:?} {}", addresses.redacted());
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("u:***@n2"), "{shown}");
    }
}
