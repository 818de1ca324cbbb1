"""Why each waiting claim waits: the reasons, their messages, and the one pass that assigns them.

``explain_in_order`` walks the waiting claims once, in queue order. What holds for a whole class of
identical claims (request, namespace, priority) -- unsatisfiable, over its entitlement, fits now or
not, and the capacity message -- is computed once per class by the caller's ``facts``; per claim the
pass only counts positions, asks the admission strategy's lens and builds the explanation.
Cost: O(n) plus one ``facts`` call per class, plus what the admission strategy's ``Lens`` costs
(the aging guard: one fit check per request shape and set of held nodes, one target pick and
estimated start per head).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple, Protocol

from packing.claims import WaitingClaim
from packing.ledger import Gpu, Ledger
from packing.node_fit import NodeConstraints, why_not
from packing.products import Request
from packing.wait_history import WaitLately, WaitSummary

QUOTA_EXCEEDED = "QuotaExceeded"
NO_CAPACITY = "NoCapacity"
WAITING_FOR_RESERVATION = "WaitingForReservation"
BLOCKED_BY_HEAD_OF_LINE = "BlockedByHeadOfLine"
UNSATISFIABLE = "Unsatisfiable"
ADMISSIBLE = "Admissible"  # only when explain runs before admit: the next step starts it
WAITING_FOR_MEMBERS = "WaitingForMembers"  # a pod group with fewer members than its size
INVALID_GROUP = "InvalidGroup"  # a pod group whose members disagree on its size, or too many members
REASONS = (QUOTA_EXCEEDED, NO_CAPACITY, WAITING_FOR_RESERVATION, BLOCKED_BY_HEAD_OF_LINE, UNSATISFIABLE, ADMISSIBLE,
           WAITING_FOR_MEMBERS, INVALID_GROUP)
FITS_NOW = "fits now: the next admission step starts it"
EXPECTED_IN = "expected start in about"  # ``expected_text``; ``gpuslice queue`` reads the duration after it
EXPECTED_LONGER = "waited longer than every recent"


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """The pod group a waiting claim belongs to: its name, the members present (waiting and
    running) and the size they declared."""

    name: str
    present: int
    size: int


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why one claim waits: its place in line, one reason, and what it waits for."""

    claim: str
    namespace: str
    product: str
    position: int
    product_position: int
    reason: str
    message: str
    waited: float
    priority: int = 0
    estimated_start: float | None = None  # WaitingForReservation: when declared ends make it fit
    group: GroupStatus | None = None  # a member of a pod group: the group waits as one (its reason, its place)
    expected_in: float | None = None  # its product's recent waits: the median further wait of those that waited longer
    wait_lately: WaitSummary | None = None  # its product's recent waits (None: too few admitted to say)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (for the pod event/condition and the state endpoint)."""
        return asdict(self)


class ClassFacts(NamedTuple):
    """What holds for every waiting claim of one class now, before the admission strategy's view of it."""

    reason: str  # UNSATISFIABLE, QUOTA_EXCEEDED, ADMISSIBLE or NO_CAPACITY
    message: str
    fit: bool  # a free slice fits it now
    product: str
    nodes: frozenset[str] | None = None  # the nodes its pod may use (None: every node): whom it competes with
    lately: WaitLately | None = None  # its product's recent waits (``packing.wait_history``)


class Lens(Protocol):
    """An admission strategy's view of the claims it holds back, walked once in queue order."""

    def see(self, w: WaitingClaim, fit: bool, message: str) -> tuple[str, str, float | None] | None:
        """For ``w`` -- within its entitlement and satisfiable; ``fit``: a free slice fits it now;
        ``message``: what it needs, or FITS_NOW -- its reason, message and estimated start under the
        strategy, or None when the strategy lets it be (``Admissible`` or ``NoCapacity``)."""


