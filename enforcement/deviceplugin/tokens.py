"""Device plugin tokens: the devices the kubelet counts, one resource per product.

Each healthy card offers ``1000 / milli`` tokens of each product of its model (4 ``v100-25``,
2 ``v100-50``, 1 ``v100-100``), named ``<product>::<uuid>::<n>``. A token is the kubelet's unit of
admission, not the slice: which card a container gets is the pod's allocation record (see
``handoff``). Tokens name a card anyway so that (a) a withdrawn card's tokens turn Unhealthy
and the node offers less, and (b) GetPreferredAllocation can steer the kubelet's choice with the
extender's own best-fit rule, so that the PodResources API usually names the record's card too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packing.inventory import Card
from packing.ledger import Ledger, LedgerError
from packing.policies import BEST_FIT
from packing.products import MILLI_PER_GPU, Catalog, Product

SEP = "::"
_NODE = "this-node"


@dataclass(frozen=True, slots=True)
class Token:
    product: str
    uuid: str
    n: int

    @property
    def id(self) -> str:
        return f"{self.product}{SEP}{self.uuid}{SEP}{self.n}"


def parse(token_id: str) -> Token | None:
    """The token a device id names; None for an id that is not one of ours."""
    parts = token_id.split(SEP)
    if len(parts) != 3 or not parts[2].isdigit() or not parts[0] or not parts[1]:
        return None
    return Token(parts[0], parts[1], int(parts[2]))


def tokens_of(product: Product, cards: Sequence[Card]) -> list[tuple[Token, bool]]:
    """Every token of ``product`` on ``cards`` of its model, with its health (the card's)."""
    out: list[tuple[Token, bool]] = []
    for card in sorted(cards, key=lambda c: c.index):
        if product.matches_model(card.model):
            out.extend((Token(product.name, card.uuid, n), card.healthy) for n in range(MILLI_PER_GPU // product.milli))
    return out


def preferred(
    product: Product,
    catalog: Catalog,
    cards: Sequence[Card],
    available: Iterable[str],
    must_include: Iterable[str],
    size: int,
    held: Iterable[str],
) -> list[str]:
    """The ``size`` tokens to prefer: ``must_include``, then one by one the token on the card that
    ``packing``'s best-fit policy picks, given the tokens already held (of every product) on it.

    The ledger is this node's cards that have an available token; held tokens count as slices on
    their cards (a held set the kubelet over-counts, e.g. four quarters and a half on one card,
    fills the card and no more).
    """
    chosen = [t for t in must_include]
    free = [t for t in available if t not in chosen]
    by_card: dict[str, list[str]] = {}
    for token_id in free:
        token = parse(token_id)
        if token is not None:
            by_card.setdefault(token.uuid, []).append(token_id)
    ledger = Ledger()
    ledger.add_node(_NODE, [(c.uuid, c.model, catalog.model_memory_mib(c.model) or c.memory_mib)
                            for c in sorted(cards, key=lambda c: c.index) if c.uuid in by_card])
    for i, token_id in enumerate([*held, *chosen]):
        _charge(ledger, catalog, f"held-{i}", token_id)
    request = catalog.request(product.name)
    while len(chosen) < size:
        gpus = BEST_FIT.pick(ledger, request, _NODE)
        if not gpus or not by_card.get(gpus[0]):
            break  # the ledger says nothing fits: let the kubelet choose among the rest
        token_id = by_card[gpus[0]].pop(0)
        chosen.append(token_id)
        _charge(ledger, catalog, f"chosen-{len(chosen)}", token_id)
    rest = [t for ids in by_card.values() for t in ids]
    return (chosen + rest)[:size]


def _charge(ledger: Ledger, catalog: Catalog, claim: str, token_id: str) -> None:
    token = parse(token_id)
    if token is None or token.uuid not in ledger.gpus:
        return
    with contextlib.suppress(LedgerError, ValueError):  # a card already full in the ledger stays full
        ledger.assign(claim, catalog.request(token.product), _NODE, (token.uuid,))
