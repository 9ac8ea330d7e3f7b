//! A task's output as run log lines: split into lines, each line and the whole output capped,
//! the last lines kept for the outcome message, secrets redacted.
//!
//! Output is read as fast as it comes whatever the caps (beyond them it is counted and dropped),
//! so a chatty child never blocks on a full pipe. Every cap ends in one line saying what was
//! cut, so a reader of the run's log knows the output is not whole.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use chime_worker::{JobLogger, Level};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest output line logged, in bytes; the rest of a longer line is dropped and the line ends
/// with a marker saying how much.
pub const MAX_LINE_BYTES: usize = 4 * 1024;
/// Most output lines logged per attempt (the SDK stores at most 10,000 lines per attempt; this
/// leaves room for the runner's own lines, such as the one saying what was dropped).
pub const MAX_OUTPUT_LINES: usize = 9_000;
/// Lines of output kept for the outcome message.
pub const TAIL_LINES: usize = 20;
/// Most bytes of output in the outcome message.
pub const TAIL_BYTES: usize = 4 * 1024;

/// Replaces secret values (HTTP header values) with `[redacted]` in every line and message.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

/// Shortest value [`Redactor`] replaces: shorter ones cannot be secrets worth the name, and
/// replacing them would shred ordinary text.
pub const MIN_REDACTED_BYTES: usize = 4;

impl Redactor {
    /// Adds a secret (ignored when shorter than [`MIN_REDACTED_BYTES`]).
    pub fn add(&mut self, secret: impl Into<String>) {
        let secret = secret.into();
        if secret.len() >= MIN_REDACTED_BYTES && !self.secrets.contains(&secret) {
            self.secrets.push(secret);
            // Longest first, so a secret containing another is replaced whole.
            self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// `text` with every secret replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), "[redacted]");
            }
        }
        text
    }
}

/// One attempt's output: where its lines go and what has been cut.
#[derive(Debug)]
pub struct Output {
    logger: JobLogger,
    max_bytes: u64,
    redactor: Redactor,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    logged_bytes: u64,
    logged_lines: usize,
    dropped_bytes: u64,
    dropped_lines: u64,
    tail: VecDeque<String>,
    tail_bytes: usize,
}

