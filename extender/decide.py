"""The extender's decisions as pure functions of the ledger: filter, score and plan a bind.

Each returns a typed outcome (an enum code plus a message) that the state applies; none of them
changes anything. The codes name the metric labels and the reasons kube-scheduler shows, so no
code is ever parsed back out of a message.

* ``filter_nodes``: where the request fits now; in ``strict`` mode only the nodes tying for the
  policy's best exact key (kube-scheduler breaks score ties at random, which would undo the
  packer's choice), with the slice to reserve on one of them;
* ``score_nodes``: 0..10 per fitting node from the same keys (``Policy.scores`` semantics);
* ``plan_bind``: what a bind of the pod on the scheduler's node means: a repeat, a refusal, the
  reservation to commit, or the GPU(s) the policy picks there.

``PolicyUse`` is the one place the extender obtains its placement policy and learns what it may
assume about it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from packing.ledger import Allocation, Ledger
from packing.mix_estimator import catalog_prior
from packing.policies import NodeKey, Policy, policy_for, scale_scores
from packing.products import Catalog, Request

if TYPE_CHECKING:
    from extender.fitcache import ShapeView
    from packing.asks import PodAsk

MODES = ("strict", "cooperative")
REASON_HEAD = "gpuslice "


class Code(StrEnum):
    """Why a node fails a pod (filter), stable and without numbers: kube-scheduler aggregates reasons."""

    UNKNOWN_NODE = "UnknownNode"
    INVALID_INVENTORY = "InvalidInventory"
    NO_MATCHING_GPU = "NoMatchingGPU"
    TOO_LARGE = "TooLarge"
    WITHDRAWN = "Withdrawn"
    NOT_ENOUGH_WHOLE_GPUS = "NotEnoughWholeGPUs"
    NO_SLICE_FREE = "NoSliceFree"
    NO_GPU_MEMORY_FREE = "NoGPUMemoryFree"
    INSUFFICIENT_CPU = "InsufficientCPU"
    INSUFFICIENT_MEMORY = "InsufficientMemory"
    ALREADY_BOUND = "AlreadyBound"
    REFUSED = "Refused"
    WAITING_FOR_GROUP = "WaitingForGroup"  # a pod group's member the queue has not admitted with its group
    NOT_BEST_FIT = "NotBestFit"  # fits, but another node is better: left out, not failed
    OTHER = "Other"  # a misfit code the ledger added that this table does not know yet

    @classmethod
    def of(cls, text: str) -> Code:
        try:
            return cls(text)
        except ValueError:
            return cls.OTHER


def reason_for(code: Code, request: Request, raw: str = "") -> str:
    """A short, stable per-node reason (no numbers: kube-scheduler aggregates identical reasons);
    ``raw``: the ledger's own code, shown for one this table does not know."""
    if code is Code.OTHER and raw:
        return f"{REASON_HEAD}{raw}: {raw}"
    what = request.describe()
    text = {
        Code.UNKNOWN_NODE: "node has no GPUs gpuslice knows of",
        Code.NO_MATCHING_GPU: f"no {request.model or 'matching'} GPU on this node",
        Code.TOO_LARGE: f"{what} is larger than this node's GPUs",
        Code.WITHDRAWN: "the GPUs that could hold it are withdrawn (gone from the node or unhealthy)",
        Code.NOT_ENOUGH_WHOLE_GPUS: f"not enough free whole GPUs for {what}",
        Code.NO_SLICE_FREE: f"no free {what} slice on any GPU",
        Code.NO_GPU_MEMORY_FREE: f"not enough free GPU memory for {what} on any GPU",
        Code.INSUFFICIENT_CPU: "not enough CPU",
        Code.INSUFFICIENT_MEMORY: "not enough memory",
        Code.ALREADY_BOUND: "pod is already bound to another node",
    }.get(code, code.value)
    return f"{REASON_HEAD}{code.value}: {text}"


@dataclass(frozen=True, slots=True)
class FitNote:
    """Whether a request fits on one node now: ``code`` None means it fits (with the policy's key)."""

    code: Code | None
    reason: str = ""
    resolvable: bool = True  # could freeing capacity help?
    key: NodeKey | None = None


UNKNOWN = FitNote(Code.UNKNOWN_NODE, f"{REASON_HEAD}UnknownNode: node has no GPUs gpuslice knows of", False)


