"""The product catalog: loading, overriding, validation messages, and request validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.products import (
    CATALOG_ENV,
    MILLI_PER_GPU,
    Catalog,
    CatalogError,
    Request,
    RequestError,
    load_catalog,
    parse_catalog,
)

V100 = "Tesla-V100-*-32GB"
V100_MIB = 32768
SXM2 = "Tesla-V100-SXM2-32GB"


def catalog_toml(products: list[tuple[str, str, int, int]], models: list[tuple[str, int]],
                 prefix: str = "gpuslice.io") -> str:
    """A catalog document as TOML text: products are (name, model, milli, memory MiB)."""
    lines = [f'resource_prefix = "{prefix}"', ""]
    for name, mib in models:
        lines += ["[[models]]", f'name = "{name}"', f"memory_mib = {mib}", ""]
    for name, model, milli, mib in products:
        lines += ["[[products]]", f'name = "{name}"', f'model = "{model}"', f"milli = {milli}",
                  f"memory_mib = {mib}", ""]
    return "\n".join(lines)


def as_toml(catalog: Catalog) -> str:
    """Write ``catalog`` back as TOML (the inverse of load_catalog, for round trips)."""
    return catalog_toml(
        [(p.name, p.model, p.milli, p.memory_mib) for p in catalog.products],
        [(m.pattern, m.memory_mib) for m in catalog.models],
        catalog.resource_prefix,
    )


@pytest.fixture
def builtin() -> Catalog:
    return load_catalog()


# ---- the built-in catalog --------------------------------------------------------------------


def test_builtin_catalog_offers_the_three_v100_slices(builtin: Catalog) -> None:
    sizes = {p.name: (p.model, p.milli, p.memory_mib, p.resource, p.percent) for p in builtin.products}
    assert sizes == {
        "v100-25": (V100, 250, 8192, "gpuslice.io/v100-25", 25),
        "v100-50": (V100, 500, 16384, "gpuslice.io/v100-50", 50),
        "v100-100": (V100, 1000, 32768, "gpuslice.io/v100-100", 100),
    }
    assert [p.whole for p in builtin.products] == [p.milli == MILLI_PER_GPU for p in builtin.products]
    assert builtin.source == "<built-in catalog.toml>"


def test_builtin_catalog_knows_v100_labels_only(builtin: Catalog) -> None:
    assert builtin.model_memory_mib(SXM2) == V100_MIB
    assert builtin.knows_model("Tesla-V100-PCIE-32GB")
    assert not builtin.knows_model("Tesla-V100-SXM2-16GB")
    assert builtin.model_memory_mib("NVIDIA-A100-SXM4-40GB") is None


def test_lookups_round_trip(builtin: Catalog) -> None:
    for p in builtin.products:
        assert builtin.product(p.name) is p
        assert builtin.product_for_resource(p.resource) is p
        assert builtin.is_managed_resource(p.resource)
        assert builtin.round_up(p.milli, SXM2) == p
        r = builtin.request(p.name)
        assert (r.milli, r.memory_mib, r.count, r.model, r.product) == (p.milli, p.memory_mib, 1, p.model, p.name)
        assert r.accepts_model(SXM2) and not r.accepts_model("Tesla-T4")
    assert builtin.product_for_resource("nvidia.com/gpu") is None
    assert not builtin.is_managed_resource("nvidia.com/gpu")
    assert not builtin.is_managed_resource("gpuslice.iox/v100-25")


def test_catalog_file_round_trips(builtin: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(as_toml(builtin), encoding="utf-8")
    again = load_catalog(path)
    assert (again.products, again.models, again.resource_prefix) == (
        builtin.products, builtin.models, builtin.resource_prefix)
    assert again.source == str(path)


def test_round_up_picks_the_smallest_holding_product(builtin: Catalog) -> None:
    assert builtin.round_up(1).name == "v100-25"  # type: ignore[union-attr]
    assert builtin.round_up(250).name == "v100-25"  # type: ignore[union-attr]
    assert builtin.round_up(251).name == "v100-50"  # type: ignore[union-attr]
    assert builtin.round_up(501, SXM2).name == "v100-100"  # type: ignore[union-attr]
    assert builtin.round_up(1001) is None
    assert builtin.round_up(100, "Tesla-T4") is None


@given(milli=st.integers(0, 1200))
def test_round_up_is_the_minimal_product(milli: int) -> None:
    catalog = load_catalog()
    got = catalog.round_up(milli, SXM2)
    holding = [p for p in catalog.products if p.milli >= milli]
    if not holding:
        assert got is None
    else:
        assert got is not None and got.milli >= milli
        assert got.milli == min(p.milli for p in holding)


# ---- overrides ---------------------------------------------------------------------------------

SMALL = catalog_toml([("a100-50", "NVIDIA-A100-*-40GB", 500, 20480)], [("NVIDIA-A100-*-40GB", 40960)],
                     prefix="example.com")


def test_override_by_path(tmp_path: Path) -> None:
    path = tmp_path / "a100.toml"
    path.write_text(SMALL, encoding="utf-8")
    catalog = load_catalog(str(path))
    assert [p.name for p in catalog.products] == ["a100-50"]
    assert catalog.products[0].resource == "example.com/a100-50"
    assert catalog.model_memory_mib("NVIDIA-A100-SXM4-40GB") == 40960


def test_override_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a100.toml"
    path.write_text(SMALL, encoding="utf-8")
    monkeypatch.setenv(CATALOG_ENV, str(path))
    assert [p.name for p in load_catalog().products] == ["a100-50"]
    assert load_catalog().source == str(path)


def test_explicit_path_beats_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "missing.toml"))
    path = tmp_path / "a100.toml"
    path.write_text(SMALL, encoding="utf-8")
    assert [p.name for p in load_catalog(path).products] == ["a100-50"]


def test_empty_environment_means_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CATALOG_ENV, "")
    assert load_catalog().source == "<built-in catalog.toml>"


# ---- bad catalogs --------------------------------------------------------------------------------

V100_MODEL = [(V100, V100_MIB)]

BAD_CATALOGS: list[tuple[str, str, str]] = [
    ("one-third", catalog_toml([("v100-33", V100, 333, 10923)], V100_MODEL),
     "333 milli is not a dyadic fraction"),
    ("three-eighths", catalog_toml([("v100-37", V100, 375, 12288)], V100_MODEL),
     "375 milli is not a dyadic fraction"),
    ("memory-not-proportional", catalog_toml([("v100-25", V100, 250, 16384)], V100_MODEL),
     "memory 16384 MiB is not the same fraction of 32768 MiB as 250/1000 of compute"),
    ("unknown-model", catalog_toml([("t4-50", "Tesla-T4", 500, 8192)], V100_MODEL),
     "model 'Tesla-T4' is not listed under [[models]]"),
    ("duplicate-name", catalog_toml([("v100-25", V100, 250, 8192), ("v100-25", V100, 500, 16384)], V100_MODEL),
     "product 'v100-25': defined twice"),
    ("zero-milli", catalog_toml([("v100-0", V100, 0, 0)], V100_MODEL), "'milli' must be a positive integer"),
    ("bool-milli", catalog_toml([], V100_MODEL) + '[[products]]\nname = "x"\nmodel = "m"\nmilli = true\n'
                                              "memory_mib = 1\n", "'milli' must be a positive integer"),
    ("empty-name", catalog_toml([("", V100, 250, 8192)], V100_MODEL), "'name' must be a non-empty string"),
    ("no-products", catalog_toml([], V100_MODEL), "needs [[models]] and a non-empty [[products]] list"),
    ("bad-prefix", catalog_toml([("v100-25", V100, 250, 8192)], V100_MODEL, prefix="a/b"),
     "resource_prefix must be a DNS-like domain"),
    ("model-not-table", 'models = [1]\n[[products]]\nname = "x"\n', "models[0]: must be a table"),
    ("bad-toml", "[[products]\nname = ", "not valid TOML"),
    ("product-key-typo", catalog_toml([], V100_MODEL) + '[[products]]\nname = "x"\nmodel = "m"\nmili = 250\n',
     "product 'x': unknown key 'mili' (did you mean 'milli'? known: name, model, milli, memory_mib)"),
    ("product-extra-key", catalog_toml([("v100-25", V100, 250, 8192)], V100_MODEL).replace(
        "memory_mib = 8192", 'memory_mib = 8192\ncolour = "red"'),
     "product 'v100-25': unknown key 'colour' (known: name, model, milli, memory_mib)"),
    ("product-name-typo", catalog_toml([], V100_MODEL) + '[[products]]\nnmae = "x"\n',
     "products[0]: unknown key 'nmae' (did you mean 'name'?"),
    ("model-key-typo", catalog_toml([("v100-25", V100, 250, 8192)], V100_MODEL).replace(
        "memory_mib = 32768", "memory_mb = 32768"), "models[0]: unknown key 'memory_mb' (did you mean 'memory_mib'?"),
    ("top-level-typo", 'resource_prefx = "x.io"\n' + catalog_toml([("v100-25", V100, 250, 8192)], V100_MODEL),
     "unknown key 'resource_prefx' (did you mean 'resource_prefix'? known: resource_prefix, models, products)"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in BAD_CATALOGS],
                         ids=[i for i, _, _ in BAD_CATALOGS])
def test_bad_catalog_is_rejected_with_a_clear_message(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CatalogError) as err:
        load_catalog(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)  # the message names the file at fault


def test_missing_catalog_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"
    with pytest.raises(CatalogError, match=r"cannot read catalog .*nowhere\.toml: No such file"):
        load_catalog(path)


def test_missing_file_named_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "gone.toml"))
    with pytest.raises(CatalogError, match=r"gone\.toml"):
        load_catalog()


@given(milli=st.integers(1, MILLI_PER_GPU))
@settings(max_examples=150)
def test_parse_accepts_exactly_the_dyadic_fractions(milli: int) -> None:
    mib = milli * V100_MIB // MILLI_PER_GPU
    doc = {"models": [{"name": V100, "memory_mib": V100_MIB}],
           "products": [{"name": "p", "model": V100, "milli": milli, "memory_mib": mib}]}
    dyadic = milli in (125, 250, 500, 1000)
    if dyadic:
        assert parse_catalog(doc).product("p").milli == milli
    else:
        with pytest.raises(CatalogError, match="not a dyadic fraction"):
            parse_catalog(doc)


# ---- requests ------------------------------------------------------------------------------------


def test_counted_fractional_request_is_rejected(builtin: Catalog) -> None:
    with pytest.raises(RequestError, match="a pod gets at most one fractional slice"):
        builtin.request("v100-25", count=2)
    with pytest.raises(RequestError, match="only whole cards may be counted"):
        Request(milli=500, memory_mib=16384, count=2)


def test_counted_whole_cards_are_accepted(builtin: Catalog) -> None:
    r = builtin.request("v100-100", count=4, cpu_milli=2000, host_memory_mib=4096)
    assert (r.count, r.total_milli, r.whole, r.gpu_less) == (4, 4000, True, False)
    assert (r.cpu_milli, r.host_memory_mib) == (2000, 4096)
    assert r.describe() == "4 x v100-100"


def test_unknown_product_names_the_known_ones(builtin: Catalog) -> None:
    known = "v100-100, v100-25, v100-50"
    with pytest.raises(RequestError, match=f"unknown product 'v100-75'; this catalog offers {known}"):
        builtin.request("v100-75")


def test_zero_count_of_a_product_is_rejected(builtin: Catalog) -> None:
    with pytest.raises(RequestError, match="count of v100-50 must be at least 1, got 0"):
        builtin.request("v100-50", count=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"milli": 1001}, "milli must be within 0..1000, got 1001"),
        ({"milli": -1}, "milli must be within 0..1000, got -1"),
        ({"milli": 250, "memory_mib": -1}, "must not be negative"),
        ({"milli": 250, "cpu_milli": -5}, "must not be negative"),
        ({"milli": 250, "count": -1}, "count must not be negative"),
        ({"milli": 250, "count": 0}, "no GPU exactly when count is 0"),
        ({"milli": 0, "count": 1}, "no GPU exactly when count is 0"),
        ({"milli": 250, "count": 3}, "3 GPUs of 250 milli"),
    ],
)
def test_request_validation(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        Request(**kwargs)  # type: ignore[arg-type]


def test_gpu_less_and_free_form_requests() -> None:
    cpu_only = Request(milli=0, memory_mib=0, count=0, cpu_milli=500)
    assert cpu_only.gpu_less and cpu_only.total_milli == 0
    free = Request(milli=300, memory_mib=100)
    assert free.describe() == "300-milli" and free.accepts_model("anything")
    assert not Request(milli=300, model="Tesla-T4").accepts_model(SXM2)


def test_a_claim_may_pin_gpu_models_its_product_is_for() -> None:
    catalog = load_catalog()
    pinned = catalog.request("v100-25", model="Tesla-V100-SXM2-32GB|Tesla-V100-PCIE-32GB")
    assert pinned.accepts_model("Tesla-V100-PCIE-32GB") and not pinned.accepts_model("Tesla-V100-FHHL-32GB")
    with pytest.raises(RequestError, match="product v100-25 is for Tesla-V100-\\*-32GB GPUs; the claim pins Tesla-T4"):
        catalog.request("v100-25", model="Tesla-T4")
    assert catalog.round_up(300, "Tesla-V100-SXM2-32GB") == catalog.product("v100-50")
    assert catalog.round_up(300, "Tesla-T4") is None
