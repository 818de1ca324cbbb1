"""The one registry of placement policies: every policy the extender serves and the simulator runs.

Built here, once, from the policy modules (one per file); read-only afterwards. Entries carry no
context: ``policy_for`` gives each user (the extender, one simulator run) its own instance, with
its own mix estimator and random generator. Baselines (``Capabilities.baseline``) reproduce
published results and are served too, so a cluster can be compared against them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from packing.key_index import KeyIndex
from packing.load_phase import LoadPhase
from packing.mix_estimator import MixEstimator, MixSource
from packing.policies.base import Policy, PolicyContext
from packing.policies.best_fit import BEST_FIT
from packing.policies.fgd import FGD
from packing.policies.first_fit import FIRST_FIT
from packing.policies.frag_aware import FRAG_AWARE
from packing.policies.frag_gradient import FRAG_GRADIENT
from packing.policies.go_best_fit import GO_BEST_FIT
from packing.policies.gradient_fit import GRADIENT_FIT
from packing.policies.random_fit import RANDOM_FIT
from packing.policies.relative_gradient import RELATIVE_GRADIENT
from packing.policies.spread import SPREAD
from packing.products import Request

DEFAULT_POLICY = GRADIENT_FIT.name

POLICIES: Mapping[str, Policy] = MappingProxyType({p.name: p for p in (
    GRADIENT_FIT, BEST_FIT, FRAG_GRADIENT, RELATIVE_GRADIENT, FIRST_FIT, FRAG_AWARE, SPREAD, RANDOM_FIT, GO_BEST_FIT,
    FGD)})


def policy_names(baselines: bool = True) -> list[str]:
    """Every registered policy, the default first; without the baselines when ``baselines`` is False."""
    return [n for n, p in POLICIES.items() if baselines or not p.capabilities.baseline]


def get_policy(name: str) -> Policy:
    """The registry's entry for ``name`` (no context); ValueError naming the known ones otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


def policy_for(name: str, mix: MixSource | None = None, seed: int = 0, prior: Iterable[Request] = ()) -> Policy:
    """A policy of its own for one user: ``mix`` (default: a fresh ``MixEstimator`` starting from
    ``prior`` when the policy reads the mix, per card when it declares ``mix_per_card``), a fresh
    ``LoadPhase`` (filling) when it reads the phase, a random generator seeded with ``seed`` when
    it samples, and a ``KeyIndex`` of its own when it declares ``key_index``."""
    policy = get_policy(name)
    caps = policy.capabilities
    source = (mix or MixEstimator(prior=prior, per_card=caps.mix_per_card)) if caps.needs_mix else None
    rng = random.Random(seed) if caps.sampled else None
    phase = LoadPhase() if caps.needs_phase else None
    index = KeyIndex() if caps.key_index else None
    return policy.with_context(PolicyContext(source, rng, phase, index))
