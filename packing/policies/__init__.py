"""Placement policies: which node and which GPU(s) get a request. One policy per module:

=====================  ==============================================================================
``best_fit``           the smallest leftover on the chosen card, then the fullest node (indexed)
``first_fit``          the first node in stable order that fits
``spread``             worst fit: the largest leftover, then the emptiest node
``frag_aware``         best fit that keeps empty cards whole while a partly used card fits
``frag_gradient``      FGD's fragment-gradient levels with its own tie-breaks (unique keys; indexed)
``gradient_fit``       the default (see its docstring and ``simulations/README.md``; indexed)
``relative_gradient``  fragment-gradient levels in steps of the request's size, consolidation for slices (indexed)
``random_fit``         baseline: a random fitting node
``go_best_fit``        baseline: the FGD artifact's integer Best-fit score
``fgd``                baseline: FGD (ATC'23) re-implemented
=====================  ==============================================================================

``base`` defines ``Policy`` (key, pick, capabilities, context) and the verbs ``place``,
``place_on``, ``scale_scores``; ``registry`` holds the one immutable registry and ``policy_for``.
"indexed": a decision is O(log n), through the ledger's sorted index (best fit) or a ``KeyIndex``
(``packing.key_index``) of the policy's own keys (the gradient policies, instances from ``policy_for``).
"""

from packing.policies.base import (
    MAX_SCORE,
    Capabilities,
    Choice,
    NodeKey,
    Policy,
    PolicyContext,
    place,
    place_on,
    scale_scores,
    summarize_misfits,
)
from packing.policies.best_fit import BEST_FIT
from packing.policies.fgd import FGD
from packing.policies.first_fit import FIRST_FIT
from packing.policies.frag_aware import FRAG_AWARE
from packing.policies.frag_gradient import FRAG_GRADIENT
from packing.policies.go_best_fit import GO_BEST_FIT
from packing.policies.gradient_fit import GRADIENT_FIT
from packing.policies.random_fit import RANDOM_FIT
from packing.policies.registry import DEFAULT_POLICY, POLICIES, get_policy, policy_for, policy_names
from packing.policies.relative_gradient import RELATIVE_GRADIENT
from packing.policies.spread import SPREAD

__all__ = [
    "BEST_FIT",
    "DEFAULT_POLICY",
    "FGD",
    "FIRST_FIT",
    "FRAG_AWARE",
    "FRAG_GRADIENT",
    "GO_BEST_FIT",
    "GRADIENT_FIT",
    "MAX_SCORE",
    "POLICIES",
    "RANDOM_FIT",
    "RELATIVE_GRADIENT",
    "SPREAD",
    "Capabilities",
    "Choice",
    "NodeKey",
    "Policy",
    "PolicyContext",
    "get_policy",
    "place",
    "place_on",
    "policy_for",
    "policy_names",
    "scale_scores",
    "summarize_misfits",
]