@dataclass(frozen=True, slots=True)
class PolicyUse:
    """The placement policy and what the extender may assume about it."""

    policy: Policy
    node_local: bool  # a node's key reads that node alone: keys may be cached per node
    indexed_best: bool  # ``best_nodes`` is a logarithmic look-up (``Capabilities.indexed``): cheaper than cached keys
    view_keys: bool = False  # the fit views cache each node's key (a policy with a KeyIndex keeps its own)

    @classmethod
    def named(cls, name: str, catalog: Catalog | None = None) -> PolicyUse:
        """The one place the extender obtains its policy (ValueError for an unknown name): an instance of
        its own, whose mix estimator starts from ``catalog``'s products; what it may assume comes from
        the policy's declared capabilities."""
        policy = policy_for(name, prior=catalog_prior(catalog) if catalog is not None else ())
        caps = policy.capabilities
        node_local = caps.node_local and not caps.sampled
        return cls(policy, node_local, node_local and caps.indexed, node_local and not caps.key_index)


# ---- filter ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class FilterDecision:
    """Which nodes pass, why the others fail, and the slice to reserve (strict mode)."""

    passing: list[str]
    failed: dict[str, str] = field(default_factory=dict)  # freeing capacity could help
    unresolvable: dict[str, str] = field(default_factory=dict)
    codes: Counter[Code] = field(default_factory=Counter)  # code -> node count
    reserve: tuple[str, tuple[str, ...]] | None = None  # (node, GPUs)

    @property
    def waits(self) -> bool:
        return not self.passing


def refused_everywhere(names: Sequence[str], refusal: str) -> FilterDecision:
    """A pod gpuslice refuses fails every node, unresolvably, with the refusal as its reason."""
    reason = f"{REASON_HEAD}{Code.REFUSED.value}: {refusal}"
    return FilterDecision([], {}, dict.fromkeys(names, reason), Counter({Code.REFUSED: len(set(names))}))


def group_waits(names: Sequence[str]) -> FilterDecision:
    """A pod group's member without a reservation: the queue places it only with its whole group, so
    every node fails it for now (resolvable: the group's admission reserves one)."""
    reason = (f"{REASON_HEAD}{Code.WAITING_FOR_GROUP.value}: a pod group's member starts only with its whole group, "
              "when the queue admits the group")
    return FilterDecision([], dict.fromkeys(names, reason), {}, Counter({Code.WAITING_FOR_GROUP: len(set(names))}))


def group_refused(names: Sequence[str]) -> FilterDecision:
    """A pod group's member where no queue admits groups (standalone): it never starts, and says why."""
    return refused_everywhere(names, "pod groups (gpuslice.io/pod-group) need the cluster's queue gate; "
                                     "standalone gpuslice places pods one by one")


def bound_elsewhere(names: Sequence[str], node: str, request: Request) -> FilterDecision:
    """A pod already bound passes only its own node."""
    failed = {n: reason_for(Code.ALREADY_BOUND, request) for n in names if n != node}
    return FilterDecision([node] if node in names else [], failed, {},
                          Counter({Code.ALREADY_BOUND: len(failed)}) if failed else Counter())


def filter_nodes(
    ledger: Ledger,
    view: ShapeView,
    unknown: Callable[[str], FitNote],
    use: PolicyUse,
    request: Request,
    names: Sequence[str],
    strict: bool,
    prefer: str | None = None,
) -> FilterDecision:
    """Where ``request`` may go among ``names`` now, with a reason for every other node.

    ``view`` is the fit view of ``request`` over the ledger as if the pod held nothing; ``unknown``
    explains a node the ledger does not hold; ``prefer``: the node of the pod's own reservation,
    kept while it is among the best.
    """
    candidates = set(names)
    fitting = view.fits & candidates  # set algebra: no per-node work for the nodes that fit
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    codes: Counter[Code] = Counter()
    notes = view.notes
    for name in candidates - fitting:
        note = notes.get(name) or unknown(name)
        (failed if note.resolvable else unresolvable)[name] = note.reason
        codes[note.code or Code.OTHER] += 1
    if fitting and strict:
        best = best_nodes(ledger, view, use, request, fitting)
        target = prefer if prefer is not None and prefer in best else best[0]
        gpus = use.policy.pick(ledger, request, target)
        assert gpus is not None, "a best node must fit"
        if len(best) < len(fitting):
            # the other fitting nodes are left out, not failed: the pod fits there, so they
            # explain nothing, and listing thousands of them would dominate the reply's cost
            codes[Code.NOT_BEST_FIT] = len(fitting) - len(best)
        return FilterDecision(best, failed, unresolvable, codes, (target, gpus))
    passing = [n for n in names if n in fitting]  # the scheduler's order
    if len(passing) > len(fitting):  # a name sent twice is answered once
        passing = list(dict.fromkeys(passing))
    return FilterDecision(passing, failed, unresolvable, codes)


def best_nodes(ledger: Ledger, view: ShapeView, use: PolicyUse, request: Request, fitting: set[str]) -> list[str]:
    """The fitting nodes tying for the policy's best exact key, in stable node order."""
    if use.indexed_best or not use.view_keys:
        return use.policy.best_nodes(ledger, request, fitting)
    keys = {n: view.notes[n].key for n in fitting}
    best = min(k for k in keys.values() if k is not None)
    return sorted((n for n, k in keys.items() if k == best), key=lambda n: ledger.nodes[n].order)


