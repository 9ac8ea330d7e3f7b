//! Who is asking and what they may do: roles, callers, API token secrets.
//!
//! Roles are ordered: `viewer` < `operator` < `admin`; a caller may do what its role or any lower
//! role may. Token secrets are 32 random bytes from the operating system, shown once as
//! `chime_` + 64 hex digits; only their SHA-256 hash is stored. A slow password hash would add
//! nothing here: with 256 bits of entropy nobody can guess a secret from its hash.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// What a caller may do. Ordered: each role may do everything the roles below it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads everything: jobs, runs, workers, queues, dead letters, leader, audit log.
    Viewer,
    /// Also triggers, pauses and resumes jobs, cancels runs, replays dead letters.
    Operator,
    /// Also creates, changes and deletes jobs and purges dead letters.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    /// As stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Parses a stored or typed role name.
    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity an operation is performed for; recorded in the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `token:NAME` for an API token, `cli:USER` for the command line.
    pub actor: String,
    /// What it may do.
    pub role: Role,
}

impl Caller {
    /// The caller behind an API token.
    pub fn token(name: &str, role: Role) -> Caller {
        Caller {
            actor: format!("token:{name}"),
            role,
        }
    }

    /// The local command line, as [`default_cli_actor`]. Whoever can reach the database
    /// directly can do anything the API allows, so the CLI acts as an admin; its actions are
    /// audited all the same.
    pub fn cli() -> Caller {
        Caller::cli_as(None)
    }

    /// The local command line for `name` (`--as NAME` or `CHIME_ACTOR`), audited as
    /// `cli:NAME`; without one, as [`default_cli_actor`].
    pub fn cli_as(name: Option<&str>) -> Caller {
        Caller {
            actor: match name {
                Some(name) => format!("cli:{name}"),
                None => default_cli_actor(),
            },
            role: Role::Admin,
        }
    }
}

/// Who the command line acts for when no `--as`/`CHIME_ACTOR` names it: `cli:$USER` (or
/// `$LOGNAME`), else, where neither is set (containers, cron), `cli:uid-UID@HOST` from the
/// process's user id and the host name.
pub fn default_cli_actor() -> String {
    let user = ["USER", "LOGNAME"]
        .into_iter()
        .filter_map(|var| std::env::var(var).ok())
        .find(|user| !user.trim().is_empty());
    if let Some(user) = user {
        return format!("cli:{user}");
    }
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self belongs to the process's effective user.
    let uid =
        std::fs::metadata("/proc/self").map_or_else(|_| "unknown".into(), |m| m.uid().to_string());
    format!("cli:uid-{uid}@{}", crate::config::host_name())
}

/// The prefix of every token secret, so a leaked one is recognisable (secret scanners, logs).
pub const TOKEN_PREFIX: &str = "chime_";

/// A new random token secret, as shown to its owner once.
pub fn new_secret() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("reading random bytes from the OS: {e}"))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex(&bytes)))
}

/// The stored form of a secret: its SHA-256 hash.
pub fn secret_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_round_trip() {
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn secrets_are_random_prefixed_and_hashed() {
        let a = new_secret().expect("secret");
        let b = new_secret().expect("secret");
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert_eq!(secret_hash(&a).len(), 32);
        assert_eq!(secret_hash(&a), secret_hash(&a));
        assert_ne!(secret_hash(&a), secret_hash(&b));
        // A known vector: SHA-256("abc").
        assert_eq!(
            hex(&secret_hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
