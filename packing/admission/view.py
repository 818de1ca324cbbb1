"""What an admission strategy sees and does in one step: the ``AdmissionView``, and the ``Strategy``
interface every strategy module implements.

A strategy is ``step(view) -> admissions``: it walks the waiting order (``view.walk()``), asks the
placement policy where a claim fits among the nodes its pod may use (``view.choose``), and admits
(``view.admit``), which takes effect at once -- the ledger is assigned, the claim leaves the waiting
order and enters the running book -- so the rest of the step sees it. Everything a strategy keeps
between steps (drain targets) lives in the strategy object; the view lives for one step.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from packing.claims import Admission, WaitingClaim
from packing.explain import Lens
from packing.ledger import Allocation, Ledger
from packing.policies import Choice, Policy
from packing.products import Request
from packing.running_book import RunningBook, RunningClaim
from packing.wait_history import kind_of
from packing.waiting_order import ClaimClass, Key, WaitingOrder, Walk


class AdmissionView:
    """One admission step at ``now`` over the queue's waiting order, running book and ledger."""

    def __init__(self, now: float, ledger: Ledger, policy: Policy, order: WaitingOrder, book: RunningBook,
                 reservation_ttl: float | None, satisfiable: Callable[[Request], bool],
                 age_limit: Callable[[str, Request], float]) -> None:
        self.now = now
        self.ledger = ledger
        self.policy = policy
        self.order = order
        self.book = book
        self.reservation_ttl = reservation_ttl
        self.slack = reservation_ttl or 0.0  # a reservation's TTL adds to a declared limit: it ends that late
        self.satisfiable = satisfiable  # could some node, empty, hold the request?
        self._age_limit = age_limit

    def walk(self) -> Walk:
        return self.order.walk()

    def claim_at(self, key: Key) -> WaitingClaim:
        return self.order.claim_at(key)

    def over_entitlement(self, cls: ClaimClass) -> bool:
        """Would one more claim of ``cls`` take its namespace over its entitlement?"""
        return self.book.over_entitlement(cls.namespace, cls.shape)

    def age_limit(self, product: str, request: Request) -> float:
        """T of ``product`` (requests like ``request``): its aging clock."""
        return self._age_limit(product, request)

    def limit_of(self, claim: WaitingClaim) -> float:
        """T of ``claim``'s product."""
        return self._age_limit(claim.product, claim.request)

    def starving(self, claim: WaitingClaim) -> bool:
        """Has ``claim`` waited longer than its product's age limit?"""
        return self.now - claim.arrived_at > self.limit_of(claim)

    def choose(self, request: Request, nodes: Collection[str] | None = None) -> Choice | None:
        """Where the placement policy puts ``request`` now, on a node its pod may use (one of
        ``nodes`` when given)."""
        return choose_allowed(self.policy, self.ledger, request, nodes)

    def ends_by(self, claim: WaitingClaim, when: float | None) -> bool:
        """Does ``claim``, started now, surely end by ``when`` (its declared limit, plus the TTL)?"""
        if when is None or claim.time_limit is None:
            return False
        return self.now + self.slack + claim.time_limit <= when

    def admit(self, name: str, choice: Choice, backfill: bool = False) -> Admission:
        """Start ``name`` on the policy's choice."""
        return self.admit_on(name, choice.node, choice.gpus, backfill)

    def admit_on(self, name: str, node: str, gpus: tuple[str, ...], backfill: bool = False) -> Admission:
        """Start ``name`` on exactly ``gpus`` of ``node``: a reservation until now + TTL, or committed."""
        waiting, key, _ = self.order.entries[name]
        expires = self.now + self.reservation_ttl if self.reservation_ttl is not None else None
        alloc: Allocation = self.ledger.assign(name, waiting.request, node, gpus, expires)
        self.order.remove(name)
        ends = self.now + self.slack + waiting.time_limit if waiting.time_limit is not None else None
        self.book.add(name, RunningClaim(waiting.namespace, waiting.request, self.now, ends, waiting, key[2]))
        waited = max(0.0, self.now - waiting.arrived_at)
        self.book.waits.add(kind_of(waiting.request), waited)
        return Admission(name, alloc, waited, waiting.namespace, backfill)


def choose_allowed(policy: Policy, ledger: Ledger, request: Request,
                   nodes: Collection[str] | None = None) -> Choice | None:
    """``policy.choose`` among the nodes ``request``'s pod may use (``Ledger.eligible``), and of
    ``nodes`` when given: every placement the queue makes goes through here."""
    allowed = ledger.eligible(request)
    if allowed is not None:
        nodes = allowed if nodes is None else allowed.intersection(nodes)
    return policy.choose(ledger, request, nodes)


class Strategy(Protocol):
    """One admission strategy: its step, how explain sees it, and the capacity it holds for heads."""

    name: str

    def step(self, view: AdmissionView) -> list[Admission]:
        """Admit whatever the strategy lets in at ``view.now``."""

    def lens(self, view: AdmissionView) -> Lens | None:
        """How explain turns a claim's class facts into this strategy's reason (None: as they are)."""

    def targets(self) -> dict[str, str]:
        """After the last step: each claim capacity is held for -> the node held (empty when none)."""

    def default_age_limit(self, request: Request) -> float:
        """T of a product the queue was given no age limit for (requests like ``request``)."""

    def group_age_limit(self, request: Request) -> float:
        """T of a pod group whose members ask like ``request`` (a product given no age limit): past it the
        group front holds capacity for the group (``packing.group_admission``)."""
