"""The group book: pod groups (gangs) and their members, and the one unit each group is in line.

A pod group is the claims of one namespace that carry the same ``MemberOf`` name: they start all
together or not at all. The book keeps, per group, its members that wait and those that hold
their slice (admitted or bound), the size each member declared, and the group's place in line:
its first member's arrival (kept while any member is known, so a member deleted and re-created,
or a group put back after a failed bind, keeps the place). A group with at least one waiting
member is **one entry** of the waiting order (``entry``): a ``WaitingClaim`` whose request is a
``GroupRequest``, so the admission strategies walk it as one unit; the queue's view places it as a
whole (``packing.group_fit``). Complete groups whose waiting members ask alike share one
``GroupRequest`` (their members, counted), hence one request shape: a step that finds no room for
such a group skips every other group like it at once, as it does claims of one shape.

A group is

* **invalid** when its members disagree on the size, or more members than that size are known;
* **complete** when it is valid and its waiting plus running members are exactly its size;
* otherwise it waits for members (``WaitingForMembers``, n of N).

Only a complete group is ever placed, and then only its waiting members, all in one step (those
already running are the rest of a group whose members were re-created or put back).

Invariants (``verify``): every member is in exactly one group, waiting or running; a group with a
waiting member has an entry id, and no group is empty. Cost: every operation O(1) but ``entry``
and the group's own figures, O(members) once after each change of its members (then memoised:
an admission step asks them of every group in line).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from packing.claims import MemberOf, WaitingClaim
from packing.entitlements import product_name
from packing.products import Request

GROUP_ENTRY_PREFIX = "pod-group "  # entry ids: no pod uid (a UUID) and no simulator claim has a space
GroupKey = tuple[str, str]  # (namespace, group name)


def entry_id(namespace: str, name: str) -> str:
    """The id of a group's entry in the waiting order."""
    return f"{GROUP_ENTRY_PREFIX}{namespace}/{name}"


def is_entry(claim: str) -> bool:
    """Is ``claim`` a group's entry in the waiting order, not a claim of a pod?"""
    return claim.startswith(GROUP_ENTRY_PREFIX)


@dataclass(frozen=True, slots=True)
class GroupRequest(Request):
    """A group's request shape in the waiting order. A complete group's is its waiting members'
    requests, counted (``members``): groups that ask alike share it. A group that cannot be placed
    (waiting for members, invalid) has one of its own (``group``: its entry id), which never fits.
    The size fields are its first member's, for display only: the queue's view places the members'
    own requests."""

    members: frozenset[tuple[Request, int]] | None = None
    group: str = ""

    def member_requests(self) -> tuple[Request, ...]:
        """The members' requests, in one order for equal shapes (empty for a group that cannot be placed)."""
        if self.members is None:
            return ()
        return tuple(r for r, n in sorted(self.members, key=lambda rn: repr(rn[0])) for _ in range(n))


@dataclass(frozen=True, slots=True)
class _Facts:
    """What a group's members make of it, computed once after each change of its members."""

    members: tuple[WaitingClaim, ...]  # waiting, in arrival order
    requests: tuple[Request, ...]
    multiset: frozenset[tuple[Request, int]]  # the waiting members' requests, counted: equal for equal groups
    products: frozenset[str]  # the products its waiting members are counted under
    sizes: dict[int, int]  # declared size -> members declaring it
    size: int
    invalid: str | None


