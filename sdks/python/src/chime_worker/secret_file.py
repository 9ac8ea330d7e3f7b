"""Secrets from files: `CHIME_<KEY>_FILE` names a file holding the value of `CHIME_<KEY>`.

A Kubernetes or Docker secret mounted as a file, so that a URL with a password need not sit in
the environment. The same rules as the Rust SDK (`chime_protocol::secret_file`, and
docs/configuration.md, "From files"): the file's text without one final line break, at most
`MAX_SECRET_FILE_BYTES`, not blank; setting both the variable and its `_FILE` is an error. The
value itself is never put in a message.
"""

from __future__ import annotations

import json
import os

from .errors import ConfigError

#: Largest file a `CHIME_<KEY>_FILE` variable may name, in bytes: 64 KiB, the Rust
#: `limits::MAX_SECRET_FILE_BYTES` (a secret file holds one value, a URL).
MAX_SECRET_FILE_BYTES = 64 * 1024
#: What ends a variable that names a file holding another variable's value.
FILE_SUFFIX = "_FILE"


class SecretFileError(ValueError):
    """Why a secret file gave no value; the message ends with the fix."""


def read(path: str) -> str:
    """The value in the file at `path`: its text without one final line break (`\\n` or
    `\\r\\n`, as editors and `echo` leave it); raises SecretFileError when it gives none."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_SECRET_FILE_BYTES:
                raise SecretFileError(_too_large(size))
            # At most one byte over the limit, whatever the size said (a file still growing,
            # a FIFO): the limit holds for what is read, too.
            data = f.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as e:
        reason = f"{e.strerror} (os error {e.errno})" if e.strerror else str(e)
        raise SecretFileError(f"cannot read the file ({reason}); give the path of a readable "
                              "file holding the value") from None
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise SecretFileError(_too_large(len(data)))
    try:
        # Bytes, decoded here: a text-mode read would turn a `\r\n` inside the value into `\n`.
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError("cannot read the file (stream did not contain valid UTF-8); "
                              "give the path of a readable file holding the value") from None
    # As the Rust reader: a final `\n`, then a `\r` before it.
    value = text.removesuffix("\n").removesuffix("\r")
    if not value.strip():
        raise SecretFileError("the file is empty; write the value into it")
    return value


def _too_large(size: int) -> str:
    return (f"the file has {size} bytes, more than {MAX_SECRET_FILE_BYTES}; a secret file "
            "holds one value")


def value_or_file(name: str) -> str | None:
    """Environment variable `name`'s value, or the value in the file `name_FILE` names; None
    when neither is set (an empty variable counts as unset). Raises ConfigError naming the
    variable, the file and the fix when that file gives no value, or when both are set."""
    variable = name + FILE_SUFFIX
    value = os.environ.get(name) or None
    path = os.environ.get(variable) or None
    if path is None:
        return value
    if value is not None:
        raise ConfigError(f"environment variables {name} and {variable} are both set: give the "
                          "value one way, the variable or the file")
    try:
        return read(path)
    except SecretFileError as e:
        shown = json.dumps(path, ensure_ascii=False)
        raise ConfigError(f"environment variable {variable} = {shown}: {e}") from None
