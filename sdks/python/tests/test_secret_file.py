"""Secrets from files: CHIME_DATABASE_URL_FILE and CHIME_AMQP_URL_FILE, as the Rust SDK reads them."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from chime_worker import Client, ConfigError, Context, Worker
from chime_worker.secret_file import MAX_SECRET_FILE_BYTES, SecretFileError, read

from conftest import AMQP_URL, Env

VARIABLES = ("CHIME_DATABASE_URL", "CHIME_DATABASE_URL_FILE", "CHIME_AMQP_URL",
             "CHIME_AMQP_URL_FILE")
#: A value with a password, which no message may show.
SECRET = "postgres://app:s3cr3t-pw@db.internal:5432/chime"


@pytest.fixture(autouse=True)
def _no_urls_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it means; none leak in from the shell running pytest."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _file(tmp_path: Path, content: bytes | str, name: str = "secret") -> str:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


def _refusal(monkeypatch: pytest.MonkeyPatch, variable: str, path: str) -> str:
    """The ConfigError message of a worker whose `variable` names `path`."""
    monkeypatch.setenv(variable, path)
    with pytest.raises(ConfigError) as e:
        Worker("g")
    message = str(e.value)
    assert SECRET not in message and "s3cr3t-pw" not in message
    return message


def test_the_bound_is_the_documented_64_kib() -> None:
    assert MAX_SECRET_FILE_BYTES == 65536


@pytest.mark.parametrize("content,value", [
    (SECRET, SECRET),
    (SECRET + "\n", SECRET),
    (SECRET + "\r\n", SECRET),
    # One line break, not every one: the rest is the value's.
    ("a \n\n", "a \n"),
    ("a\r\n\r\n", "a\r\n"),
    # A line break inside stays as written (a text-mode read would turn it into "\n").
    ("first\r\nsecond\r\n", "first\r\nsecond"),
    ("  padded  \n", "  padded  "),
])
def test_a_value_loses_one_final_line_break_and_nothing_else(
        tmp_path: Path, content: str, value: str) -> None:
    assert read(_file(tmp_path, content)) == value


def test_the_worker_reads_both_urls_from_their_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIME_DATABASE_URL_FILE", _file(tmp_path, SECRET + "\n", "db"))
    monkeypatch.setenv("CHIME_AMQP_URL_FILE",
                       _file(tmp_path, "amqp://u:p@mq.internal:5672/%2f\r\n", "mq"))
    w = Worker("g")
    assert (w.database_url, w.amqp_url) == (SECRET, "amqp://u:p@mq.internal:5672/%2f")


def test_an_empty_variable_counts_as_unset_beside_its_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIME_DATABASE_URL", "")
    monkeypatch.setenv("CHIME_DATABASE_URL_FILE", _file(tmp_path, SECRET))
    assert Worker("g").database_url == SECRET


@pytest.mark.parametrize("content", ["", "\n", "\r\n", " \t \n", "\n\n"])
def test_an_empty_or_blank_file_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str) -> None:
    path = _file(tmp_path, content)
    assert _refusal(monkeypatch, "CHIME_AMQP_URL_FILE", path) == (
        f'environment variable CHIME_AMQP_URL_FILE = "{path}": the file is empty; write the '
        "value into it")


def test_a_file_over_64_kib_is_refused_and_one_of_64_kib_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at_limit = _file(tmp_path, "x" * MAX_SECRET_FILE_BYTES, "at-limit")
    assert read(at_limit) == "x" * MAX_SECRET_FILE_BYTES
    over = _file(tmp_path, SECRET + "x" * (MAX_SECRET_FILE_BYTES + 1 - len(SECRET)), "over")
    assert _refusal(monkeypatch, "CHIME_DATABASE_URL_FILE", over) == (
        f'environment variable CHIME_DATABASE_URL_FILE = "{over}": the file has 65537 bytes, '
        "more than 65536; a secret file holds one value")


def test_a_missing_file_is_refused_naming_the_variable_the_path_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "no-such-secret")
    assert _refusal(monkeypatch, "CHIME_DATABASE_URL_FILE", path) == (
        f'environment variable CHIME_DATABASE_URL_FILE = "{path}": cannot read the file (No '
        "such file or directory (os error 2)); give the path of a readable file holding the "
        "value")


def test_a_directory_an_unreadable_file_and_binary_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _refusal(monkeypatch, "CHIME_AMQP_URL_FILE", str(tmp_path))
    assert message.startswith(f'environment variable CHIME_AMQP_URL_FILE = "{tmp_path}": '
                              "cannot read the file (Is a directory")
    binary = _file(tmp_path, b"\xff\xfe" + SECRET.encode(), "binary")
    assert _refusal(monkeypatch, "CHIME_AMQP_URL_FILE", binary).endswith(
        "cannot read the file (stream did not contain valid UTF-8); give the path of a "
        "readable file holding the value")
    locked = _file(tmp_path, SECRET, "locked")
    os.chmod(locked, 0)
    if os.geteuid() != 0:  # root reads any file: the check would not be the one under test
        assert "cannot read the file (Permission denied (os error 13))" in _refusal(
            monkeypatch, "CHIME_AMQP_URL_FILE", locked)


def test_setting_a_variable_and_its_file_is_refused_naming_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIME_AMQP_URL", "amqp://u:s3cr3t-pw@mq.internal/%2f")
    assert _refusal(monkeypatch, "CHIME_AMQP_URL_FILE", _file(tmp_path, SECRET)) == (
        "environment variables CHIME_AMQP_URL and CHIME_AMQP_URL_FILE are both set: give the "
        "value one way, the variable or the file")


def test_a_url_given_in_code_wins_and_its_file_is_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIME_DATABASE_URL_FILE", str(tmp_path / "missing"))
    monkeypatch.setenv("CHIME_AMQP_URL_FILE", str(tmp_path / "missing"))
    w = Worker("g", database_url="postgres://code/chime", amqp_url="amqp://code/%2f")
    assert (w.database_url, w.amqp_url) == ("postgres://code/chime", "amqp://code/%2f")
    with pytest.raises(ConfigError, match="CHIME_DATABASE_URL_FILE"):
        Worker("g", amqp_url="amqp://code/%2f")  # the database URL still comes from its file


def test_the_client_reads_its_database_url_from_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIME_DATABASE_URL_FILE", _file(tmp_path, SECRET + "\n"))
    assert Client().database_url == SECRET
    monkeypatch.setenv("CHIME_DATABASE_URL", SECRET)
    with pytest.raises(ConfigError, match="CHIME_DATABASE_URL and CHIME_DATABASE_URL_FILE"):
        Client()


def test_the_reader_error_is_a_value_error_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="^the file is empty; write the value into it$"):
        read(_file(tmp_path, "\n"))


async def test_a_worker_connects_with_both_urls_from_files(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Files as `echo` and an editor on Windows leave them. The broker URL gets a harmless
    # query so that it differs from the default one: a worker ignoring the file would show.
    amqp_url = AMQP_URL + ("&" if "?" in AMQP_URL else "?") + "heartbeat=30"
    monkeypatch.setenv("CHIME_DATABASE_URL_FILE", _file(tmp_path, env.db_url + "\n", "db"))
    monkeypatch.setenv("CHIME_AMQP_URL_FILE", _file(tmp_path, amqp_url + "\r\n", "mq"))
    await env.insert_job("from-files")
    w = Worker(env.group, prefix=env.prefix, worker_id=f"py-{secrets.token_hex(3)}",
               heartbeat_interval=0.2)
    assert (w.database_url, w.amqp_url) == (env.db_url, amqp_url)
    seen: list[Any] = []

    @w.handler("from-files")
    async def handle(ctx: Context, params: Any) -> None:
        seen.append(params)

    # Registered in this test's own database (not the default one) and consuming this test's
    # queue: both connections are up.
    await env.start_worker(w)
    run_id = await env.trigger("from-files", {"n": 1})
    run = await env.wait_run(run_id, "succeeded")
    assert run["worker_id"] == w.worker_id and seen == [{"n": 1}]