@dataclass(slots=True)
class Group:
    """One pod group: its members waiting (with their place in line) and running, and its own place."""

    namespace: str
    name: str
    arrived_at: float  # the earliest arrival of any member seen while the group was known
    seq: int  # that member's place among the queue's arrivals: the group's tie-break in line
    waiting: dict[str, tuple[WaitingClaim, int]] = field(default_factory=dict)  # member -> (claim, seq)
    running: dict[str, int] = field(default_factory=dict)  # member -> the size it declared
    memo: _Facts | None = field(default=None, repr=False, compare=False)  # dropped by every change of members

    def facts(self) -> _Facts:
        """The group's figures from its members (memoised until the book changes its members)."""
        if self.memo is None:
            members = tuple(w for w, _ in sorted(self.waiting.values(), key=lambda ws: (ws[0].arrived_at, ws[1])))
            requests = tuple(w.request for w in members)
            sizes: dict[int, int] = {}
            for w in members:
                assert w.group is not None
                sizes[w.group.size] = sizes.get(w.group.size, 0) + 1
            for declared in self.running.values():
                sizes[declared] = sizes.get(declared, 0) + 1
            size = max(sizes, key=lambda k: (sizes[k], k)) if sizes else 0
            self.memo = _Facts(members, requests, frozenset(Counter(requests).items()),
                               frozenset(product_name(r) for r in requests), sizes, size,
                               _invalid(sizes, len(members) + len(self.running), size))
        return self.memo

    @property
    def key(self) -> GroupKey:
        return (self.namespace, self.name)

    @property
    def entry(self) -> str:
        return entry_id(self.namespace, self.name)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def present(self) -> int:
        """Members known: waiting and running."""
        return len(self.waiting) + len(self.running)

    def sizes(self) -> dict[int, int]:
        """Declared size -> how many members declared it."""
        return dict(self.facts().sizes)

    @property
    def size(self) -> int:
        """The size its members declare (the most common one when they disagree, the largest of those)."""
        return self.facts().size

    def invalid(self) -> str | None:
        """Why the group can never start as it is; None when it is valid."""
        return self.facts().invalid

    @property
    def complete(self) -> bool:
        """Valid, with every member known: the waiting ones can be placed."""
        f = self.facts()
        return f.invalid is None and len(f.members) + len(self.running) == f.size and bool(f.members)

    def members(self) -> list[WaitingClaim]:
        """The waiting members, in arrival order."""
        return list(self.facts().members)

    def requests(self) -> tuple[Request, ...]:
        """The waiting members' requests, in arrival order."""
        return self.facts().requests

    def multiset(self) -> frozenset[tuple[Request, int]]:
        """The waiting members' requests, counted (groups of the same members have the same one)."""
        return self.facts().multiset

    @property
    def priority(self) -> int:
        """The group's priority: its least urgent waiting member's (no member goes sooner than its own)."""
        return min((w.priority for w, _ in self.waiting.values()), default=0)

    def entry_claim(self) -> WaitingClaim:
        """The group's one entry in the waiting order (it must have a waiting member)."""
        members = self.members()
        first = members[0].request
        products = {product_name(w.request) for w in members}
        product = products.pop() if len(products) == 1 else "mixed"
        if self.complete:
            shape = GroupRequest(first.milli, first.memory_mib, first.count, first.model, product,
                                 members=self.multiset())
        else:
            shape = GroupRequest(first.milli, first.memory_mib, first.count, first.model, product,
                                 group=self.entry)
        return WaitingClaim(self.entry, self.namespace, shape, arrived_at=self.arrived_at, priority=self.priority)


def _invalid(sizes: dict[int, int], present: int, size: int) -> str | None:
    """Why a group whose members declare ``sizes`` can never start as it is; None when it is valid."""
    if len(sizes) > 1:
        said = ", ".join(f"{n} say {s}" for s, n in sorted(sizes.items(), key=lambda x: (-x[1], x[0])))
        return f"its members disagree on the group's size ({said}); delete the odd ones or fix their annotation"
    if present > size:
        return (f"{present} pods are members of a group of {size}; delete the extra ones, or raise "
                "gpuslice.io/pod-group-size on every member")
    return None


