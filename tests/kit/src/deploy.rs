//! The deployment files under `deploy/` as tests read them: a systemd unit's `Key=value` lines by
//! section, and an environment file's `NAME=value` lines, so that the tests beside each binary
//! can check that what an operator installs names commands, flags and settings that exist.

use std::path::{Path, PathBuf};

/// The path of `relative` under the repository's `deploy/` directory.
pub fn deploy_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(relative)
}

/// A systemd unit file: its `Key=value` lines in order, with their `[Section]`.
#[derive(Debug, Clone)]
pub struct Unit {
    path: PathBuf,
    entries: Vec<(String, String, String)>,
}

impl Unit {
    /// Reads `deploy/<relative>`; panics naming the file when it is missing or a line is neither
    /// a comment, a section header nor `Key=value`.
    pub fn read(relative: &str) -> Unit {
        let path = deploy_path(relative);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut section = String::new();
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("{}:{}: not Key=value: {line:?}", path.display(), n + 1));
            entries.push((
                section.clone(),
                key.trim().to_owned(),
                value.trim().to_owned(),
            ));
        }
        Unit { path, entries }
    }

    /// Every value of `key` in `[section]`, in order.
    pub fn values(&self, section: &str, key: &str) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }

    /// The one value of `key` in `[section]`; panics naming the file when there is none or more.
    pub fn value(&self, section: &str, key: &str) -> &str {
        match self.values(section, key).as_slice() {
            [one] => one,
            other => panic!(
                "{}: [{section}] {key} is set {} times, expected once",
                self.path.display(),
                other.len()
            ),
        }
    }

    /// The one value of `key` in `[section]` split into arguments at whitespace (the units here
    /// quote nothing).
    pub fn argv(&self, section: &str, key: &str) -> Vec<String> {
        self.value(section, key)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }
}

/// `deploy/<relative>` as an environment file (systemd's `EnvironmentFile=`): its `NAME=value`
/// lines in order (a value's surrounding quotes removed), comments and blank lines skipped;
/// panics naming the file on any other line.
pub fn env_file(relative: &str) -> Vec<(String, String)> {
    let path = deploy_path(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(n, line)| (n, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(n, line)| {
            let (name, value) = line.split_once('=').unwrap_or_else(|| {
                panic!("{}:{}: not NAME=value: {line:?}", path.display(), n + 1)
            });
            (name.to_owned(), unquote(value).to_owned())
        })
        .collect()
}

/// A value without the single or double quotes around it, as systemd and a shell read it.
fn unquote(value: &str) -> &str {
    for quote in ['\'', '"'] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}
