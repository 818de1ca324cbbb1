"""The waiting order: every claim waiting for a slice, in queue order, indexed for the admission step.

Queue order is priority (higher first), then ``arrived_at``, then the order of the ``add`` calls:
the ``Key`` (-priority, arrived_at - head start, seq). A product's head start (seconds, by
``packing.wait_history.kind_of``; 0 unless given: only the simulator's what-ifs set one) orders its
claims as if they had arrived that much earlier (drain-soonest and worst-first offer targets in that
order); reported waits and age limits count from the true arrival; pod groups keep their arrival.
It is stable and deterministic; a claim put back (a lapsed reservation, a failed bind, a priority
change) keeps its seq, so its old place.

Indexes (recomputed and compared by ``verify``):

* every waiting Key, ascending (``keys``), and each entry by its seq;
* classes of identical (request, namespace, priority), each a ``SortedList`` of its Keys in
  arrival order, and of (time limit, Key) for the claims that declare a limit;
* per request shape, a ``SortedList`` of (head Key, class id) of its classes, and of
  (arrived_at, head Key): is any class head of the shape older than some age?

Cost: ``add``, ``remove``: O(log n). ``Walk`` merges the shapes' class heads through a heap, so an
admission step pays per shape and per class it looks at, not per waiting claim.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from packing.claims import WaitingClaim
from packing.products import Request
from packing.wait_history import kind_of

Key = tuple[int, float, int]  # (-priority, arrived_at - head start, seq): queue order
Entry = tuple[WaitingClaim, Key, int]  # a waiting claim, its Key and its class id
ClassKey = tuple[Request, str, int]  # (request, namespace, priority)
AFTER_KEYS = (math.inf,)  # compares above every Key: closes a (time limit, Key) range


def key_of(claim: WaitingClaim, seq: int, head_start: float = 0.0) -> Key:
    """The queue-order key of ``claim`` added as the ``seq``-th, its product ``head_start`` seconds ahead."""
    return (-claim.priority, float(claim.arrived_at) - head_start, seq)


@dataclass(slots=True)
class ClaimClass:
    """Waiting claims of one (request, namespace, priority): they fit, wait and count alike."""

    cid: int
    shape: Request
    namespace: str
    priority: int
    keys: SortedList = field(default_factory=SortedList)  # Key, arrival order
    limits: SortedList = field(default_factory=SortedList)  # (time limit, Key) of claims declaring one


@dataclass(slots=True)
class Shape:
    """Waiting claims of one request shape: its classes' heads, by Key and by age."""

    sid: int
    request: Request
    heads: SortedList = field(default_factory=SortedList)  # (head Key, cid) of its classes
    by_age: SortedList = field(default_factory=SortedList)  # (arrived_at, head Key)


