"""A small witness with C2SP ``tlog-witness`` semantics, keeping its state in SQLite (what
it cosigns and each refusal's status: docs/proofs.md). The check and the update happen in
one ``BEGIN IMMEDIATE`` transaction, so two requests can never roll the witness back.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ares_events.core.events import utc_now_at
from ares_events.errors import ConfigError, ProofError, StoreUnavailable, WitnessRefused
from ares_events.integrity import merkle
from ares_events.integrity.checkpoints import (
    MAX_PROOF_HASHES,
    b64,
    cosign_checkpoint,
    parse_checkpoint,
    unb64_hash,
)
from ares_events.integrity.notes import (
    ALG_COSIGNATURE_V1,
    Note,
    SigningKey,
    VerifierKey,
    holds_private_key,
    open_note,
)
from ares_events.stores.sqlite.read_only import UnlockedRead, reader_uri

logger = logging.getLogger(__name__)

__all__ = ["CosignResult", "LogWitness", "WitnessedLog", "format_request", "parse_request"]

TABLES: Final = frozenset({"witness_keys", "witness_checkpoints"})
SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS witness_keys (origin TEXT NOT NULL, vkey TEXT NOT NULL, "
    "PRIMARY KEY (origin, vkey))",
    "CREATE TABLE IF NOT EXISTS witness_checkpoints (origin TEXT PRIMARY KEY, "
    "size INTEGER NOT NULL, root BLOB NOT NULL, note TEXT NOT NULL, cosigned_at TEXT NOT NULL)",
)
INSERT_KEY: Final = "INSERT INTO witness_keys (origin, vkey) VALUES (?, ?) ON CONFLICT DO NOTHING"
SELECT_TABLES: Final = "SELECT name FROM sqlite_master WHERE type = 'table'"
SELECT_KEYS: Final = "SELECT vkey FROM witness_keys WHERE origin = ? ORDER BY vkey"
SELECT_ORIGINS: Final = "SELECT DISTINCT origin FROM witness_keys ORDER BY origin"
SELECT_LATEST: Final = (
    "SELECT size, root, note, cosigned_at FROM witness_checkpoints WHERE origin = ?"
)
UPSERT_LATEST: Final = (
    "INSERT INTO witness_checkpoints (origin, size, root, note, cosigned_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (origin) DO UPDATE SET size = excluded.size, "
    "root = excluded.root, note = excluded.note, cosigned_at = excluded.cosigned_at"
)
# tlog-witness: "an ASCII decimal with no leading zeroes (unless the size is zero ...)".
# Not str.isdigit(): it is true for any Unicode digit ('\uff10', '\u0663', '\u00b2'),
# which int() reads as another size or refuses with a ValueError.
_OLD_SIZE: Final = re.compile(r"0|[1-9][0-9]{0,18}", re.ASCII)


def parse_request(body: str) -> tuple[int, list[bytes], str]:
    """``(old size, consistency proof, signed checkpoint)`` of an ``add-checkpoint`` body.

    Raises:
        WitnessRefused: malformed (status 400).
    """
    head, sep, note = body.partition("\n\n")
    if not sep:
        raise WitnessRefused(400, "no empty line between the proof and the checkpoint")
    lines = head.split("\n")
    if not lines[0].startswith("old "):
        raise WitnessRefused(400, "the request must start with 'old <size>'")
    size = lines[0][4:]
    if not _OLD_SIZE.fullmatch(size):
        # Not quoted: a request is a file that may be another one given by mistake.
        raise WitnessRefused(
            400, "the old size is not an ASCII decimal without leading zeros ('old <size>')"
        )
    if len(lines) - 1 > MAX_PROOF_HASHES - 1:
        raise WitnessRefused(400, "more than 63 consistency proof lines")
    try:
        proof = [unb64_hash(h, "a consistency proof line") for h in lines[1:]]
    except ProofError as exc:
        raise WitnessRefused(400, exc.reason) from None
    return int(size), proof, note


def format_request(old_size: int, proof: Sequence[bytes], checkpoint: str) -> str:
    """An ``add-checkpoint`` body."""
    return f"old {old_size}\n" + "".join(b64(h) + "\n" for h in proof) + "\n" + checkpoint


@dataclass(frozen=True, slots=True)
class CosignResult:
    """A cosignature: the signature line(s) and the note with them added."""

    origin: str
    size: int
    lines: tuple[str, ...]
    note: str


@dataclass(frozen=True, slots=True)
class WitnessedLog:
    """A log the witness trusts, and the latest checkpoint it cosigned (size 0: none)."""

    origin: str
    vkeys: tuple[str, ...]
    size: int
    root: bytes | None
    cosigned_at: str | None


class LogWitness:
    """The witness's state (SQLite file ``path``) and, to cosign, its key (type 0x04).

    ``read_only`` (``witness list``) opens an existing state file as the store's readers
    open theirs (docs/cli.md, "Which commands write"): ``query_only``, no table made, no
    WAL switch, the file byte for byte what it was. Otherwise a missing file is created;
    either way a database holding other tables (an event store given as ``--state``) is
    refused, never turned into a witness's.

    Raises:
        ConfigError: ``key`` is not a cosigning key; the file is not a witness's state
            (or, ``read_only``, there is none).
        StoreUnavailable: the state file cannot be opened.
    """

    def __init__(
        self, path: str | Path, key: SigningKey | None = None, *, read_only: bool = False
    ) -> None:
        if key is not None and key.alg != ALG_COSIGNATURE_V1:
            raise ConfigError(
                f"witness key {key.name!r} is a log key; a witness cosigns with a "
                "cosignature key (ares-events keygen NAME --out FILE --witness)"
            )
        self.path = Path(path)
        self.key = key
        self.read_only = read_only
        self._unlocked: UnlockedRead | None = None
        if read_only and not self.path.exists():
            raise ConfigError(f"no witness state at {self.path} (witness add-log makes one)")
        try:
            if read_only:
                uri, self._unlocked = reader_uri(self.path, f"{self.path} (witness state)")
                self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
            else:
                self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open witness state {self.path}: {exc}") from exc
        try:
            if read_only:
                self._conn.execute("PRAGMA query_only = ON")  # SQLite refuses any write
            self._check_tables()  # before anything could change the file
            if not read_only:
                for stmt in ("PRAGMA journal_mode = WAL", "PRAGMA synchronous = FULL", *SCHEMA):
                    self._conn.execute(stmt)
        except sqlite3.Error as exc:
            self.close()
            raise StoreUnavailable(f"cannot open witness state {self.path}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def _check_tables(self) -> None:
        tables = {r[0] for r in self._conn.execute(SELECT_TABLES) if not r[0].startswith("sqlite_")}
        self._read_done()
        if tables - TABLES:
            raise ConfigError(
                f"{self.path} is not a witness state file: it holds other tables (an event "
                "store?); give --state the witness's own file"
            )
        if self.read_only and not tables >= TABLES:
            raise ConfigError(
                f"{self.path} is not a witness state file: it holds no witness tables "
                "(witness add-log makes them)"
            )

    def _read_done(self) -> None:
        """After a read without locks: refuse it when a writer changed the file meanwhile."""
        if self._unlocked is not None:
            self._unlocked.check()

    def close(self) -> None:
        """Close the state file. Idempotent."""
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def __enter__(self) -> LogWitness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                c.execute("ROLLBACK")
            raise
        else:
            c.execute("COMMIT")

    def add_log(self, vkey: VerifierKey, origin: str | None = None) -> str:
        """Trust ``vkey`` for the log ``origin`` (default: the key's name). Returns it.

        Raises:
            ConfigError: ``vkey`` is a cosignature key, not a log key.
        """
        if vkey.alg == ALG_COSIGNATURE_V1:
            raise ConfigError("a witness trusts log keys (type 0x01), not cosignature keys")
        o = origin or vkey.name
        with self._tx() as c:
            c.execute(INSERT_KEY, (o, vkey.text))
        logger.info("witness %s: trusts %s for %s", self.path, vkey.text, o)
        return o

    def logs(self) -> list[WitnessedLog]:
        """Every trusted log with the latest checkpoint cosigned for it."""
        out = []
        for (origin,) in self._conn.execute(SELECT_ORIGINS).fetchall():
            keys = tuple(r[0] for r in self._conn.execute(SELECT_KEYS, (origin,)).fetchall())
            row = self._conn.execute(SELECT_LATEST, (origin,)).fetchone()
            size, root, _note, at = row if row else (0, None, None, None)
            out.append(WitnessedLog(origin, keys, int(size), root, at))
        self._read_done()
        return out

    def add_checkpoint(
        self,
        old_size: int,
        proof: Sequence[bytes],
        checkpoint: str,
        *,
        timestamp: int | None = None,
    ) -> CosignResult:
        """Cosign ``checkpoint`` if it is consistent with the last one cosigned for its
        origin (every check and its status: docs/proofs.md).

        Raises:
            WitnessRefused: a check failed (``status`` says which, as tlog-witness does).
            ConfigError: the witness has no key to cosign with.
        """
        if self.key is None:
            raise ConfigError("this witness has no cosigning key (pass --key)")
        try:
            note = Note.parse(checkpoint)
            cp = parse_checkpoint(note.text)
        except ProofError as exc:
            raise WitnessRefused(400, f"not a signed checkpoint: {exc.reason}") from None
        with self._tx() as c:
            keys = [VerifierKey.parse(r[0]) for r in c.execute(SELECT_KEYS, (cp.origin,))]
            if not keys:
                # The origin line is not yet vouched for by any key: a file given by
                # mistake may hold a private key there, which is never shown.
                if holds_private_key(cp.origin):
                    raise WitnessRefused(404, "unknown log (its origin line holds a private key)")
                raise WitnessRefused(404, f"unknown log {cp.origin!r}")
            try:
                open_note(note, keys)
            except ProofError as exc:
                raise WitnessRefused(403, f"log {cp.origin}: {exc.reason}") from None
            if not 0 <= old_size <= cp.size:  # negative: only the JSON form can say it
                raise WitnessRefused(
                    400, f"old size {old_size} is not between 0 and the checkpoint's {cp.size}"
                )
            row = c.execute(SELECT_LATEST, (cp.origin,)).fetchone()
            size, root = (int(row[0]), bytes(row[1])) if row else (0, merkle.EMPTY_ROOT)
            if old_size != size:
                raise WitnessRefused(
                    409,
                    f"log {cp.origin}: the last cosigned size is {size}, not {old_size}",
                    latest_size=size,
                )
            if old_size == cp.size:
                if proof or root != cp.root:
                    raise WitnessRefused(
                        409,
                        f"log {cp.origin}: a different root at size {size} than the one "
                        "cosigned (a fork)",
                        latest_size=size,
                    )
            elif old_size == 0:
                if proof:
                    raise WitnessRefused(422, "a consistency proof from size 0 must be empty")
            elif not merkle.verify_consistency(old_size, cp.size, root, cp.root, proof):
                raise WitnessRefused(
                    422,
                    f"log {cp.origin}: the checkpoint at size {cp.size} is not consistent with "
                    f"the one cosigned at size {old_size}",
                    latest_size=size,
                )
            cosig = cosign_checkpoint(note, self.key, timestamp=timestamp)
            cosigned = note.with_signatures([cosig])
            c.execute(UPSERT_LATEST, (cp.origin, cp.size, cp.root, cosigned.format(), utc_now_at()))
        logger.info("witness %s: cosigned %s at size %d", self.path, cp.origin, cp.size)
        return CosignResult(cp.origin, cp.size, (cosig.line(),), cosigned.format())

    def latest(self, origin: str) -> dict[str, Any] | None:
        """The latest checkpoint cosigned for ``origin`` (size, root, note), or None."""
        row = self._conn.execute(SELECT_LATEST, (origin,)).fetchone()
        self._read_done()
        if row is None:
            return None
        return {"size": int(row[0]), "root": b64(bytes(row[1])), "note": row[2], "at": row[3]}
