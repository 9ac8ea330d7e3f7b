//! A setting's value read from a secret file: `CHIME_<KEY>_FILE` names a file holding the value
//! of `CHIME_<KEY>` (a Kubernetes or Docker secret mounted as a file), so a URL with a password
//! need not sit in the environment. The one way the scheduler's settings and the workers read
//! one (docs/configuration.md, "Secrets from files").

use std::path::Path;

use crate::limits::MAX_SECRET_FILE_BYTES;

/// What ends a variable that names a file holding another variable's value.
pub const FILE_SUFFIX: &str = "_FILE";

/// Why a secret file gave no value (each message ends with the fix).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretFileError {
    /// Missing, unreadable or not UTF-8.
    #[error("cannot read the file ({0}); give the path of a readable file holding the value")]
    Unreadable(String),
    /// Larger than [`MAX_SECRET_FILE_BYTES`].
    #[error(
        "the file has {0} bytes, more than {MAX_SECRET_FILE_BYTES}; a secret file holds one value"
    )]
    TooLarge(u64),
    /// Nothing but whitespace.
    #[error("the file is empty; write the value into it")]
    Empty,
}

/// The value in the file at `path`: its text without one final line break (`\n` or `\r\n`, as
/// editors and `echo` leave it).
pub fn read(path: &Path) -> Result<String, SecretFileError> {
    let size = std::fs::metadata(path)
        .map_err(|e| SecretFileError::Unreadable(e.to_string()))?
        .len();
    if size > MAX_SECRET_FILE_BYTES {
        return Err(SecretFileError::TooLarge(size));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| SecretFileError::Unreadable(e.to_string()))?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.trim().is_empty() {
        return Err(SecretFileError::Empty);
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_loses_one_final_line_break_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("chime-secret-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            (
                "lf",
                "amqp://u:p@h/%2f\n",
                Ok("amqp://u:p@h/%2f".to_owned()),
            ),
            (
                "crlf",
                "amqp://u:p@h/%2f\r\n",
                Ok("amqp://u:p@h/%2f".to_owned()),
            ),
            ("two", "a \n\n", Ok("a \n".to_owned())),
            ("blank", " \n", Err(SecretFileError::Empty)),
        ];
        for (name, text, expected) in cases {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            assert_eq!(read(&path), expected, "{name}");
        }
        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; 64 * 1024 + 1]).unwrap();
        assert_eq!(read(&big), Err(SecretFileError::TooLarge(64 * 1024 + 1)));
        assert!(matches!(
            read(&dir.join("none")),
            Err(SecretFileError::Unreadable(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