impl Output {
    /// Output logged through `logger`, at most `max_bytes` bytes of it.
    pub fn new(logger: JobLogger, max_bytes: u64, redactor: Redactor) -> Output {
        Output {
            logger,
            max_bytes,
            redactor,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs one line at `level`: `bytes` (at most [`MAX_LINE_BYTES`], without its newline),
    /// of which `cut` further bytes were dropped. Beyond the output caps it is only counted.
    pub fn line(&self, level: Level, bytes: &[u8], cut: u64) {
        let mut text =
            String::from_utf8_lossy(bytes.strip_suffix(b"\r").unwrap_or(bytes)).into_owned();
        if cut > 0 {
            text.push_str(&format!(" …[line cut: {cut} more bytes]"));
        }
        let text = self.redactor.redact(&text);
        let size = bytes.len() as u64 + cut;
        let mut state = self.state();
        state.tail_bytes += text.len();
        state.tail.push_back(text.clone());
        while state.tail.len() > TAIL_LINES
            || (state.tail_bytes > TAIL_BYTES && state.tail.len() > 1)
        {
            let gone = state.tail.pop_front().map_or(0, |l| l.len());
            state.tail_bytes -= gone;
        }
        if state.dropped_lines > 0
            || state.logged_lines >= MAX_OUTPUT_LINES
            || state.logged_bytes + size > self.max_bytes
        {
            state.dropped_bytes += size;
            state.dropped_lines += 1;
            return;
        }
        state.logged_bytes += size;
        state.logged_lines += 1;
        drop(state);
        self.logger.log(level, text);
    }

    /// Logs a message of the runner's own (not output: no caps, but redacted).
    pub fn note(&self, level: Level, message: &str) {
        self.logger.log(level, self.redactor.redact(message));
    }

    /// Logs the line saying how much output was dropped, if any was.
    pub fn finish(&self) {
        let state = self.state();
        if state.dropped_lines > 0 {
            let message = format!(
                "… {} more lines ({} bytes) of output dropped: the log keeps at most {} and \
                 {MAX_OUTPUT_LINES} lines per attempt (max_output)",
                state.dropped_lines,
                state.dropped_bytes,
                human_bytes(self.max_bytes),
            );
            drop(state);
            self.logger.warn(message);
        }
    }

    /// The last lines of output (at most [`TAIL_LINES`] lines, about [`TAIL_BYTES`] bytes),
    /// one per line; empty when there was none.
    pub fn tail(&self) -> String {
        let state = self.state();
        let mut tail = state.tail.iter().cloned().collect::<Vec<_>>().join("\n");
        if tail.len() > TAIL_BYTES {
            let mut start = tail.len() - TAIL_BYTES;
            while !tail.is_char_boundary(start) {
                start += 1;
            }
            tail = format!("…{}", &tail[start..]);
        }
        tail
    }

    /// `message`, followed by the output's last lines when there are any.
    pub fn with_tail(&self, message: &str) -> String {
        let tail = self.tail();
        let message = self.redactor.redact(message);
        if tail.is_empty() {
            message
        } else {
            format!("{message}; last output:\n{tail}")
        }
    }

    /// The redactor of this output.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }
}

/// Reads `reader` to its end (or first error), logging each line at `level` through `output`.
/// Reads at full speed whatever the caps.
pub async fn pump<R: AsyncRead + Unpin>(mut reader: R, level: Level, output: &Output) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut line: Vec<u8> = Vec::with_capacity(256);
    let mut cut: u64 = 0;
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            let (piece, ended) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (&chunk[..i], Some(i + 1)),
                None => (chunk, None),
            };
            let room = MAX_LINE_BYTES - line.len();
            if piece.len() <= room {
                line.extend_from_slice(piece);
            } else {
                line.extend_from_slice(&piece[..room]);
                cut += (piece.len() - room) as u64;
            }
            match ended {
                Some(next) => {
                    output.line(level, &line, cut);
                    line.clear();
                    cut = 0;
                    chunk = &chunk[next..];
                }
                None => chunk = &[],
            }
        }
    }
    if !line.is_empty() || cut > 0 {
        output.line(level, &line, cut);
    }
}

/// `bytes` as people write sizes: `1 MiB`, `64 KiB`, `100 B`.
pub fn human_bytes(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;
    match bytes {
        b if b >= GIB && b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= KIB && b % KIB == 0 => format!("{} KiB", b / KIB),
        b => format!("{b} B"),
    }
}

/// Parses a size: a whole number of bytes, or a number with `B`, `KiB`, `MiB` or `GiB` (also
/// `KB`, `MB`, `GB` and lower case, read as powers of 1024).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let factor: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return None,
    };
    number.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        for (text, bytes) in [
            ("100", 100),
            ("64KiB", 65536),
            ("64 KiB", 65536),
            ("1MiB", 1 << 20),
            ("2 mb", 2 << 20),
            ("1GiB", 1 << 30),
        ] {
            assert_eq!(parse_bytes(text), Some(bytes), "{text}");
        }
        for bad in ["", "KiB", "1.5MiB", "1 TiB", "-1", "99999999999999999999"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(65536), "64 KiB");
        assert_eq!(human_bytes(1000), "1000 B");
    }

    #[test]
    fn redaction_replaces_every_secret_longest_first() {
        let mut r = Redactor::default();
        r.add("abc");
        r.add("s3cr3t");
        r.add("Bearer s3cr3t");
        assert_eq!(
            r.redact("auth: Bearer s3cr3t, again s3cr3t, abc"),
            "auth: [redacted], again [redacted], abc"
        );
    }
}
