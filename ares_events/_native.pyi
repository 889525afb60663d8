"""Type stub of the optional C extension ``ares_events._native`` (sources in
``_native_src/``); see :func:`ares_events.integrity.verifier.verify_run` and
:func:`ares_events.chain.canonical_json`."""

from collections.abc import Sequence
from typing import Any

def verify_run(
    events: Sequence[Any],
    start: int,
    stream_id: str,
    stream_json: bytes,
    last_version: int,
    last_hash: bytes,
    key: bytes | None,
    /,
) -> tuple[int, int, bytes]: ...
def blake3_hash(data: bytes, key: bytes | None = None) -> bytes: ...
def scan(value: Any, /) -> bool | None: ...
def link_hashes(
    stream_json: bytes, version: int, prev: bytes, events: Sequence[Any], key: bytes | None, /
) -> list[bytes]: ...
def make_uuid7(cls: type[Any], ms: int, seq: int, rand_b: int, is_safe: Any, /) -> Any: ...
def verify_page(
    events: list[Any],
    start: int,
    stream_id: str,
    stream_json: bytes,
    last_version: int,
    last_hash: bytes,
    key: bytes | None,
    width: int = 0,
    /,
) -> tuple[int, int, bytes]: ...
def blake3_many(items: list[bytes], key: bytes | None = None, width: int = 0, /) -> list[bytes]: ...
def row_to_event(cls: type[Any], missing: Any, slow: Any, row: tuple[Any, ...], /) -> Any: ...
def uuid7_setup(cls: type[Any], is_safe: Any, getrandbits: Any, time_ns: Any, /) -> None: ...
def uuid7() -> Any: ...
def prepare(
    events: Sequence[Any],
    at: str,
    new_event: type[Any],
    prepared_event: type[Any],
    uuid7_cls: type[Any],
    good_names: set[str],
    dumps: Any,
    opts: int,
    max_meta: int,
    /,
) -> list[Any] | None: ...
def insert_rows(
    stream_id: str,
    stream_json: bytes,
    version: int,
    prev: bytes,
    position: int,
    prepared: Sequence[Any],
    key: bytes | None,
    prepared_event: type[Any],
    flat: bool = False,
    /,
) -> tuple[Any, ...] | None: ...
def install_init(
    cls: type[Any],
    names: tuple[str, ...],
    defaults: tuple[Any, ...],
    factories: tuple[Any, ...],
    missing: Any,
    /,
) -> None: ...
def payload_setup(missing: Any, loads: Any, slow: Any, /) -> None: ...
def event_payload(event: Any, /) -> Any: ...
def sqlite_setup(path: str, version_number: int, /) -> bool: ...
def sqlite_handle_check(connect: Any, connection_type: type, /) -> bool: ...

class SQLiteWriter:
    def __init__(
        self,
        conn: Any,
        begin: str,
        head: str,
        upsert: str,
        commit: str,
        rollback: str,
        insert_sql: Any,
        genesis: Any,
        prepared_event: type[Any],
        operational_error: type[BaseException],
        database_error: type[BaseException],
        /,
    ) -> None: ...
    def append(
        self,
        stream_id: str,
        stream_json: bytes,
        expected: int,
        events: Sequence[Any],
        key: bytes | None,
        /,
    ) -> tuple[int, int] | bool | None: ...
    def rows(self, sql: str, args: tuple[Any, ...], /) -> list[tuple[Any, ...]] | None: ...
    def close(self) -> None: ...