def _explanation_maker() -> Callable[[str, str, str, int, int, str, str, float, int, float | None, float | None,
                                      WaitSummary | None], Explanation]:
    """An ``Explanation(...)`` equivalent that sets the slots directly: the frozen dataclass's
    ``__init__`` goes through ``object.__setattr__`` per field, half of explain's time per claim."""
    assert not hasattr(Explanation, "__post_init__"), "the fast constructor would skip __post_init__"
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = (Explanation.__dict__[f.name].__set__
                                                             for f in fields(Explanation))
    new = object.__new__

    def make(claim: str, namespace: str, product: str, position: int, product_position: int, reason: str,
             message: str, waited: float, priority: int, estimated_start: float | None, expected_in: float | None,
             wait_lately: WaitSummary | None) -> Explanation:
        e: Explanation = new(Explanation)
        s0(e, claim)
        s1(e, namespace)
        s2(e, product)
        s3(e, position)
        s4(e, product_position)
        s5(e, reason)
        s6(e, message)
        s7(e, waited)
        s8(e, priority)
        s9(e, estimated_start)
        s10(e, None)  # group members are explained by the queue, from their group's entry
        s11(e, expected_in)
        s12(e, wait_lately)
        return e

    return make


_make_explanation = _explanation_maker()


def explain_in_order(
    entries: Iterable[tuple[WaitingClaim, object, int]],
    now: float,
    facts: Callable[[WaitingClaim], ClassFacts],
    lens: Lens | None = None,
) -> list[Explanation]:
    """Explain ``entries`` -- (claim, anything, class id), in queue order.

    ``facts(claim)`` is called once per class id; ``lens`` (the admission strategy's, None for
    best effort) is asked about every claim within its entitlement and satisfiable.

    Positions count the claims that compete with it: itself and those ahead of it whose pods may use
    a node it may use (their ``ClassFacts.nodes`` overlap; None is every node). While no claim is
    limited to some nodes that is every claim ahead, 1..n; otherwise one sum over the distinct
    node sets seen so far per claim, each pair's overlap computed once.
    """
    of_class: dict[int, ClassFacts] = {}
    per_product: dict[str, int] = {}
    out: list[Explanation] = []
    append = out.append
    make = _make_explanation
    see = lens.see if lens is not None else None
    limited = False  # has a claim limited to some nodes been met? Then positions count by node set
    by_set: dict[frozenset[str] | None, int] = {}
    by_product_set: dict[str, dict[frozenset[str] | None, int]] = {}
    overlap: dict[tuple[frozenset[str] | None, frozenset[str] | None], bool] = {}
    for ahead, (w, _, cid) in enumerate(entries, start=1):  # ahead: claims so far, this one included
        f = of_class.get(cid)
        if f is None:
            f = of_class[cid] = facts(w)
        reason, message, fit, product, nodes, lately = f
        if nodes is None and not limited:
            position = ahead
            count = per_product[product] = per_product.get(product, 0) + 1
        else:
            if not limited:  # from here on, by node set: everything so far competed for every node
                limited = True
                by_set[None] = ahead - 1
                by_product_set.update({p: {None: k} for p, k in per_product.items()})
            mine = by_product_set.setdefault(product, {})
            position = 1 + sum(k for s, k in by_set.items() if _competes(s, nodes, overlap))
            count = 1 + sum(k for s, k in mine.items() if _competes(s, nodes, overlap))
        if limited:
            by_set[nodes] = by_set.get(nodes, 0) + 1
            mine = by_product_set.setdefault(product, {})
            mine[nodes] = mine.get(nodes, 0) + 1
        est: float | None = None
        if see is not None and reason in (ADMISSIBLE, NO_CAPACITY):
            seen = see(w, fit, message)
            if seen is not None:
                reason, message, est = seen
        waited = now - w.arrived_at
        if waited < 0.0:
            waited = 0.0
        if lately is None:
            append(make(w.claim, w.namespace, product, position, count, reason, message, waited, w.priority, est,
                        None, None))
        else:
            append(make(w.claim, w.namespace, product, position, count, reason, message, waited, w.priority, est,
                        lately.remaining(waited), lately.summary))
    return out


def _competes(a: frozenset[str] | None, b: frozenset[str] | None,
              memo: dict[tuple[frozenset[str] | None, frozenset[str] | None], bool]) -> bool:
    """Do claims limited to node sets ``a`` and ``b`` (None: every node) compete for a node?
    The same set always does (even an empty one: those claims wait for the same thing)."""
    if a is b or a == b:
        return True
    hit = memo.get((a, b))
    if hit is None:
        hit = bool(b if a is None else a) if a is None or b is None else not a.isdisjoint(b)
        memo[(a, b)] = hit
    return hit