class GroupBook:
    """Every pod group the queue knows, by (namespace, name), by member and by entry id."""

    def __init__(self) -> None:
        self._groups: dict[GroupKey, Group] = {}
        self._member: dict[str, GroupKey] = {}  # member claim -> its group
        self._entry: dict[str, GroupKey] = {}  # entry id -> its group
        self._waiting = 0  # waiting members, every group
        self._lined: set[GroupKey] = set()  # groups with a waiting member: those with an entry in line

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Iterator[Group]:
        return iter(self._groups.values())

    def __contains__(self, member: object) -> bool:
        return member in self._member

    def of(self, member: str) -> Group | None:
        """The group of ``member`` (waiting or running); None for a claim of no group."""
        key = self._member.get(member)
        return self._groups.get(key) if key is not None else None

    def by_entry(self, entry: str) -> Group | None:
        """The group whose entry id is ``entry``."""
        key = self._entry.get(entry)
        return self._groups.get(key) if key is not None else None

    def get(self, namespace: str, name: str) -> Group | None:
        return self._groups.get((namespace, name))

    def waiting_members(self) -> int:
        """Members that wait, in every group."""
        return self._waiting

    def lined(self) -> int:
        """Groups with a waiting member (each has one entry in the waiting order)."""
        return len(self._lined)

    def waiting_groups(self) -> Iterator[Group]:
        """The groups with a waiting member."""
        return (self._groups[k] for k in self._lined)

    def _count(self, group: Group, before: int) -> None:
        """Keep the counts after ``group``'s members changed (its waiting ones went from ``before`` to what
        they are), and drop its memoised figures."""
        group.memo = None
        after = len(group.waiting)
        self._waiting += after - before
        if after:
            self._lined.add(group.key)
        else:
            self._lined.discard(group.key)

    def _group(self, namespace: str, tag: MemberOf, arrived_at: float, seq: int) -> Group:
        key = (namespace, tag.name)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(namespace, tag.name, arrived_at, seq)
            self._entry[group.entry] = key
        elif (arrived_at, seq) < (group.arrived_at, group.seq):
            group.arrived_at, group.seq = arrived_at, seq
        return group

    def wait(self, claim: WaitingClaim, seq: int) -> Group:
        """``claim`` (a member, not known yet) waits in its group, as the ``seq``-th arrival."""
        assert claim.group is not None and claim.claim not in self._member
        group = self._group(claim.namespace, claim.group, claim.arrived_at, seq)
        before = len(group.waiting)
        group.waiting[claim.claim] = (claim, seq)
        self._member[claim.claim] = group.key
        self._count(group, before)
        return group

    def replace(self, claim: WaitingClaim) -> Group:
        """A waiting member's claim changed (its priority): keep its place."""
        group = self.of(claim.claim)
        assert group is not None and claim.claim in group.waiting
        group.waiting[claim.claim] = (claim, group.waiting[claim.claim][1])
        group.memo = None
        return group

    def run(self, member: str, namespace: str, tag: MemberOf, started_at: float, seq: int) -> Group:
        """``member`` holds its slice: admitted from its group's waiting members, or recorded as
        running (rebuilt from the API)."""
        group = self.of(member)
        if group is None:
            group = self._group(namespace, tag, started_at, seq)
            self._member[member] = group.key
        before = len(group.waiting)
        group.waiting.pop(member, None)
        group.running[member] = tag.size
        self._count(group, before)
        return group

    def back(self, claim: WaitingClaim, seq: int) -> Group:
        """A running member (admitted, never bound) waits again, at its old place."""
        group = self.of(claim.claim)
        assert group is not None and claim.claim in group.running
        before = len(group.waiting)
        del group.running[claim.claim]
        group.waiting[claim.claim] = (claim, seq)
        self._count(group, before)
        return group

    def leave(self, member: str) -> Group | None:
        """``member`` is gone (deleted, ended): out of its group; the group is forgotten once empty.
        Returns the group (still the caller's to re-enter in line), None when it was no member."""
        key = self._member.pop(member, None)
        if key is None:
            return None
        group = self._groups[key]
        before = len(group.waiting)
        group.waiting.pop(member, None)
        group.running.pop(member, None)
        self._count(group, before)
        if not group.present:
            del self._groups[key]
            del self._entry[group.entry]
        return group

    def verify(self) -> None:
        """Recompute the indexes from the groups; AssertionError names the first mismatch."""
        members: dict[str, GroupKey] = {}
        for key, g in self._groups.items():
            assert key == g.key, f"group {g.label} filed under {key}"
            assert g.present > 0, f"group {g.label} is empty"
            assert self._entry.get(g.entry) == key, f"group {g.label}: entry index drifted"
            assert not set(g.waiting) & set(g.running), f"group {g.label}: a member both waits and runs"
            for m in (*g.waiting, *g.running):
                assert m not in members, f"member {m} in two groups"
                members[m] = key
            for m, (w, _) in g.waiting.items():
                assert w.claim == m and w.namespace == g.namespace and w.group is not None \
                    and w.group.name == g.name, f"group {g.label}: member {m} drifted"
            if g.memo is not None:
                kept, g.memo = g.memo, None
                assert g.facts() == kept, f"group {g.label}: stale memoised figures"
            if g.waiting:
                first = min((w.arrived_at, s) for w, s in g.waiting.values())
                assert (g.arrived_at, g.seq) <= first, f"group {g.label}: its place is behind a member's"
        assert members == self._member, "member index drifted"
        assert self._waiting == sum(len(g.waiting) for g in self._groups.values()), "waiting count drifted"
        assert self._lined == {k for k, g in self._groups.items() if g.waiting}, "lined groups drifted"
        assert set(self._entry.values()) == set(self._groups), "entry index drifted"
