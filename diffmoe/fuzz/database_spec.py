"""Which example database a `--database` names: a folder, or a Redis server (`redis://HOST:PORT/N`).

A folder is Hypothesis's DirectoryBasedExampleDatabase (the default: one machine, atomic
renames). `redis://HOST:PORT/N` is Hypothesis's RedisExampleDatabase on database N of that
server (issue 31): workers on several machines then share what each found. PORT defaults to
6379 and /N to 0 when left out, as Redis's own clients read such a URL.

A bad URL or a server that does not answer is a ValueError naming what is wrong, raised by
`check_database` before any example runs (the CLI's exit 2); the server is asked a PING, and
the database number is checked by the server itself (its `databases` setting bounds N).
Credentials in the URL are refused: the URL is printed in summaries and replay hints and
stands in the process list.

The spec stays a string until a worker opens it (`open_database`), so it crosses process
and machine boundaries as it is.

Owns parsing and opening a database spec. Must not run examples.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

REDIS_SCHEME = "redis://"
DEFAULT_REDIS_PORT = 6379
MAX_PORT = 65535
# A silent host (a firewall dropping packets) would otherwise hold the run for the OS's TCP
# timeout (over two minutes on Linux); a server on a reachable network answers in milliseconds.
CONNECT_TIMEOUT_SECONDS = 5.0
KEY_PREFIX = b"diffmoe-example:"  # apart from other Hypothesis users of the same server


@dataclass(frozen=True)
class RedisAddress:
    host: str
    port: int
    db: int

    def __str__(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.db}"


def is_redis_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.lower().startswith(REDIS_SCHEME)


def parse_redis_url(url: str) -> RedisAddress:
    """`redis://HOST[:PORT][/N]` -> RedisAddress; a ValueError naming the part that is wrong."""
    form = "expected redis://HOST:PORT/N"
    if not is_redis_url(url):
        raise ValueError(f"--database {url}: not a redis:// URL ({form})")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"--database {url}: the port must be an integer in [1, {MAX_PORT}] ({form})") from None
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"--database {url}: credentials in the URL are not accepted (they would be printed); {form}")
    if parts.query or parts.fragment:
        raise ValueError(f"--database {url}: no query or fragment is accepted ({form})")
    if not parts.hostname:
        raise ValueError(f"--database {url}: the host is missing ({form})")
    if port is not None and not 1 <= port <= MAX_PORT:
        raise ValueError(f"--database {url}: the port must be an integer in [1, {MAX_PORT}], got {port}")
    path = parts.path.strip("/")
    if path and not (path.isascii() and path.isdigit()):
        raise ValueError(f"--database {url}: the database number N must be an integer >= 0, got {path!r} ({form})")
    return RedisAddress(parts.hostname, DEFAULT_REDIS_PORT if port is None else port, int(path) if path else 0)


def _client(address: RedisAddress):
    try:
        import redis
    except ImportError:
        raise ValueError(f"--database {address}: the redis client is not installed "
                         "(pip install 'hypothesis[redis]', or diffmoe's 'cluster' extra)") from None
    return redis.Redis(host=address.host, port=address.port, db=address.db,
                       socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, socket_timeout=CONNECT_TIMEOUT_SECONDS)


def _ping(address: RedisAddress, client) -> None:
    import redis

    try:
        client.ping()
    except redis.ResponseError as exc:  # e.g. "DB index is out of range": the server's own bound on N
        raise ValueError(f"--database {address}: the server refused database {address.db}: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise ValueError(f"--database {address}: no Redis server answers there ({_one_line(exc)})") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def check_database(spec: str | os.PathLike, *, reach: bool = True) -> None:
    """Before any example runs: a folder must not be a file; a Redis URL must parse and (`reach`)
    its server answer. ValueError otherwise, in one line. reach=False asks nothing of the network,
    so the CLI checks the spec with the other arguments, before anything slow (issue 48)."""
    if is_redis_url(spec):
        address = parse_redis_url(str(spec))
        if not reach:
            return
        client = _client(address)
        try:
            _ping(address, client)
        finally:
            client.close()
    elif os.path.exists(spec) and not os.path.isdir(spec):
        raise ValueError(f"--database {os.fspath(spec)} exists and is not a folder")


def open_database(spec: str | os.PathLike) -> ExampleDatabase:
    """The ExampleDatabase a spec names (the module doc); a Redis server is checked as it opens."""
    if not is_redis_url(spec):
        return DirectoryBasedExampleDatabase(os.fspath(spec))
    from hypothesis.extra.redis import RedisExampleDatabase

    address = parse_redis_url(str(spec))
    client = _client(address)
    _ping(address, client)
    return RedisExampleDatabase(client, key_prefix=KEY_PREFIX)