def asked(w: WaitingClaim) -> str:
    """A claim's product as a user reads it: ``v100-100``, or ``4 x v100-100`` for a request of four cards."""
    return w.product if w.request.count <= 1 else f"{w.request.count} x {w.product}"


def guard_message(head: WaitingClaim, node: str, now: float, est: float | None, age_limit: float) -> str:
    """What a younger claim that fits only on ``node``, the drain target of ``head``, is told."""
    when = "unknown (running claims declare no time limit)" if est is None else f"in {span(est - now)}"
    return (f"fits only on node {node}: holding node {node} for the head of the line, {head.namespace}/"
            f"{head.claim} ({asked(head)}, waited {span(now - head.arrived_at)}, past its {span(age_limit)} "
            f"limit); a younger claim may start there only with a declared time limit ending by its estimated "
            f"start ({when})")


def starving_message(w: WaitingClaim, node: str, now: float, est: float | None, age_limit: float) -> str:
    """What the aging guard's head is told, after its capacity message."""
    when = "unknown: running claims declare no time limit" if est is None else f"in {span(est - now)}"
    return (f"waited {span(now - w.arrived_at)}, past its {span(age_limit)} limit: holding node {node} for "
            f"it (younger claims start elsewhere, or there only if they end first; estimated start {when})")


def capacity_message(ledger: Ledger, r: Request) -> str:
    """What a claim that does not fit waits for: the slice it needs against the largest free one, on
    the nodes its pod may use (and how many those are, when not every node)."""
    what = f" ({r.product})" if r.product else ""
    allowed = ledger.eligible(r)
    scope = "" if allowed is None else f"; it may use {len(allowed)} of {len(ledger.nodes)} nodes ({_why_scope(r)})"
    if r.gpu_less:
        return f"needs {r.cpu_milli}m CPU and {r.host_memory_mib} MiB RAM on one node; no node has both free{scope}"
    if r.whole and r.count > 1:
        best: tuple[int, str] | None = None
        for node in ledger.nodes.values():
            if allowed is not None and node.name not in allowed:
                continue
            empty = sum(1 for g in node.gpus if g.empty and r.accepts_model(g.model))
            if best is None or empty > best[0]:
                best = (empty, node.name)
        most = f"at most {best[0]} on node {best[1]}" if best else "no nodes"
        return f"needs {r.count} empty cards on one node{what}; {most}{scope}"
    need = "an empty card" if r.whole else f"a {r.milli}-milli slice"
    largest: Gpu | None = None
    for model in ledger.models():
        if r.accepts_model(model):
            g = next((g for g in ledger.gpus_from_largest(model, 0) if allowed is None or g.node in allowed), None)
            if g is not None and (largest is None or g.free_milli > largest.free_milli):
                largest = g
    if largest is None:
        return f"needs {need}{what}; the cluster has no matching GPU{scope}"
    if largest.free_milli >= r.milli:
        return (f"needs {need}{what} with {r.memory_mib} MiB of GPU memory and the node's CPU/RAM; "
                f"no GPU has all of it free{scope}")
    return f"needs {need}{what}; largest free is {largest.free_milli} on node {largest.node}{scope}"


def _why_scope(r: Request) -> str:
    """What limits the nodes a claim may use: its constraints, else the cordons and taints."""
    said = r.constraints.describe() if r.constraints is not None else ""
    return said if said and said != NodeConstraints().describe() else "the others are cordoned or tainted"