class WaitingOrder:
    """The waiting claims in queue order, with their class and shape indexes."""

    def __init__(self, head_starts: Mapping[str, float] | None = None) -> None:
        self.head_starts = dict(head_starts or {})  # kind_of(request) -> seconds ahead in line
        self.entries: dict[str, Entry] = {}  # claim id -> (claim, key, cid)
        self.by_seq: dict[int, Entry] = {}  # seq -> the same entry: one lookup per Key
        self.keys: SortedList = SortedList()  # every waiting Key
        self.classes: dict[int, ClaimClass] = {}
        self.shapes: dict[Request, Shape] = {}
        self.limited = 0  # waiting claims that declare a time limit (backfill candidates)
        self._class_of: dict[ClassKey, int] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, claim: object) -> bool:
        return claim in self.entries

    def get(self, claim: str) -> Entry | None:
        return self.entries.get(claim)

    def claim_at(self, key: Key) -> WaitingClaim:
        """The waiting claim whose Key is ``key``."""
        return self.by_seq[key[2]][0]

    def in_order(self) -> Iterator[WaitingClaim]:
        """Waiting claims in queue order."""
        for key in self.keys:
            yield self.by_seq[key[2]][0]

    def ordered_entries(self, limit: int | None = None) -> Iterator[Entry]:
        """(claim, key, class id) in queue order; the first ``limit`` when set."""
        keys = self.keys if limit is None else self.keys.islice(0, limit)
        by_seq = self.by_seq
        return (by_seq[key[2]] for key in keys)

    def key(self, claim: WaitingClaim, seq: int) -> Key:
        """``claim``'s Key as the ``seq``-th, with its product's head start."""
        return key_of(claim, seq, self.head_starts.get(kind_of(claim.request), 0.0) if self.head_starts else 0.0)

    def add(self, claim: WaitingClaim, seq: int) -> None:
        """Put ``claim`` in line as the ``seq``-th (its Key); the caller refuses known ids."""
        key = self.key(claim, seq)
        ckey: ClassKey = (claim.request, claim.namespace, claim.priority)
        cid = self._class_of.get(ckey)
        if cid is None:
            cid = self._new_id()
            self._class_of[ckey] = cid
            self.classes[cid] = ClaimClass(cid, claim.request, claim.namespace, claim.priority)
        cls = self.classes[cid]
        shape = self.shapes.get(claim.request)
        if shape is None:
            shape = self.shapes[claim.request] = Shape(self._new_id(), claim.request)
        old = cls.keys[0] if cls.keys else None
        cls.keys.add(key)
        if claim.time_limit is not None:
            cls.limits.add((claim.time_limit, key))
            self.limited += 1
        if old != cls.keys[0]:
            _move_head(shape, cid, old, key)
        self.keys.add(key)
        self.entries[claim.claim] = self.by_seq[seq] = (claim, key, cid)

    def remove(self, name: str) -> Entry:
        """Take ``name`` out of line (KeyError when it is not waiting); returns its entry."""
        entry = self.entries.pop(name)
        claim, key, cid = entry
        del self.by_seq[key[2]]
        self.keys.remove(key)
        cls = self.classes[cid]
        shape = self.shapes[cls.shape]
        old = cls.keys[0]
        cls.keys.remove(key)
        if claim.time_limit is not None:
            cls.limits.remove((claim.time_limit, key))
            self.limited -= 1
        if old == key:
            _move_head(shape, cid, key, cls.keys[0] if cls.keys else None)
        if not cls.keys:
            del self.classes[cid]
            del self._class_of[(cls.shape, cls.namespace, cls.priority)]
        if not shape.heads:
            del self.shapes[cls.shape]
        return entry

    def walk(self) -> Walk:
        """A fresh pass over the class heads in queue order (one admission step)."""
        return Walk(self)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def verify(self) -> None:
        """Recompute every index from the claims; AssertionError names the first mismatch."""
        keys = sorted(k for _, k, _ in self.entries.values())
        assert list(self.keys) == keys, "queue order index drifted"
        assert {e[1][2]: e for e in self.entries.values()} == self.by_seq, "seq index drifted"
        members: dict[int, list[Key]] = {}
        limited = 0
        for claim, key, cid in self.entries.values():
            cls = self.classes[cid]
            assert (cls.shape, cls.namespace, cls.priority) == (claim.request, claim.namespace, claim.priority)
            assert key == self.key(claim, key[2]), f"{claim.claim}: stale key"
            members.setdefault(cid, []).append(key)
            limited += claim.time_limit is not None
        assert limited == self.limited, "limited-claim count drifted"
        assert set(members) == set(self.classes), "empty or missing class"
        heads: dict[Request, list[tuple[Key, int]]] = {}
        for cid, cls in self.classes.items():
            assert list(cls.keys) == sorted(members[cid]), f"class {cid} drifted"
            lims = sorted((self.claim_at(k).time_limit, k) for k in members[cid]
                          if self.claim_at(k).time_limit is not None)
            assert list(cls.limits) == lims, f"class {cid} time-limit index drifted"
            heads.setdefault(cls.shape, []).append((cls.keys[0], cid))
        assert set(heads) == set(self.shapes), "empty or missing shape"
        for request, shape in self.shapes.items():
            assert list(shape.heads) == sorted(heads[request]), "shape head index drifted"
            assert list(shape.by_age) == sorted((k[1], k) for k, _ in heads[request]), "shape age index drifted"


def _move_head(shape: Shape, cid: int, old: Key | None, new: Key | None) -> None:
    if old is not None:
        shape.heads.remove((old, cid))
        shape.by_age.remove((old[1], old))
    if new is not None:
        shape.heads.add((new, cid))
        shape.by_age.add((new[1], new))


class Walk:
    """One pass over the waiting claims in queue order, a class head at a time.

    A heap holds, per request shape, its next class head. ``pop`` gives the next one in queue
    order; the strategy then decides what else of that shape it wants to see: ``advance`` offers the
    shape's next class head after a Key (after an admission, or past a class it skips), and not
    calling it leaves the whole shape out of the rest of the pass. So a shape that fits nowhere
    costs one pop, and a class over its entitlement one pop per class.
    """

    def __init__(self, order: WaitingOrder) -> None:
        self.order = order
        self._shapes = {s.sid: s for s in order.shapes.values()}
        self._heap = [(s.heads[0][0], s.sid, s.heads[0][1]) for s in order.shapes.values()]
        heapq.heapify(self._heap)

    def pop(self) -> tuple[Key, Shape, ClaimClass] | None:
        """The next class head in queue order: (its Key, its shape, its class); None at the end."""
        while self._heap:
            key, sid, cid = heapq.heappop(self._heap)
            cls = self.order.classes.get(cid)
            if cls is None or key[2] not in self.order.by_seq:
                continue  # admitted or withdrawn since it was pushed
            return key, self._shapes[sid], cls
        return None

    def advance(self, shape: Shape, after: Key) -> None:
        """Offer ``shape``'s first class head after ``after`` (its own class's next claim included)."""
        i = shape.heads.bisect_right((after, math.inf))
        if i < len(shape.heads):
            head, cid = shape.heads[i]
            heapq.heappush(self._heap, (head, shape.sid, cid))

    def offer(self, key: Key, shape: Shape, cid: int) -> None:
        """Offer one class head of ``shape`` again (the aging guard's starving heads)."""
        heapq.heappush(self._heap, (key, shape.sid, cid))
