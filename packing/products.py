"""The product catalog: which slices exist, and how a request becomes (product, count).

Products are data (``catalog.toml`` shipped in this package, overridable by a path). Every
product is a dyadic fraction (1/2^k) of one card of its model: with strongly divisible sizes,
online best fit and first fit pack optimally before departures (Coffman, Garey & Johnson 1987),
a guarantee lost as soon as a 1/3 or 3/8 slice joins the mix.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from packing.node_fit import NodeConstraints

MILLI_PER_GPU = 1000
MAX_DYADIC_EXPONENT = 3  # 1/8 of a card is the finest slice: 125 milli is still an integer
CATALOG_ENV = "GPUSLICE_CATALOG"


class CatalogError(ValueError):
    """The catalog file is malformed or violates a packing invariant."""


class RequestError(ValueError):
    """A request cannot be turned into a slice (unknown product, impossible size)."""


def model_accepts(pattern: str | None, label: str) -> bool:
    """Does a model pattern accept the GPU label ``label``? None accepts any model; ``A|B`` is
    either of two fnmatch patterns (a pod that runs on several models: ``V100M16|V100M32``)."""
    if pattern is None:
        return True
    return _pattern_accepts(pattern, label)


@functools.lru_cache(maxsize=4096)
def _pattern_accepts(pattern: str, label: str) -> bool:
    """``model_accepts`` for a pattern, memoised: few patterns and labels, asked per GPU in every scan."""
    return any(fnmatch.fnmatchcase(label, p) for p in pattern.split("|"))


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model the catalog knows: an fnmatch pattern over the node's product label."""

    pattern: str
    memory_mib: int

    def matches(self, label: str) -> bool:
        return fnmatch.fnmatchcase(label, self.pattern)


@dataclass(frozen=True, slots=True)
class Product:
    """A fixed slice of one GPU model: ``milli`` of compute and ``memory_mib`` of memory."""

    name: str
    model: str
    milli: int
    memory_mib: int
    resource: str

    @property
    def whole(self) -> bool:
        return self.milli == MILLI_PER_GPU

    @property
    def percent(self) -> int:
        return self.milli * 100 // MILLI_PER_GPU

    def matches_model(self, label: str) -> bool:
        return fnmatch.fnmatchcase(label, self.model)


@dataclass(frozen=True, slots=True)
class Request:
    """What one claim asks for: ``count`` GPUs with ``milli``/``memory_mib`` each, on one node.

    ``count`` > 1 is only allowed for whole cards (k cards on one node). ``count`` == 0 with
    ``milli`` == 0 is a CPU-only request (the simulator replays those). ``model`` is an fnmatch
    pattern over GPU model labels, or several separated by ``|``; ``None`` accepts any model.
    ``constraints``: the pod's node selector, required node affinity and tolerations
    (``packing.node_fit``); None (and an empty ``NodeConstraints``, which reads as None) says
    nothing, so any schedulable untainted node.
    The queue places a request only on nodes it may use; the per-node fit checks (``Ledger.explain``,
    ``Policy.pick``) leave constraints to kube-scheduler.
    """

    milli: int
    memory_mib: int = 0
    count: int = 1
    model: str | None = None
    product: str | None = None
    cpu_milli: int = 0
    host_memory_mib: int = 0
    constraints: NodeConstraints | None = None

    def __post_init__(self) -> None:
        if self.constraints is not None:
            if not isinstance(self.constraints, NodeConstraints):
                raise RequestError("constraints must be a packing.node_fit.NodeConstraints or None")
            if self.constraints.empty:
                object.__setattr__(self, "constraints", None)  # one shape for "says nothing"
        if not 0 <= self.milli <= MILLI_PER_GPU:
            raise RequestError(f"milli must be within 0..{MILLI_PER_GPU}, got {self.milli}")
        if self.memory_mib < 0 or self.cpu_milli < 0 or self.host_memory_mib < 0:
            raise RequestError("memory and CPU requests must not be negative")
        if self.count < 0:
            raise RequestError(f"count must not be negative, got {self.count}")
        if (self.count == 0) != (self.milli == 0 and self.memory_mib == 0):
            raise RequestError("a request asks for no GPU exactly when count is 0 and its size is 0")
        if self.count > 1 and self.milli != MILLI_PER_GPU:
            raise RequestError(f"{self.count} GPUs of {self.milli} milli: only whole cards may be counted")

    @property
    def gpu_less(self) -> bool:
        return self.count == 0

    @property
    def whole(self) -> bool:
        return self.milli == MILLI_PER_GPU

    @property
    def total_milli(self) -> int:
        return self.milli * self.count

    def accepts_model(self, label: str) -> bool:
        return model_accepts(self.model, label)

    def describe(self) -> str:
        what = self.product or f"{self.milli}-milli"
        return f"{self.count} x {what}" if self.count > 1 else what


