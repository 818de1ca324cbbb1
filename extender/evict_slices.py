"""``gpuslice slices --evict``: evict every pod that uses gpuslice, wait until they are gone, and name
those that stay, each with why, so that the uninstall that follows (the chart's pre-delete hook with
``uninstall.evictPods``) strands none.

Eviction, not deletion: PodDisruptionBudgets apply (429 while one forbids it: retried until the
timeout), and each eviction names the pod's uid, so a pod re-created under the same name is left
alone (409) and found by the listing at the end. Waiting until the evicted pods are gone matters: the
kubelet removes a pod asking by DRA claim only once the agent, still running, has unprepared its
claim. A pod already terminating is waited for, not evicted again. What stays is what the listing
at the end still finds: re-created by its controller, held by a budget, or still terminating.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from extender.slices import Use
from packing.kube.client import KubeError, Obj

RETRY_EVERY = 2.0  # seconds between rounds: evictions a budget refused are retried, evicted pods looked up
REMIND_EVERY = 15.0  # seconds between progress lines while nothing changes


class Evictor(Protocol):
    def get_pod(self, namespace: str, name: str) -> Obj | None: ...

    def evict_pod(self, namespace: str, name: str, uid: str) -> None: ...


@dataclass
class Tracked:
    """One pod found at the start and what became of it.

    ``state``: ``retry`` (not evicted yet: a budget forbade it, or the API failed for now), ``evicted``
    (waiting until it is gone), ``gone``, or ``refused`` (the API refused for good: 403, 422, ...).
    """

    use: Use
    state: str = "retry"
    message: str = ""  # the API's last word on an eviction that did not happen
    blocked: bool = False  # a PodDisruptionBudget forbade it (429)


def _say(line: str) -> None:
    print(f"gpuslice slices: {line}", flush=True)  # a Job's log: each line as it happens


def _attempt(kube: Evictor, t: Tracked, say: Callable[[str], None]) -> None:
    u = t.use
    try:
        kube.evict_pod(u.namespace, u.name, u.uid)
    except KubeError as e:
        t.message = str(e)
        if e.status == 404:
            t.state = "gone"
            say(f"{u.key} is gone already")
        elif e.status == 409 and not _same_pod(kube, u):
            t.state = "gone"  # the uid precondition failed: that pod is gone, another of its name came
            say(f"{u.key} is gone already (a new pod of that name came: listed at the end if it uses gpuslice)")
        elif e.status == 429:
            if not t.blocked:
                say(f"{u.key}: a PodDisruptionBudget forbids evicting it for now ({e}); retrying")
            t.blocked = True
        elif e.status in (0, 409) or e.status >= 500:
            pass  # not reached, a conflict, a server error: for now; retried
        else:
            t.state = "refused"
            say(f"{u.key}: the eviction was refused: {e}")
        return
    t.state = "evicted"
    say(f"evicted {u.key} ({u.state}, {u.how}, node {u.node})")


def _same_pod(kube: Evictor, u: Use) -> bool:
    """Whether the pod of ``u``'s uid is still there (True when that cannot be read now)."""
    try:
        pod = kube.get_pod(u.namespace, u.name)
    except KubeError:
        return True
    return pod is not None and (pod.get("metadata") or {}).get("uid") == u.uid


def evict(kube: Evictor, listing: Callable[[], list[Use]], timeout: float, *,
          say: Callable[[str], None] = _say, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> list[tuple[Use, str]]:
    """Evict what ``listing`` finds, wait until it is gone (at most ``timeout`` seconds), then list again:
    the pods that still use gpuslice, each with why it stays (empty: none). KubeError when listing fails."""
    deadline = clock() + timeout
    tracked = {u.uid: Tracked(u) for u in listing()}
    say(f"evicting {len(tracked)} pod(s) that use gpuslice (waiting at most {timeout:g} s until they are gone)")
    for t in tracked.values():
        if t.use.state == "terminating":
            t.state = "evicted"  # deleted already: waited for, not evicted again
            say(f"{t.use.key} is terminating already")
    shown: tuple[str, ...] = ()
    reminded = clock()
    while True:
        for t in tracked.values():
            if t.state == "retry":
                _attempt(kube, t, say)
            if t.state == "evicted" and not _same_pod(kube, t.use):
                t.state = "gone"
                say(f"{t.use.key} is gone")
        waiting = tuple(sorted(t.use.key for t in tracked.values() if t.state in ("retry", "evicted")))
        if not waiting or clock() >= deadline:
            break
        if waiting != shown or clock() - reminded >= REMIND_EVERY:
            say(f"waiting for {len(waiting)} pod(s): {', '.join(waiting)}")
            shown, reminded = waiting, clock()
        sleep(min(RETRY_EVERY, max(0.0, deadline - clock())))
    return [(u, _why(u, tracked.get(u.uid), timeout)) for u in listing()]


def _why(u: Use, t: Tracked | None, timeout: float) -> str:
    """Why ``u`` still uses gpuslice after the eviction, and what to do."""
    if t is None or t.state == "gone":  # a pod that was not there when the eviction began
        if u.controller:
            return f"re-created by its controller {u.controller}: scale it down or delete it"
        return "created while the eviction ran: delete it, or stop what creates it"
    if t.state == "retry" and t.blocked:
        return f"a PodDisruptionBudget forbids evicting it ({t.message}): relax the budget, or delete the pod"
    if t.state in ("retry", "refused"):
        return f"its eviction failed ({t.message})"
    return (f"still terminating after {timeout:g} s (its grace period, a finalizer, or a node that does not "
            "answer): wait, or raise the timeout")


def left_after_eviction(left: Sequence[tuple[Use, str]], timeout: float) -> str:
    """What --evict says when pods stay: every one by name, how it uses gpuslice, and why it stays."""
    listed = "; ".join(f"{u.key} ({u.state}, {u.how}): {why}" for u, why in left)
    return (f"gpuslice: uninstall refused: after evicting for up to {timeout:g} s, {len(left)} pod(s) still use "
            f"gpuslice: {listed}. Removing gpuslice now would strand them (a pod asking by DRA claim could not "
            "finish terminating, a waiting one would never start). Once `gpuslice slices -A` lists none, "
            "uninstall again; `helm uninstall --no-hooks` removes gpuslice anyway and strands them.")
