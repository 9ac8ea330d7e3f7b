//! [`redact_url`]: a connection URL with its secrets hidden, for every error, log line and
//! `Debug` output that shows a database or broker URL (the scheduler's and the SDK's alike).
//!
//! It works on the text, never on a parsed URL, because the URLs it must hide secrets of are
//! often the ones that do not parse (a bad port, a password with an unescaped `@` or `/`, no
//! scheme). When unsure where the password ends it hides more, never less: everything between
//! the user name's `:` and the **last** `@` is the password. Query parameters whose name holds
//! `password`, `secret` or `token` (`password=`, `sslpassword=`) are hidden too.

/// What a hidden secret is shown as.
pub const HIDDEN: &str = "***";

/// `url` with its password and secret query parameters replaced by `***`:
/// `postgres://chime:s3cret@db/chime?sslpassword=k` → `postgres://chime:***@db/chime?sslpassword=***`.
/// A URL without a scheme (`chime:s3cret@db/chime`) is treated the same way; text without
/// credentials comes back unchanged.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    // The userinfo ends at the last `@`: a password may hold `@`, `/`, `?` or `:` unescaped.
    let after_userinfo = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push(':');
                    out.push_str(HIDDEN);
                }
                None => out.push_str(userinfo),
            }
            out.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    out.push_str(&redact_query(after_userinfo));
    out
}

/// The host, path and query with secret query parameters hidden.
fn redact_query(text: &str) -> String {
    let Some((before, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if is_secret_key(key) => format!("{key}={HIDDEN}"),
            _ => param.to_owned(),
        })
        .collect();
    let mut out = format!("{before}?{}", params.join("&"));
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|word| key.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_and_keeps_the_rest() {
        let table = [
            (
                "postgres://postgres@127.0.0.1:5432/chime",
                "postgres://postgres@127.0.0.1:5432/chime",
            ),
            (
                "amqp://guest:guest@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            ("amqp://127.0.0.1", "amqp://127.0.0.1"),
            (
                "amqps://u:p@mq?heartbeat=10",
                "amqps://u:***@mq?heartbeat=10",
            ),
            ("postgres://db/a@b", "postgres://db/a@b"),
            ("not a url", "not a url"),
            (
                "postgres://u@db/chime?sslmode=verify-full&sslrootcert=/etc/ca.pem",
                "postgres://u@db/chime?sslmode=verify-full&sslrootcert=/etc/ca.pem",
            ),
        ];
        for (url, want) in table {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    /// The four forms that leaked before one function replaced three (issue 10).
    #[test]
    fn the_forms_that_leaked_show_no_secret() {
        let table = [
            // A bad port: the URL does not parse, its password must still go.
            (
                "postgres://u:secret@host:notaport/db",
                "postgres://u:***@host:notaport/db",
            ),
            // A password holding `@` (and other delimiters).
            ("postgres://u:se@cr/et@host/db", "postgres://u:***@host/db"),
            ("amqp://u:p@ss:secret@mq/%2f", "amqp://u:***@mq/%2f"),
            // Secrets in the query.
            (
                "postgres://u@host/db?password=secret&sslmode=require",
                "postgres://u@host/db?password=***&sslmode=require",
            ),
            (
                "postgres://host/db?sslmode=verify-full&sslpassword=secret#x",
                "postgres://host/db?sslmode=verify-full&sslpassword=***#x",
            ),
            (
                "postgres://host/db?PASSWORD=secret",
                "postgres://host/db?PASSWORD=***",
            ),
            // No scheme.
            ("u:secret@host/db", "u:***@host/db"),
        ];
        for (url, want) in table {
            let shown = redact_url(url);
            assert_eq!(shown, want, "{url}");
            assert!(!shown.contains("secret"), "{url} → {shown}");
            assert!(!shown.contains("se@cr"), "{url} → {shown}");
        }
    }
}