@dataclass(frozen=True)
class Catalog:
    """The products on offer, indexed by name and by extended-resource name."""

    products: tuple[Product, ...]
    models: tuple[GpuModel, ...]
    resource_prefix: str
    source: str = "<built-in>"
    _by_name: dict[str, Product] = field(default_factory=dict, repr=False, compare=False)
    _by_resource: dict[str, Product] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.products})
        self._by_resource.update({p.resource: p for p in self.products})

    def product(self, name: str) -> Product:
        """The product called ``name``; RequestError naming the known ones otherwise."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name))
            raise RequestError(f"unknown product {name!r}; this catalog offers {known}") from None

    def product_for_resource(self, resource: str) -> Product | None:
        return self._by_resource.get(resource)

    def is_managed_resource(self, resource: str) -> bool:
        return resource.startswith(self.resource_prefix + "/")

    def request(self, name: str, count: int = 1, cpu_milli: int = 0, host_memory_mib: int = 0,
                model: str | None = None) -> Request:
        """Turn a product name and count into a Request (count > 1 only for whole cards).

        ``model`` pins the claim to GPU label(s) (``A|B``; a pod's node selector on the GPU product
        label): each must be one the product is for, and the request then accepts only those.
        """
        p = self.product(name)
        if model is not None and not _pins_product(model, p):
            raise RequestError(f"product {name} is for {p.model} GPUs; the claim pins {model}")
        if count < 1:
            raise RequestError(f"count of {name} must be at least 1, got {count}")
        if count > 1 and not p.whole:
            raise RequestError(
                f"{count} x {name}: a pod gets at most one fractional slice; ask for whole cards instead"
            )
        return Request(
            milli=p.milli,
            memory_mib=p.memory_mib,
            count=count,
            model=p.model if model is None else model,
            product=p.name,
            cpu_milli=cpu_milli,
            host_memory_mib=host_memory_mib,
        )

    def round_up(self, milli: int, model: str | None = None) -> Product | None:
        """The smallest product holding ``milli`` that is for the pinned GPU label(s) ``model`` (any if None)."""
        fits = [
            p for p in self.products if p.milli >= milli and (model is None or _pins_product(model, p))
        ]
        return min(fits, key=lambda p: (p.milli, p.name)) if fits else None

    def model_memory_mib(self, label: str) -> int | None:
        """Memory of one card whose product label is ``label``, when the catalog knows the model."""
        for m in self.models:
            if m.matches(label):
                return m.memory_mib
        return None

    def knows_model(self, label: str) -> bool:
        return self.model_memory_mib(label) is not None


def _pins_product(model: str, product: Product) -> bool:
    """Is every GPU label a claim pins (``A|B``) one that ``product`` is for?"""
    return all(product.matches_model(label) for label in model.split("|"))


def _dyadic(milli: int) -> bool:
    return any(milli << k == MILLI_PER_GPU for k in range(MAX_DYADIC_EXPONENT + 1))


def _int_field(entry: Mapping[str, Any], key: str, where: str) -> int:
    value = entry.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CatalogError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return value


def _str_field(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise CatalogError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


_CATALOG_KEYS = ("resource_prefix", "models", "products")
_MODEL_KEYS = ("name", "memory_mib")
_PRODUCT_KEYS = ("name", "model", "milli", "memory_mib")


def _known_keys(entry: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    """CatalogError naming the first key ``entry`` has that the catalog does not define (a typo never passes)."""
    for key in entry:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise CatalogError(f"{where}: unknown key {key!r} ({hint}known: {', '.join(known)})")


def parse_catalog(data: Mapping[str, Any], source: str = "<memory>") -> Catalog:
    """Validate a decoded catalog document; CatalogError with the offending entry otherwise."""
    _known_keys(data, _CATALOG_KEYS, source)
    prefix = data.get("resource_prefix", "gpuslice.io")
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise CatalogError(f"{source}: resource_prefix must be a DNS-like domain, got {prefix!r}")
    raw_models = data.get("models", [])
    raw_products = data.get("products")
    if not isinstance(raw_models, list) or not isinstance(raw_products, list) or not raw_products:
        raise CatalogError(f"{source}: needs [[models]] and a non-empty [[products]] list")
    models: list[GpuModel] = []
    for i, entry in enumerate(raw_models):
        where = f"{source}: models[{i}]"
        if not isinstance(entry, Mapping):
            raise CatalogError(f"{where}: must be a table")
        _known_keys(entry, _MODEL_KEYS, where)
        models.append(GpuModel(_str_field(entry, "name", where), _int_field(entry, "memory_mib", where)))
    model_mem = {m.pattern: m.memory_mib for m in models}
    products: list[Product] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw_products):
        where = f"{source}: products[{i}]"
        if not isinstance(entry, Mapping):
            raise CatalogError(f"{where}: must be a table")
        if isinstance(entry.get("name"), str) and entry["name"]:
            where = f"{source}: product {entry['name']!r}"
        _known_keys(entry, _PRODUCT_KEYS, where)
        name = _str_field(entry, "name", where)
        model = _str_field(entry, "model", where)
        milli = _int_field(entry, "milli", where)
        mib = _int_field(entry, "memory_mib", where)
        if name in seen:
            raise CatalogError(f"{where}: defined twice")
        seen.add(name)
        if model not in model_mem:
            raise CatalogError(f"{where}: model {model!r} is not listed under [[models]]")
        if not _dyadic(milli):
            raise CatalogError(
                f"{where}: {milli} milli is not a dyadic fraction (1000, 500, 250, 125) of a card; "
                "best fit is only optimal for strongly divisible sizes"
            )
        if mib * MILLI_PER_GPU != milli * model_mem[model]:
            raise CatalogError(
                f"{where}: memory {mib} MiB is not the same fraction of {model_mem[model]} MiB "
                f"as {milli}/1000 of compute"
            )
        products.append(Product(name, model, milli, mib, f"{prefix}/{name}"))
    return Catalog(tuple(products), tuple(models), prefix, source)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load the catalog from ``path``, else ``$GPUSLICE_CATALOG``, else the built-in one."""
    chosen = path if path is not None else os.environ.get(CATALOG_ENV) or None
    if chosen is None:
        text = resources.files("packing").joinpath("catalog.toml").read_text(encoding="utf-8")
        source = "<built-in catalog.toml>"
    else:
        try:
            text = Path(chosen).read_text(encoding="utf-8")
        except OSError as e:
            raise CatalogError(f"cannot read catalog {chosen}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise CatalogError(f"{chosen}: not a TOML catalog (not UTF-8 text: byte {e.start})") from e
        source = str(chosen)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{source}: not valid TOML: {e}") from e
    return parse_catalog(data, source)