def unsatisfiable_message(r: Request, ledger: Ledger | None = None) -> str:
    """Why no node in the cluster could ever hold ``r``: none its pod may use (by labels, taints or
    cordon, counted from ``ledger`` when given), or none large enough."""
    model = r.model or "any"
    if ledger is not None and ledger.nodes and not any(n.allows(r) for n in ledger.nodes.values()):
        counts: dict[str, int] = {}
        for n in ledger.nodes.values():
            why = why_not(r.constraints, n.name, n.facts) or "labels"
            kind = "untolerated taint" if why.startswith("taint") else why
            counts[kind] = counts.get(kind, 0) + 1
        told = {"labels": "do not match its node selector / required node affinity",
                "untolerated taint": "have a NoSchedule/NoExecute taint it does not tolerate",
                "cordoned": "are cordoned"}
        parts = ", ".join(f"{k} {told[w]}" for w, k in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
        asked = f" ({r.constraints.describe()})" if r.constraints is not None else ""
        return (f"{r.describe()} may use none of the {len(ledger.nodes)} GPU nodes{asked}: {parts} "
                "(re-checked when nodes join or change labels, taints or cordon)")
    if r.gpu_less:
        return (f"needs {r.cpu_milli}m CPU and {r.host_memory_mib} MiB RAM; no node is that large "
                "(re-checked when nodes join)")
    cards = f"{r.count} {model} cards" if r.count > 1 else f"a {model} card"
    where = " it may use" if ledger is not None and ledger.eligible(r) is not None else ""
    return (f"{r.describe()} can never fit: no node{where} has {cards} with {r.memory_mib} MiB each and room for "
            f"{r.cpu_milli}m CPU / {r.host_memory_mib} MiB RAM (re-checked when nodes join)")


def span(seconds: float) -> str:
    """A short human duration: 45 s, 12 min, 2.5 h."""
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    return f"{s / 3600:.1f} h"


def drain_message(w: WaitingClaim, where: str, now: float, est: float | None, age_limit: float) -> str:
    """What a drain-soonest head is told, after its capacity message (``where``: the GPUs held)."""
    when = "unknown: the claims there declare no time limit" if est is None else f"by {span(est - now)} from now"
    return (f"waited {span(now - w.arrived_at)}, past its {span(age_limit)} limit: holding {where} for it "
            f"(nothing else starts there unless it ends first; freed, by declared ends, {when})")


def drain_blocked_message(head: WaitingClaim, where: str, now: float, est: float | None, age_limit: float) -> str:
    """What a claim that fits only on ``where``, held for the drain-soonest head ``head``, is told."""
    when = "unknown (the claims there declare no time limit)" if est is None else f"by {span(est - now)} from now"
    return (f"fits only on {where}, held for the head of the line, {head.namespace}/{head.claim} "
            f"({asked(head)}, waited {span(now - head.arrived_at)}, past its {span(age_limit)} limit); a claim "
            f"may start there only with a declared time limit ending before it is freed ({when})")


def front_message(w: WaitingClaim, where: str, now: float, est: float | None, age_limit: float) -> str:
    """What worst-first's front (the one claim capacity is held for) is told, after its capacity message."""
    when = "unknown: the claims there declare no time limit" if est is None else f"by {span(est - now)} from now"
    return (f"the longest-waiting claim (waited {span(now - w.arrived_at)}): holding {where} for it (nothing "
            f"else starts there unless it ends first; freed, by declared ends, {when})")


def steered_message(w: WaitingClaim, where: str, now: float) -> str:
    """What a worst-first head other than the front is told: nothing is held, new work is steered off."""
    return (f"one of the longest-waiting claims (waited {span(now - w.arrived_at)}): new work is kept off "
            f"{where} while it fits elsewhere, so it frees for this claim; held for it once the claims ahead of it "
            "have started")


def front_pending_message(w: WaitingClaim, where: str, now: float, horizon: float) -> str:
    """What worst-first's front is told while its targets steer (the what-if ``within=R``): none likely frees
    within ``horizon`` seconds yet."""
    return (f"the longest-waiting claim (waited {span(now - w.arrived_at)}): new work is kept off {where} while "
            f"it fits elsewhere; held for it once it likely frees within {span(horizon)}")


def front_blocked_message(head: WaitingClaim, where: str, now: float, est: float | None, age_limit: float) -> str:
    """What a claim that fits only on the GPUs held for worst-first's front ``head`` is told."""
    when = "unknown (the claims there declare no time limit)" if est is None else f"by {span(est - now)} from now"
    return (f"fits only on {where}, held for the longest-waiting claim, {head.namespace}/{head.claim} "
            f"({asked(head)}, waited {span(now - head.arrived_at)}); a claim may start there only with a "
            f"declared time limit ending before it is freed ({when})")


def untargeted_message(targets: int, clock: float | None, front_share: int | None = None,
                       spare: int | None = None, behind: tuple[str, float] | None = None, own: bool = False,
                       unsure: bool = False) -> str:
    """Why, under worst-first, a claim that fits nowhere has no drain target, and why younger claims of other
    products may start before it: ``clock`` is the hold clock it has not reached yet (several cards), else
    ``own``: the claims asking for its GPUs hold only the front's own target (host CPU, memory and node
    constraints aside: ``packing.admission.drain_soonest.gpu_ask``), or ``front_share`` the share of GPUs they
    already hold for the longer-waiting of them (``spare``: fewer, the GPUs the cluster has had spare lately;
    ``behind``: only the front's own, while that product's recent p99 wait is longer than theirs), else
    ``targets`` is how many longer-waiting claims have targets. ``unsure`` (with ``own``): they would hold more
    were the front's GPUs freed by declared runtimes."""
    if clock is not None and math.isinf(clock):
        return "claims that need less start first where they fit; claims of several cards get no drain target here"
    if clock is not None:
        return (f"claims that need less start first where they fit; it gets a drain target once it has waited "
                f"{span(clock)}, longer than every other product's recent p99 wait")
    only_own = ("claims that need less start first where they fit; claims asking for the same GPUs hold only the "
                "longest-waiting one's drain target")
    if own and unsure:
        return f"{only_own} until the pods on its GPUs declare runtimes"
    if own:
        return only_own
    if front_share is not None and behind is not None:
        return f"{only_own} while {behind[0]} waits longer lately (p99 {span(behind[1])})"
    if front_share is not None and spare is not None:
        return (f"claims that need less start first where they fit; the drain targets of claims asking for the same "
                f"GPUs, at most the {spare} GPUs the cluster has had spare lately (one GPU in {front_share} at most), "
                f"go to longer-waiting ones")
    if front_share is not None:
        return (f"claims that need less start first where they fit; the drain targets of claims asking for the same "
                f"GPUs, one GPU in {front_share} at most, go to longer-waiting ones")
    ahead = f"{targets} longer-waiting claims have them" if targets else "none is free for it"
    return f"claims that need less start first where they fit; drain targets go to the longest-waiting claims ({ahead})"


def expected_text(e: Explanation) -> str:
    """What a waiting claim is told of its product's recent waits (empty when too few were admitted to say):
    ``expected start in about 5 min; v100-50 lately: median 2 min, p90 10 min``. Durations are rounded to
    ``about``'s steps, so the text (a pod condition) changes only when an estimate moves a step."""
    lately = e.wait_lately
    if lately is None:
        return ""
    said = f"{lately.kind} lately: median {about(lately.median)}, p90 {about(lately.p90)}"
    if e.expected_in is None:
        return f"{EXPECTED_LONGER} {lately.kind} claim; {said}"
    return f"{EXPECTED_IN} {about(e.expected_in)}; {said}"


_STEPS = ((60, "1 min"), (120, "2 min"), (300, "5 min"), (600, "10 min"), (900, "15 min"), (1200, "20 min"),
          (1800, "30 min"), (2700, "45 min"), (3600, "1 h"), (5400, "1.5 h"), (7200, "2 h"), (10800, "3 h"),
          (14400, "4 h"), (21600, "6 h"), (28800, "8 h"), (43200, "12 h"), (86400, "1 d"), (172800, "2 d"))


def about(seconds: float) -> str:
    """A rough duration: the nearest of a few steps on a log scale (under a minute, 1, 2, 5, 10, 15, 20, 30,
    45 min, 1, 1.5, 2, 3, 4, 6, 8, 12 h, 1, 2 d); what an estimate can honestly say."""
    if seconds < 30:
        return "under a minute"
    if seconds > 1.5 * _STEPS[-1][0]:
        return f"more than {_STEPS[-1][1]}"
    return min(_STEPS, key=lambda step: abs(math.log(seconds / step[0])))[1]
