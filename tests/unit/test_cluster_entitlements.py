"""Entitlements from the ConfigMap: parsing, and what a change applies to the queue."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.cluster.entitlements import EntitlementsError, changes, parse_configmap, parse_entitlement
from packing.entitlements import Entitlement
from packing.products import load_catalog

CATALOG = load_catalog()
PRODUCTS = [p.name for p in CATALOG.products]


def test_parse_entitlement() -> None:
    e = parse_entitlement(" v100-25=8, v100-100=2 ,milli=4000", CATALOG)
    assert e == Entitlement({"v100-25": 8, "v100-100": 2}, 4000)
    assert parse_entitlement("", CATALOG) == Entitlement({}, None)
    assert parse_entitlement("v100-50=0\nv100-25=1", CATALOG) == Entitlement({"v100-50": 0, "v100-25": 1}, None)


@pytest.mark.parametrize("text, message", [
    ("v100-25", "PRODUCT=COUNT"),
    ("=3", "PRODUCT=COUNT"),
    ("v100-25=-1", "whole number"),
    ("v100-25=1.5", "whole number"),
    ("v100-25=x", "whole number"),
    ("v100-33=1", "unknown product"),
    ("v100-25=1,v100-25=2", "twice"),
])
def test_parse_entitlement_refuses(text: str, message: str) -> None:
    with pytest.raises(EntitlementsError, match=message):
        parse_entitlement(text, CATALOG, "team-a")


def test_parse_configmap_separates_good_and_bad() -> None:
    good, bad = parse_configmap({"a": "v100-25=2", "b": "nonsense", "c": 3}, CATALOG)
    assert good == {"a": Entitlement({"v100-25": 2}, None)}
    assert set(bad) == {"b", "c"} and "namespace b" in bad["b"]


def test_changes_keep_previous_on_bad_and_lift_removed() -> None:
    before = {"a": Entitlement({"v100-25": 1}), "b": Entitlement({"v100-50": 1}), "c": Entitlement({}, 500)}
    good = {"a": Entitlement({"v100-25": 1}), "d": Entitlement({"v100-100": 1})}
    apply, after = changes(before, good, {"b": "broken"})
    assert apply == {"c": None, "d": Entitlement({"v100-100": 1})}  # a unchanged, b kept, c lifted, d new
    assert after == {"a": before["a"], "b": before["b"], "d": good["d"]}


caps = st.dictionaries(st.sampled_from(PRODUCTS), st.integers(0, 50), max_size=3)
entitlements = st.builds(Entitlement, caps, st.one_of(st.none(), st.integers(0, 8000)))
namespaces = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=200)
@given(before=st.dictionaries(namespaces, entitlements), good=st.dictionaries(namespaces, entitlements),
       bad=st.sets(namespaces))
def test_changes_applied_to_before_give_after(
    before: dict[str, Entitlement], good: dict[str, Entitlement], bad: set[str]
) -> None:
    errors = {ns: "broken" for ns in bad if ns not in good}
    apply, after = changes(before, good, errors)
    state = dict(before)
    for ns, e in apply.items():
        if e is None:
            state.pop(ns, None)
        else:
            state[ns] = e
    assert state == after
    for ns in errors:  # bad input changes nothing for that namespace
        assert after.get(ns) == before.get(ns)


@settings(max_examples=100)
@given(e=entitlements)
def test_text_round_trip(e: Entitlement) -> None:
    parts = [f"{p}={n}" for p, n in e.max_slices.items()]
    if e.max_milli is not None:
        parts.append(f"milli={e.max_milli}")
    assert parse_entitlement(",".join(parts), CATALOG) == e
