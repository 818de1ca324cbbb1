"""RBAC against the code: every verb the chart's roles grant is used by the code that runs under
them, every API call that code makes is granted, and the README's permissions table says exactly
what the roles grant. The calls are read from the source (``api_calls.py``); ``make e2e`` and
``make e2e-node`` run the same code under the same roles against the real API server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .api_calls import Call, calls

REPO = Path(__file__).resolve().parents[2]
# component -> (its roles in the manifests, the code that runs under them)
COMPONENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # the chart's pre-delete hook runs `gpuslice slices` under the extender's service account
    "extender": (("gpuslice-extender",), ("extender/cluster", "extender/history", "extender/slices.py",
                                          "extender/evict_slices.py")),
    # gpuslice-certs-init: the pre-install hook's own Role (its Secrets only, before the release exists)
    "certs": (("gpuslice-certs", "gpuslice-certs-init"), ("extender/certs",)),
    "agent": (("gpuslice-agent",), ("enforcement",)),
}
Grant = tuple[str, str, str]  # (group, resource, verb)


def roles() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((REPO / "deploy" / "manifests" / "gpuslice.yaml").read_text())
    return [d for d in docs if d and d["kind"] in ("ClusterRole", "Role")]


def granted(names: tuple[str, ...]) -> set[Grant]:
    out: set[Grant] = set()
    for role in roles():
        if role["metadata"]["name"] in names:
            for rule in role["rules"]:
                out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def used(folders: tuple[str, ...]) -> tuple[dict[Grant, list[str]], list[str]]:
    found, unresolved = calls(*(f for f in folders if not f.endswith(".py")),
                              files=tuple(f for f in folders if f.endswith(".py")))
    by_grant: dict[Grant, list[str]] = {}
    for c in sorted(found):
        by_grant.setdefault((c.group, c.resource, c.verb), []).append(c.where)
    return by_grant, unresolved


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_every_call_is_granted_and_every_grant_is_used(component: str) -> None:
    names, folders = COMPONENTS[component]
    grants = granted(names)
    assert grants, f"no roles named {names} in the manifests"
    calls_made, unresolved = used(folders)
    assert unresolved == [], "API calls whose path the scan cannot read: make them readable"
    missing = {g: where for g, where in calls_made.items() if g not in grants}
    assert missing == {}, f"{component} makes calls its roles do not grant"
    unused = grants - set(calls_made)
    assert unused == set(), f"{component}'s roles grant what its code never does"


def test_every_role_of_the_manifests_belongs_to_a_component_or_to_upstream_code() -> None:
    ours = {n for names, _ in COMPONENTS.values() for n in names}
    # kube-scheduler's own Lease in our namespace (its code is upstream's, its other roles upstream's too)
    upstream = {"gpuslice-scheduler-leases"}
    assert {r["metadata"]["name"] for r in roles()} == ours | upstream


def readme_table() -> set[tuple[str, str, str, str]]:
    """(component, group, resource, verb) of the README's permissions table."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Permissions"):]
    section = section[:section.index("\n#", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    out: set[tuple[str, str, str, str]] = set()
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        component, group, resource, verbs = (re.sub(r"[`]", "", c) for c in cells[:4])
        for verb in verbs.split(","):
            out.add((component, "" if group == "core" else group, resource, verb.strip()))
    return out


def test_the_readme_permissions_table_is_what_the_roles_grant() -> None:
    table = readme_table()
    expected = {(component, *g) for component, (names, _) in COMPONENTS.items() for g in granted(names)}
    expected |= {("kube-scheduler", *g) for g in granted(("gpuslice-scheduler-leases",))}
    assert table == expected


def test_the_scan_finds_calls_of_every_kind_it_claims_to_read() -> None:
    """A scan that found nothing would pass the tests above for a component with no roles."""
    found, _ = calls("extender/cluster", "enforcement")
    kinds = {(c.resource, c.verb) for c in found}
    assert {("pods", "watch"), ("pods/binding", "create"), ("leases", "update"), ("resourceclaimtemplates", "get"),
            ("nodes", "patch"), ("resourceslices", "update")} <= kinds
    assert all(isinstance(c, Call) and ":" in c.where for c in found)
