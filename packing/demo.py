"""``gpuslice demo``: pack a small sample workload with each policy and show the result."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from packing.argtypes import positive_int, readable_file
from packing.ledger import Ledger, NoFit
from packing.mix_estimator import catalog_prior
from packing.policies import POLICIES, place, policy_for
from packing.products import Catalog, CatalogError, load_catalog
from packing.usage import CommandParser

SAMPLE = ["v100-25", "v100-50", "v100-25", "v100-100", "v100-25", "v100-50", "v100-25", "v100-100",
          "v100-50", "v100-25", "v100-100", "v100-50"]


def run(policy: str, nodes: int, gpus: int, catalog: Catalog) -> str:
    ledger = Ledger()
    for n in range(nodes):
        ledger.add_node(f"node-{n}", [(f"GPU-{n}-{i}", "Tesla-V100-SXM2-32GB", 32768) for i in range(gpus)])
    placer = policy_for(policy, prior=catalog_prior(catalog))  # as the extender makes it
    lines = [f"policy {policy}:"]
    for i, name in enumerate(SAMPLE):
        try:
            request = catalog.request(name)
            placer.observe(request)
            a = place(ledger, f"pod-{i}", request, placer)
            lines.append(f"  pod-{i:<3} {name:<9} -> {a.node} {','.join(a.gpus)}")
        except NoFit as e:
            lines.append(f"  pod-{i:<3} {name:<9} waits: {e}")
    for node in ledger.nodes.values():
        cards = " ".join(f"[{'#' * ((g.milli - g.free_milli) // 250):<4}]" for g in node.gpus)
        lines.append(f"  {node.name}: {cards}  free {node.free_gpu_milli} milli")
    ledger.verify()
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    ap = CommandParser(
        prog="gpuslice demo",
        description=f"Pack a sample workload of {len(SAMPLE)} pods ({', '.join(dict.fromkeys(SAMPLE))}) onto "
                    "V100 32 GB cards with each placement policy, and show where each pod went and how full "
                    "each card is (one # per quarter of it in use). No cluster, no server.")
    ap.add_argument("--nodes", type=positive_int, default=2, metavar="N", help="nodes in the demo cluster (default 2)")
    ap.add_argument("--cards-per-node", type=positive_int, default=4, metavar="N",
                    help="V100 32 GB cards per node (default 4; --gpus is its deprecated old name)")
    ap.alias("--gpus", "--cards-per-node")
    ap.add_argument("--catalog", type=readable_file, default=None, metavar="TOML",
                    help="product catalog (default: the built-in V100 catalog); it must offer the sample's products")
    args = ap.parse_args(list(argv))
    try:
        catalog = load_catalog(args.catalog)
    except CatalogError as e:
        print(f"gpuslice demo: {ap.flagged(str(e), args)}", file=sys.stderr)
        return 2
    missing = [n for n in dict.fromkeys(SAMPLE) if n not in {p.name for p in catalog.products}]
    if missing:
        print(f"gpuslice demo: the sample workload asks for {', '.join(missing)}, which {catalog.source} does not "
              f"offer (it offers {', '.join(p.name for p in catalog.products)})", file=sys.stderr)
        return 2
    for name in POLICIES:
        print(run(name, args.nodes, args.cards_per_node, catalog))
    return 0
