"""Importing this module registers every simulator-side policy with ``packing.policies``."""

from __future__ import annotations

from packing.policies import POLICIES, Policy
from simulations.baselines import BASELINES
from simulations.fragpolicy import FRAG_GRADIENT

SIMULATOR_POLICIES: tuple[Policy, ...] = (*BASELINES, FRAG_GRADIENT)


def policy_names() -> list[str]:
    """Every registered placement policy: the product's first, then the simulator's."""
    return list(POLICIES)
