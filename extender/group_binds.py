"""Binds of a pod group's members wait for each other: the extender's stand-in for a Permit barrier.

An extender has no Permit hook: kube-scheduler calls bind for each member on its own, in its
asynchronous binding cycle. The queue admits a group only whole (every member reserved in one
step, gates lifted together), and here each member's bind waits, up to ``wait_s``, until every
member the queue admitted has reached bind (or is bound already); then all go on at once. So the
members are bound together, and a member kube-scheduler cannot place (another plugin refuses every
node for it) binds none of them: the others' binds answer an error, kube-scheduler retries them
with backoff, and if the group is still not bound by its reservations' deadline (the group ready
timeout) the queue releases them all and the group waits again at its place.

A waiting bind holds one of the extender's bind threads (``--bind-threads``), so the webhook refuses
groups larger than those threads. Thread-safe: ``arrive`` and ``leave`` run under the state's lock,
the wait outside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from packing.group_book import Group, GroupKey


@dataclass(slots=True)
class _Barrier:
    arrived: set[str] = field(default_factory=set)
    opened: threading.Event = field(default_factory=threading.Event)


class GroupBinds:
    """The bind barriers of the groups whose members are being bound."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._barriers: dict[GroupKey, _Barrier] = {}

    def arrive(self, uid: str, group: Group, bound: Callable[[str], bool]) -> threading.Event:
        """Member ``uid`` of ``group`` reached bind: its barrier (set once every admitted member of the
        group has arrived or is bound). Caller holds the state's lock."""
        barrier = self._barriers.setdefault(group.key, _Barrier())
        barrier.arrived.add(uid)
        if all(m in barrier.arrived or bound(m) for m in group.running):
            barrier.opened.set()
            del self._barriers[group.key]  # a later bind of this group (a retry) starts a fresh barrier
        return barrier.opened

    def leave(self, uid: str, group: GroupKey) -> None:
        """``uid``'s bind gave up waiting (caller holds the state's lock)."""
        barrier = self._barriers.get(group)
        if barrier is not None:
            barrier.arrived.discard(uid)
            if not barrier.arrived:
                del self._barriers[group]

    def waiting(self, group: GroupKey) -> int:
        """How many members of ``group`` wait at its barrier now."""
        barrier = self._barriers.get(group)
        return len(barrier.arrived) if barrier is not None else 0
