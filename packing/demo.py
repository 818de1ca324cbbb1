"""``gpuslice demo``: pack a small sample workload with each policy and show the result."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from packing.ledger import Ledger, NoFit
from packing.mix_estimator import catalog_prior
from packing.policies import POLICIES, place, policy_for
from packing.products import load_catalog

SAMPLE = ["v100-25", "v100-50", "v100-25", "v100-100", "v100-25", "v100-50", "v100-25", "v100-100",
          "v100-50", "v100-25", "v100-100", "v100-50"]


def run(policy: str, nodes: int, gpus: int, catalog_path: str | None) -> str:
    catalog = load_catalog(catalog_path)
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
    ap = argparse.ArgumentParser(prog="gpuslice demo", description=__doc__)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--catalog", default=None, help="catalog TOML (default: the built-in V100 catalog)")
    args = ap.parse_args(list(argv))
    for name in POLICIES:
        print(run(name, args.nodes, args.gpus, args.catalog))
    return 0
