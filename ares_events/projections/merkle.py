"""The verifiable log (docs/proofs.md): :class:`MerkleLogProjection` keeps an RFC 9162
Merkle tree over every event's chain hash in tiles, and :class:`MerkleLog` reads roots,
proofs and signed checkpoints from it.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ares_events.core.backend import Capability
from ares_events.core.events import RecordedEvent
from ares_events.core.faces import blocking
from ares_events.core.read_models import CheckpointStore
from ares_events.core.recorder import system_of_record
from ares_events.errors import (
    ArchiveError,
    ChainIntegrityError,
    ConfigError,
    EventNotFound,
    ProofError,
    StoreError,
)
from ares_events.integrity import merkle
from ares_events.integrity.anchors import roots_at
from ares_events.integrity.checkpoints import (
    Checkpoint,
    SignedCheckpoint,
    consistency_document,
    inclusion_document,
    read_checkpoint,
    sign_checkpoint,
)
from ares_events.integrity.findings import Finding
from ares_events.integrity.notes import SigningKey
from ares_events.integrity.verifier import ChainVerifier
from ares_events.projections.runner import ProjectionRunner
from ares_events.projections.tables import tables_for

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = ["MERKLE_PROJECTION", "CheckpointNeeded", "MerkleLog", "MerkleLogProjection"]

MERKLE_PROJECTION: Final = "merkle_log"
TILE_HEIGHT: Final = 8
TILE_WIDTH: Final = 1 << TILE_HEIGHT
HEAD_KEY: Final = "head"
LOG_KEYS: Final = "log_keys"
"""Metadata key: JSON list of the verifier keys that signed this log's checkpoints."""
_KEYS_LOCK = threading.Lock()
_H: Final = merkle.HASH_SIZE
_REBUILD: Final = f"(rebuild it: ares-events rebuild {MERKLE_PROJECTION})"
MAX_SIZE: Final = 2**63 - 1
"""The largest tree size (a checkpoint's size is below 2**63: C2SP tlog-checkpoint)."""


class CheckpointNeeded(ProofError):
    """A read-only proof needs a checkpoint that is not stored: signing one (a write:
    ``checkpoint --key``, ``prove --key``) would answer. The CLI makes it exit 2, as
    every looking command that would need a write."""


def _leaf(e: RecordedEvent) -> bytes:
    """The Merkle leaf of ``e``'s chain hash; a damaged row whose hash is not 32 bytes (of
    another type, or cut) is a ``malformed_row`` finding, not a crash."""
    h = e.hash
    if type(h) is not bytes or len(h) != 32:
        detail = f"position {e.position!r}: its hash is not 32 bytes, the Merkle log cannot take it"
        raise ChainIntegrityError(
            e.stream_id, [Finding("malformed_row", e.stream_id, e.version, detail)]
        )
    return merkle.leaf_hash(h)


def tile_key(level: int, index: int) -> str:
    """Row key of tile ``index`` at tile level ``level``."""
    return f"t{level}/{index:012d}"


def _decode_tile(state: Any, key: str) -> tuple[bytearray, list[int] | None]:
    try:
        raw = bytearray(base64.b64decode(state["h"]))
        pos = state.get("p")
        if len(raw) % _H or (pos is not None and len(pos) * _H != len(raw)):
            raise ValueError("length")
    except (KeyError, TypeError, ValueError, AttributeError):
        raise StoreError(f"Merkle log row {key!r} is not a tile {_REBUILD}") from None
    return raw, (list(pos) if pos is not None else None)


def _read_head(state: Any) -> tuple[int, int]:
    """(size, position) of the stored head row (None: an empty tree); StoreError when
    it is not a head."""
    if state is None:
        return 0, 0
    size = state.get("size") if isinstance(state, dict) else None
    position = state.get("position") if isinstance(state, dict) else None
    # type() rather than isinstance(): a bool is an int, and no head stores one.
    if type(size) is not int or type(position) is not int or size < 0 or position < 0:
        raise StoreError(f"Merkle log row {HEAD_KEY!r} is not a head {_REBUILD}")
    return size, position


