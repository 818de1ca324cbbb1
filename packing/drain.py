"""The aging guard's drain target: the one node held for a starving head of the line.

When a claim has waited past its age limit and does not fit, the aging guard holds one node for
it -- younger claims keep being placed on every other node. The target is the node where the head
would start soonest:

* with declared ends (``packing.estimate``), the node of the earliest estimated start;
* otherwise the node closest to holding the head: the most free capacity usable by it (free
  milli on its best ``count`` matching GPUs, each counted up to the milli it needs), then the
  fewest claims to drain, then node order.

Pure and deterministic: the queue keeps the pick fixed while its head starves.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from packing.estimate import earliest_node
from packing.ledger import Ledger, Node
from packing.products import Request


def pick_target(ledger: Ledger, request: Request, ends: Iterable[tuple[float, str]], now: float,
                candidates: Collection[str]) -> str | None:
    """The drain target for ``request`` among ``candidates`` (node names that could hold it when
    empty); None when there are none."""
    if not candidates:
        return None
    found = earliest_node(ledger, request, ends, now, nodes=candidates)
    if found is not None:
        return found[1]
    claims: dict[str, int] = {}
    for alloc in ledger.allocations.values():
        claims[alloc.node] = claims.get(alloc.node, 0) + 1
    nodes = [ledger.nodes[name] for name in candidates]
    best = min(nodes, key=lambda n: (-usable_milli(n, request), claims.get(n.name, 0), n.order, n.name))
    return best.name


def usable_milli(node: Node, request: Request) -> int:
    """How much of ``request`` the node's free GPUs could hold now: free milli on its best
    ``count`` matching GPUs, each up to the milli the request needs on one GPU."""
    if request.gpu_less:
        return 0
    free = sorted((min(g.free_milli, request.milli) for g in node.gpus
                   if request.accepts_model(g.model) and g.memory_mib >= request.memory_mib), reverse=True)
    return sum(free[:request.count])


def could_hold(node: Node, r: Request) -> bool:
    """Could ``node``, empty, hold ``r``?"""
    if node.cpu_milli is not None and r.cpu_milli > node.cpu_milli:
        return False
    if node.memory_mib is not None and r.host_memory_mib > node.memory_mib:
        return False
    if r.gpu_less:
        return True
    cards = sum(1 for g in node.gpus if r.accepts_model(g.model) and g.milli >= r.milli
                and g.memory_mib >= r.memory_mib)
    return cards >= r.count