def waiting_summary(request: Request, codes: Mapping[Code, int], total: int) -> str:
    """One line for the queue: why the pod fits on none of the nodes it was offered."""
    if total == 0:
        return f"{request.describe()} fits nowhere: no candidate nodes"
    parts = ", ".join(f"{c.value} on {n}" for c, n in sorted(codes.items(), key=lambda x: (-x[1], x[0].value)))
    return f"{request.describe()} fits on none of {total} node(s): {parts}"


# ---- prioritize ------------------------------------------------------------------------------------


def score_nodes(ledger: Ledger, view: ShapeView, use: PolicyUse, request: Request,
                names: Collection[str]) -> dict[str, int]:
    """0..10 per node where ``request`` fits (10: the best key), from the ledger as if the pod held nothing."""
    if use.view_keys:
        fits, notes = view.fits, view.notes
        keys: dict[str, NodeKey] = {n: k for n in names if n in fits and (k := notes[n].key) is not None}
        return scale_scores(keys)
    if use.node_local:  # the policy's own KeyIndex: a look-up per node
        return scale_scores(use.policy.keys(ledger, request, [n for n in names if n in view.fits]))
    return {n: s for n, s in use.policy.scores(ledger, request, names).items() if s}


# ---- bind --------------------------------------------------------------------------------------------


class BindCode(StrEnum):
    """What a bind came to: the metric label of every bind outcome."""

    BOUND = "Bound"
    REPEAT = "Repeat"  # bound here already: nothing changes
    UNMANAGED = "Unmanaged"  # the pod asks for no slice: bound without one
    ALREADY_BOUND = "AlreadyBound"
    UNKNOWN_POD = "UnknownPod"
    REFUSED = "Refused"
    UNKNOWN_NODE = "UnknownNode"
    NO_FIT = "NoFit"
    IN_FLIGHT = "InFlight"
    BINDER_FAILED = "BinderFailed"
    GROUP_INCOMPLETE = "GroupIncomplete"  # a pod group's member waited for the rest of its group in vain

    @property
    def ok(self) -> bool:
        return self in (BindCode.BOUND, BindCode.REPEAT, BindCode.UNMANAGED)


class BindStep(StrEnum):
    """What the state does to make a planned bind real."""

    NOTHING = "nothing"  # an answer already (repeat or refusal)
    BINDER_ONLY = "binder-only"  # no slice: the binder binds it as it is
    COMMIT = "commit"  # the reservation is on this node: keep its GPUs
    PLACE = "place"  # put the slice on ``gpus`` of the node (releasing a reservation elsewhere)


@dataclass(frozen=True, slots=True)
class BindPlan:
    code: BindCode
    message: str = ""
    step: BindStep = BindStep.NOTHING
    request: Request | None = None
    gpus: tuple[str, ...] = ()


def plan_bind(
    ledger: Ledger, use: PolicyUse, pod_key: str, uid: str, node: str, bound_to: str | None,
    ask: PodAsk | None, held: Allocation | None,
) -> BindPlan:
    """What binding pod ``uid`` to ``node`` means now, given where it is bound, what it asked for, what it holds."""
    if bound_to == node:
        return BindPlan(BindCode.REPEAT)
    if bound_to is not None:
        return BindPlan(BindCode.ALREADY_BOUND, f"pod {pod_key} is already bound to node {bound_to}")
    if ask is None and held is None:
        return BindPlan(BindCode.UNKNOWN_POD,
                        f"gpuslice has not seen pod {pod_key} (uid {uid}) in a filter call; cannot bind it")
    if ask is not None and ask.refusal is not None:
        return BindPlan(BindCode.REFUSED, f"gpuslice refuses pod {pod_key}: {ask.refusal}")
    request = held.request if held is not None else (ask.request if ask is not None else None)
    if request is None:
        return BindPlan(BindCode.UNMANAGED, step=BindStep.BINDER_ONLY)
    if node not in ledger.nodes:
        return BindPlan(BindCode.UNKNOWN_NODE, f"node {node} is not known to gpuslice (no GPUs in its view)",
                        request=request)
    if held is not None and held.node == node:
        return BindPlan(BindCode.BOUND, step=BindStep.COMMIT, request=request, gpus=held.gpus)
    gpus = use.policy.pick(ledger, request, node)  # a reservation elsewhere holds nothing on this node
    if gpus is None:
        misfit = ledger.explain(request, node)
        why = misfit.message if misfit is not None else "does not fit"
        return BindPlan(BindCode.NO_FIT, f"{request.describe()} no longer fits on node {node}: {why}",
                        request=request)
    return BindPlan(BindCode.BOUND, step=BindStep.PLACE, request=request, gpus=gpus)