class MerkleLogProjection:
    """The Merkle tree over every event's chain hash, as tiles (a batch projection)."""

    name: ClassVar[str] = MERKLE_PROJECTION
    version: ClassVar[int] = 1

    def initial(self) -> Any:
        """Unused (the runner calls :meth:`fold_batch`)."""
        return None

    def apply(self, state: Any, event: RecordedEvent) -> Any:
        """Unused (the runner calls :meth:`fold_batch`)."""
        return state

    def fold_batch(
        self, load: Callable[[Iterable[str]], Mapping[str, Any]], events: list[RecordedEvent]
    ) -> dict[str, Any]:
        """Append ``events`` as leaves; return the changed tiles and the head.

        Raises:
            StoreError: the stored head or tiles are damaged, or do not match (rebuild).
        """
        size, _ = _read_head(load([HEAD_KEY]).get(HEAD_KEY))
        wanted = {}
        level, count = 0, size
        while count:
            if count % TILE_WIDTH:
                wanted[(level, count // TILE_WIDTH)] = tile_key(level, count // TILE_WIDTH)
            count //= TILE_WIDTH
            level += 1
        loaded = load(wanted.values()) if wanted else {}
        tiles: dict[tuple[int, int], tuple[bytearray, list[int] | None]] = {}
        for (lv, idx), key in wanted.items():
            if key not in loaded:
                raise StoreError(f"Merkle log tile {key!r} is missing at size {size} {_REBUILD}")
            tiles[(lv, idx)] = _decode_tile(loaded[key], key)
        touched: set[tuple[int, int]] = set()

        def add(lv: int, node: int, h: bytes, position: int | None) -> None:
            idx, off = divmod(node, TILE_WIDTH)
            t = tiles.get((lv, idx))
            if t is None:
                t = tiles[(lv, idx)] = (bytearray(), [] if lv == 0 else None)
            hashes, positions = t
            if len(hashes) != off * _H:
                raise StoreError(
                    f"Merkle log tile {tile_key(lv, idx)!r} holds {len(hashes) // _H} hashes, "
                    f"expected {off} {_REBUILD}"
                )
            hashes += h
            if positions is not None and position is not None:
                positions.append(position)
            touched.add((lv, idx))
            if off == TILE_WIDTH - 1:  # the tile is full: its root is a node one level up
                full = [bytes(hashes[i : i + _H]) for i in range(0, len(hashes), _H)]
                add(lv + 1, idx, merkle.perfect_root(full), None)

        for e in events:
            add(0, size, _leaf(e), e.position)
            size += 1
        out: dict[str, Any] = {}
        for lv, idx in sorted(touched):
            hashes, positions = tiles[(lv, idx)]
            doc = {"h": base64.b64encode(bytes(hashes)).decode("ascii")}
            out[tile_key(lv, idx)] = doc if positions is None else {**doc, "p": positions}
        out[HEAD_KEY] = {"size": size, "position": events[-1].position if events else 0}
        return out


class _Tiles:
    """The tree as stored: its head (``size``, ``position``; StoreError when damaged) and
    its tiles, each read once."""

    def __init__(self, tables: Any, table: str | None) -> None:
        self.tables = tables
        self.table = table or ""
        self.cache: dict[str, tuple[bytearray, list[int] | None]] = {}
        head = tables.load(table, [HEAD_KEY]).get(HEAD_KEY) if table else None
        self.size, self.position = _read_head(head)

    def get(self, level: int, index: int) -> tuple[bytearray, list[int] | None]:
        key = tile_key(level, index)
        t = self.cache.get(key)
        if t is None:
            state = self.tables.load(self.table, [key]).get(key)
            t = (bytearray(), None) if state is None else _decode_tile(state, key)
            self.cache[key] = t
        return t

    def node(self, level: int, index: int) -> bytes:
        """Hash of the complete subtree of ``2**level`` leaves at ``index``."""
        tl, rest = divmod(level, TILE_HEIGHT)
        width = 1 << rest
        first = index * width
        hashes, _ = self.get(tl, first // TILE_WIDTH)
        off = (first % TILE_WIDTH) * _H
        chunk = hashes[off : off + width * _H]
        if len(chunk) != width * _H:
            raise StoreError(
                f"Merkle log: the subtree at height {level} index {index} is not stored yet"
            )
        return merkle.perfect_root([bytes(chunk[i : i + _H]) for i in range(0, len(chunk), _H)])


class MerkleLog:
    """The Merkle log of one store: catch up, roots, proofs, signed checkpoints.

    Every method that reads the tree raises :class:`StoreError` when its stored rows are
    damaged (the message says to rebuild it).

    Args:
        store: the event store (its database holds the tree and the checkpoints).
        batch_size: events per transaction when catching up.
    """

    def __init__(self, store: EventStore, *, batch_size: int = 5000) -> None:
        store = blocking(store, "ae.MerkleLog")
        self.store = store
        self.projection = MerkleLogProjection()
        self.batch_size = batch_size
        self.tables = tables_for(store)
        self.checkpoints: CheckpointStore = self.tables.checkpoints

    def runner(self) -> ProjectionRunner:
        """A catch-up runner of the tree alone (run it beside your other projections, or
        as its own ``run_forever`` loop, to keep the tree current)."""
        return ProjectionRunner(self.store, [self.projection], batch_size=self.batch_size)

    def catch_up(self, *, progress: Callable[[int], None] | None = None) -> int:
        """Fold every committed event not yet in the tree; returns how many.

        Args:
            progress: called with the number of events folded so far, after each batch.

        Raises:
            StoreUnavailable: the store cannot be reached.
            StoreError: the stored tree is inconsistent (rebuild it).
        """
        return self.runner().run_until_idle(progress=progress)

    def _tiles(self) -> _Tiles:
        meta = self.tables.meta(MERKLE_PROJECTION)
        return _Tiles(self.tables, meta.active_table if meta is not None else None)

    def size(self) -> int:
        """Leaves in the tree as stored (call :meth:`catch_up` first for the latest)."""
        return self._tiles().size

    def position(self) -> int:
        """Position of the last event in the tree (0 when empty)."""
        return self._tiles().position

    def root(self, size: int | None = None) -> bytes:
        """The RFC 9162 root of the first ``size`` leaves (default: all).

        Raises:
            ProofError: ``size`` is beyond the tree.
        """
        tiles = self._tiles()
        n = tiles.size if size is None else size
        if not 0 <= n <= tiles.size:
            raise ProofError(f"the tree has {tiles.size} leaves; no root at size {n}")
        return merkle.EMPTY_ROOT if n == 0 else merkle.subtree_hash(0, n, tiles.node)

    def leaf_hash(self, index: int) -> bytes:
        """The stored leaf hash at ``index``.

        Raises:
            ProofError: ``index`` is beyond the tree.
        """
        tiles = self._tiles()
        if not 0 <= index < tiles.size:
            raise ProofError(f"no leaf {index} in the tree")
        return tiles.node(0, index)

    def index_of(self, position: int) -> int | None:
        """The leaf index of the event at global ``position`` (None: not in the tree)."""
        return _index_in(self._tiles(), position)

    def inclusion_proofs(
        self, positions: Sequence[int], size: int
    ) -> list[tuple[int, bytes, list[bytes]] | None]:
        """For each global position: its leaf index, the stored leaf hash and
        ``PATH(index, D[size])``; None where the position is not a leaf below ``size``.

        One tile cache and one memo of subtree hashes serve the whole batch: the proofs of
        a stream's events share most of their nodes, so a batch costs about one hash per
        leaf it spans instead of ``O(log n)`` tile reads per proof.

        Raises:
            ProofError: ``size`` is beyond the tree.
        """
        tiles = self._tiles()
        have = tiles.size
        if not 0 < size <= have:
            raise ProofError(f"no inclusion proofs at size {size} (tree: {have})")
        memo: dict[tuple[int, int], bytes] = {}

        def node(level: int, index: int) -> bytes:
            h = memo.get((level, index))
            if h is None:
                if level % TILE_HEIGHT == 0:
                    h = tiles.node(level, index)
                else:
                    h = merkle.node_hash(node(level - 1, 2 * index), node(level - 1, 2 * index + 1))
                memo[(level, index)] = h
            return h

        path = merkle.inclusion_proof
        return [
            None if i is None or i >= size else (i, node(0, i), path(i, size, node))
            for i in (_index_in(tiles, p) for p in positions)
        ]

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        """RFC 9162 ``PATH(index, D[size])``.

        Raises:
            ProofError: ``index`` or ``size`` is out of range.
        """
        tiles = self._tiles()
        have = tiles.size
        if not 0 <= index < size <= have:
            raise ProofError(f"no inclusion proof of leaf {index} at size {size} (tree: {have})")
        return merkle.inclusion_proof(index, size, tiles.node)

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        """RFC 9162 ``PROOF(old_size, D[new_size])``.

        Raises:
            ProofError: the sizes are out of range.
        """
        tiles = self._tiles()
        if not 0 <= old_size <= new_size <= tiles.size:
            raise ProofError(
                f"no consistency proof from size {old_size} to {new_size} (tree: {tiles.size})"
            )
        return merkle.consistency_proof(old_size, new_size, tiles.node)

    def sign(
        self, key: SigningKey, *, size: int | None = None, store: bool = True
    ) -> SignedCheckpoint:
        """Catch up, then sign (and store) a checkpoint of the log at ``size`` (default:
        every event committed so far). The origin line is the key's name.

        The tree must extend the checkpoints already stored: signing a tree that
        contradicts one (another root at a signed size, or a larger tree whose prefix is
        not a signed root) would make the key vouch for two histories.

        Raises:
            ProofError: ``size`` is beyond the log; the key's name differs from the
                origin of checkpoints this log already signed; the tree does not match
                the events it covers (:meth:`verify_rows`); or the log no longer
                matches a stored checkpoint (its events were rewritten or removed after
                it was signed), also when a racing signer stored another root at this
                size first.
            StoreUnavailable: the store cannot be reached.
        """
        self.catch_up()
        self.verify_rows()
        return self._sign(key, size, store)

    def verify_rows(self, size: int | None = None) -> None:
        """Check the tree's first ``size`` leaves (default: every leaf) against the
        events themselves: the root of the chain hashes of the first ``size`` events,
        recomputed from the system of record (archived events included), must be the
        tree's root at ``size``. Equal roots mean equal leaves in the same order, so a
        rewritten event (even with every hash recomputed), a deleted one, or an event at
        a position the tree skipped (on SQLite a deleted tail's positions are reused by
        the next appends, behind the tree's cursor) all fail it.

        The tree's tiles are what every root, proof and checkpoint is made from, and
        tampering with event rows never touches them; comparing stored checkpoints with
        the tree alone would sign such a tree again. This reads every event up to
        ``size`` (the same loop as ``anchor --check``): ``O(size)``.

        Raises:
            ProofError: the tree does not match its events, or they cannot be read (a
                damaged archive segment): nothing may be signed or proved from it.
            StoreUnavailable: the store cannot be reached.
        """
        have = self.size()
        n = have if size is None else size
        if not 0 <= n <= have:
            raise ProofError(f"the tree has {have} leaves; no root at size {n}")
        try:
            total, roots = roots_at(system_of_record(self.store.recorder), {n})
        except ArchiveError as exc:
            raise ProofError(
                f"the Merkle log cannot be checked against its events ({exc}), so "
                "nothing is signed or proved from it"
            ) from None
        if roots.get(n) == self.root(n):
            return
        why = (
            f"the store holds {total} events, the tree {n} leaves: events were removed"
            if total < n
            else f"the first {n} events no longer hash to the tree's root at size {n}: "
            "events were rewritten, removed or inserted behind the store's back"
        )
        raise ProofError(
            f"the Merkle log does not match its events ({why}); nothing is signed or "
            "proved from it. `ares-events anchor --check` (or `audit --anchors`) names the "
            "signed checkpoints they break; `ares-events rebuild merkle_log` rebuilds the "
            "tree from the events, which the stored checkpoints are then checked against"
        )

    def _sign(self, key: SigningKey, size: int | None, store: bool) -> SignedCheckpoint:
        """:meth:`sign` after the catch-up and :meth:`verify_rows`."""
        n = self.size() if size is None else size
        origin = self.checkpoints.origin()
        if origin is not None and origin != key.name:
            raise ProofError(
                f"this log's checkpoints have origin {origin!r}; the key is named {key.name!r} "
                "(a log keeps one origin: sign with a key of that name)"
            )
        cp = Checkpoint(key.name, n, self.root(n))
        # The largest stored size, not the newest row: a smaller size signed later (a
        # consistency proof's old size) covers fewer leaves. Each stored checkpoint was
        # checked against the then largest when signed, so their roots are prefixes of one
        # history and matching the largest matches them all. The one at exactly n is
        # checked too (one read) for stores whose rows predate this check.
        try:
            latest = self.latest_checkpoint()
            elsewhere = latest is not None and latest.checkpoint.size != n
            same = self.checkpoint_at(n) if elsewhere else None
        except ProofError as exc:
            raise ProofError(
                f"a stored checkpoint is damaged ({exc.reason}), so the log cannot be checked "
                "against it: see `ares-events checkpoint --list`"
            ) from None
        for stored in (latest, same):
            if stored is not None:
                self._check_against(stored)
        text = sign_checkpoint(cp, key)
        signed = read_checkpoint(text)
        if store:
            self.checkpoints.put(cp.origin, cp.size, cp.root, text)
            # put keeps the first row of a size: a signer of another tree (a rebuild
            # racing this one) may have stored first; never hand out a note the store
            # contradicts.
            kept = self.checkpoint_at(n)
            if kept is not None and kept.checkpoint.root != cp.root:
                raise ProofError(
                    f"the log no longer matches its checkpoint at size {n}: another root at "
                    f"size {n} was stored while this one was signed (the tree changed under "
                    "it: audit the store, e.g. `ares-events anchor --check`)"
                )
            self._remember_key(key.verifier.text)
        logger.info("signed checkpoint of %s at size %d", cp.origin, cp.size)
        return signed

    def latest_checkpoint(self, *, covering: int | None = None) -> SignedCheckpoint | None:
        """The stored checkpoint with the largest size (None when there is none, or none
        of size above ``covering``)."""
        rows = self.checkpoints.newest(1)
        if not rows:
            return None
        cp = read_checkpoint(rows[0][3])
        if covering is not None and cp.checkpoint.size <= covering:
            return None
        return cp

    def checkpoint_at(self, size: int) -> SignedCheckpoint | None:
        """The stored checkpoint of exactly ``size`` leaves, or None."""
        if not 0 <= size <= MAX_SIZE:  # no tree has it (and SQLite cannot even look it up)
            return None
        text = self.checkpoints.at_size(size)
        return read_checkpoint(text) if text is not None else None

    def _remember_key(self, vkey: str) -> None:
        """Add ``vkey`` to the store's ``log_keys`` (a store without metadata keeps none)."""
        if Capability.METADATA not in self.store.capabilities:
            return
        rec: Any = self.store.recorder  # KeepsMetadata, declared above
        with _KEYS_LOCK:
            try:
                keys = json.loads(rec.meta_get(LOG_KEYS) or "[]")
            except ValueError:
                keys = []
            keys = [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []
            if vkey not in keys:
                rec.meta_set(LOG_KEYS, json.dumps([*keys, vkey]))

    def _behind(self, what: str) -> ConfigError | None:
        """The ConfigError for a proof lacking ``what`` because the tree is behind the
        committed events (None when it is not); catching up would write."""
        tiles = self._tiles()
        logged, last = tiles.position, self.store.last_position()
        if logged >= last:
            return None
        state = (
            "this store's Merkle log is not built yet"
            if not tiles.table
            else f"the Merkle log holds the events up to position {logged} of {last}"
        )
        return ConfigError(
            f"{what}: {state}, and bringing it up to date writes to the store, which a "
            "read-only proof does not do: sign a checkpoint (`ares-events checkpoint --key "
            "FILE`, or prove with --key), which catches the log up first"
        )

    def _check_against(self, signed: SignedCheckpoint, *, caught_up: bool = True) -> None:
        """ProofError when the tree is shorter than ``signed`` or has another root at its
        size (ConfigError when only shorter because not ``caught_up`` yet)."""
        cp = signed.checkpoint
        have = self.size()
        if have < cp.size:
            behind = None if caught_up else self._behind(f"checkpoint at size {cp.size}")
            if behind is not None:
                raise behind
            raise ProofError(
                f"the log holds {have} leaves but checkpoint {cp.origin} signed {cp.size}: "
                "events were removed after it was signed"
            )
        if self.root(cp.size) != cp.root:
            raise ProofError(
                f"the log no longer matches its checkpoint at size {cp.size}: the events "
                "before it were rewritten after it was signed"
            )

    def prove_event(
        self, stream_id: str, version: int, *, key: SigningKey | None = None, catch_up: bool = True
    ) -> dict[str, Any]:
        """An inclusion proof of one event, as the JSON object ``prove`` prints.

        Against the latest stored checkpoint that covers the event, or, with ``key``, a
        checkpoint signed (and stored) now. ``catch_up=False`` (a read-only proof) writes
        nothing: the event must already be in the log.

        Raises:
            EventNotFound: no such event.
            CheckpointNeeded: (a ProofError) no checkpoint covers the event (pass ``key``).
            ProofError: with ``key``, the tree does not match its events (:meth:`verify_rows`);
                the event is not the one logged at its place (rewritten after it was logged)
                or its fields no longer hash to its chain hash (edited in place); or the log
                no longer matches the checkpoint.
            ConfigError: ``catch_up`` is False (without ``key``) and the log has not
                folded the event yet: the proof needs a write.
        """
        event = _read_one(self.store, stream_id, version)
        catch_up = catch_up or key is not None  # signing catches up anyway
        if catch_up:  # False: a read-only proof, of what the log holds now
            self.catch_up()
        index = self.index_of(event.position)
        behind = None if catch_up else self._behind(f"stream {stream_id!r} version {version}")
        if index is None and behind is not None and event.position > self.position():
            raise behind
        if index is None:
            raise ProofError(
                f"stream {stream_id!r} version {version} (position {event.position}) is not in "
                "the Merkle log: its position is not among the logged leaves"
            )
        if self.leaf_hash(index) != _leaf(event):
            raise ProofError(
                f"stream {stream_id!r} version {version} does not have the chain hash that was "
                f"logged at leaf {index}: it was rewritten after it was logged"
            )
        # The leaf vouches for the stored hash only: the event's fields must still hash to
        # it, or the proof would be about bytes nobody wrote (an in-place payload edit).
        check = ChainVerifier(
            stream_id,
            self.store.chain_key,
            start_version=version - 1,
            start_hash=event.prev_hash or b"",
        )
        if not check.check(event):
            raise ProofError(
                f"stream {stream_id!r} version {version} does not hash to its stored chain "
                f"hash ({check.findings[0].kind}): it was edited after it was written"
            )
        signed = self.sign(key) if key is not None else self.latest_checkpoint(covering=index)
        if signed is None:
            raise CheckpointNeeded(
                f"no stored checkpoint covers leaf {index} yet: sign one with "
                "`ares-events checkpoint --key FILE` (or pass --key)"
            )
        self._check_against(signed, caught_up=catch_up)
        size = signed.checkpoint.size
        return inclusion_document(
            index, size, event.hash, self.inclusion_proof(index, size), signed.text
        )

    def prove_consistency(
        self,
        old_size: int,
        new_size: int | None = None,
        *,
        key: SigningKey | None = None,
        catch_up: bool = True,
    ) -> dict[str, Any]:
        """A consistency proof, as the JSON object ``prove --consistency`` prints.

        ``new_size`` defaults to the latest stored checkpoint's size (with ``key``: the
        current log, signed now). The checkpoints of both sizes come from the stored
        ones, or are signed with ``key`` when missing. ``catch_up=False`` (a read-only
        proof, without ``key``) writes nothing: the log must already hold both sizes.

        Every leaf below ``new_size`` is checked against the events first
        (:meth:`verify_rows`; with ``key``, every leaf of the tree, as before any
        signature): the proof vouches for all of them.

        Raises:
            CheckpointNeeded: (a ProofError) without ``key``, no stored checkpoint of
                ``new_size`` (or none at all), and signing one would answer.
            ProofError: sizes out of range, the tree does not match its events, or the
                log no longer matches a checkpoint.
            ConfigError: ``catch_up`` is False and the log has not folded the events of
                a checkpoint yet: the proof needs a write.
        """
        catch_up = catch_up or key is not None
        if catch_up:
            self.catch_up()
        if key is not None:
            self.verify_rows()  # once, for the one or two checkpoints signed below
        if new_size is None:
            latest = self._sign(key, None, True) if key is not None else self.latest_checkpoint()
            if latest is None:
                raise CheckpointNeeded(
                    "no stored checkpoint: sign one with `ares-events checkpoint --key FILE`"
                )
            new_size = latest.checkpoint.size
        new = self._checkpoint_of(new_size, key)
        if not 0 <= old_size <= new_size:
            raise ProofError(f"no consistency proof from size {old_size} to size {new_size}")
        old: SignedCheckpoint | None = None
        if old_size > 0:
            old = self.checkpoint_at(old_size)
            if old is None and key is not None:
                old = self._sign(key, old_size, True)
        self._check_against(new, caught_up=catch_up)
        if old is not None:
            self._check_against(old, caught_up=catch_up)
        if key is None:
            self.verify_rows(new_size)
        proof = self.consistency_proof(old_size, new_size)
        return consistency_document(
            old_size, new_size, proof, new.text, old.text if old is not None else None
        )

    def _checkpoint_of(self, size: int, key: SigningKey | None) -> SignedCheckpoint:
        found = self.checkpoint_at(size)
        if found is not None:
            return found
        if size > self.size() and (key is not None or self._behind("") is None):
            raise ProofError(f"the log holds {self.size()} leaves; no checkpoint at {size}")
        if key is not None:
            return self._sign(key, size, True)
        raise CheckpointNeeded(
            f"no stored checkpoint of size {size}: pass --key to sign one "
            "(stored sizes: `ares-events checkpoint --list`)"
        )


def _index_in(tiles: _Tiles, position: int) -> int | None:
    """The leaf index of global ``position`` (None: not a leaf), from the level-0 tiles."""
    n_tiles = (tiles.size + TILE_WIDTH - 1) // TILE_WIDTH
    lo, hi = 0, n_tiles - 1
    # Positions are 1, 2, 3, ... on gapless stores: try the tile that would hold it.
    guess = (position - 1) // TILE_WIDTH
    order = [guess] if 0 <= guess < n_tiles else []
    while order or lo <= hi:
        t = order.pop() if order else (lo + hi) // 2
        _, positions = tiles.get(0, t)
        if not positions:
            return None
        if position < positions[0]:
            hi = t - 1
        elif position > positions[-1]:
            lo = t + 1
        else:
            try:
                return t * TILE_WIDTH + positions.index(position)
            except ValueError:
                return None
    return None


def _read_one(store: EventStore, stream_id: str, version: int) -> RecordedEvent:
    if type(version) is not int or version < 1:
        raise EventNotFound(stream_id, version, "versions start at 1")
    for e in store.read(stream_id, version, version, 1):
        if e.version == version:
            return e
    raise EventNotFound(stream_id, version)
