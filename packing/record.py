"""The allocation record: the contract between the extender and the node agent.

The extender writes it on the pod (annotation ``gpuslice.io/allocation``) with the Binding, in the
update that sets the pod's node; the node agent reads it to hand the container its GPU and caps. The API server is the
only state the two share, so the record is small, versioned and strict on decode.

A record hands out a card only on the pod it was written for: :func:`record_of_pod` is the one reader
of a pod's record, for the extender's watch and every hand-off path of the agent alike. A record whose
claim is not the pod's own uid (a copy of another pod's), or that names another node, is refused with
the reason, never honoured.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ANNOTATION = "gpuslice.io/allocation"
VERSION = 1
MAX_ENCODED_BYTES = 4096  # well under the 256 KiB annotation budget, and plenty for 8 UUIDs


class RecordError(ValueError):
    """An annotation value that is not a valid allocation record of a version we read."""


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    """Which GPU(s) on which node hold a claim's slice, and its size per GPU."""

    claim_uid: str
    node: str
    gpus: tuple[str, ...]
    product: str | None
    milli: int
    memory_mib: int
    version: int = VERSION

    def __post_init__(self) -> None:
        if not self.claim_uid or not self.node:
            raise RecordError("claim uid and node must not be empty")
        if not self.gpus or any(not isinstance(g, str) or not g for g in self.gpus):
            raise RecordError("an allocation names at least one GPU uuid")
        if len(set(self.gpus)) != len(self.gpus):
            raise RecordError("an allocation names each GPU once")
        if not 0 < self.milli <= 1000 or self.memory_mib < 0:
            raise RecordError(f"bad size: {self.milli} milli, {self.memory_mib} MiB")
        if len(self.gpus) > 1 and self.milli != 1000:
            raise RecordError("only whole cards may span several GPUs")

    def encode(self) -> str:
        """Compact JSON with sorted keys: equal records encode to equal strings."""
        doc = {
            "v": self.version,
            "claim": self.claim_uid,
            "node": self.node,
            "gpus": list(self.gpus),
            "product": self.product,
            "milli": self.milli,
            "mib": self.memory_mib,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)


_FIELDS = {"v", "claim", "node", "gpus", "product", "milli", "mib"}


def _typed(doc: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise RecordError(f"allocation record lacks {key}")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RecordError(f"field {key!r} has the wrong type: {value!r}")
    return value


def decode(value: str) -> AllocationRecord:
    """Parse an annotation value; RecordError says what is wrong and changes nothing."""
    if not isinstance(value, str):
        raise RecordError(f"allocation record must be a string, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ENCODED_BYTES:
        raise RecordError(f"allocation record longer than {MAX_ENCODED_BYTES} bytes")
    try:
        doc = json.loads(value)
    except json.JSONDecodeError as e:
        raise RecordError(f"allocation record is not JSON: {e.msg} at position {e.pos}") from None
    except RecursionError:  # 4 KiB of '[' is enough to exhaust the JSON parser's stack
        raise RecordError("allocation record nests too deeply to be one") from None
    if not isinstance(doc, dict):
        raise RecordError("allocation record must be a JSON object")
    version = _typed(doc, "v", int)
    if version > VERSION:
        raise RecordError(
            f"allocation record version {version} was written by a newer gpuslice; this one reads up to {VERSION}"
        )
    if version < 1:
        raise RecordError(f"allocation record version {version} is not valid")
    missing = _FIELDS - doc.keys() - {"product"}
    if missing:
        raise RecordError(f"allocation record lacks {', '.join(sorted(missing))}")
    gpus = _typed(doc, "gpus", list)
    if any(not isinstance(g, str) for g in gpus):
        raise RecordError(f"field 'gpus' must list GPU uuid strings, got {gpus!r}")
    product = doc.get("product")
    if product is not None and not isinstance(product, str):
        raise RecordError(f"field 'product' has the wrong type: {product!r}")
    return AllocationRecord(
        claim_uid=_typed(doc, "claim", str),
        node=_typed(doc, "node", str),
        gpus=tuple(gpus),
        product=product,
        milli=_typed(doc, "milli", int),
        memory_mib=_typed(doc, "mib", int),
        version=version,
    )


# why a pod's record is refused (the agent's metric label)
UNREADABLE = "unreadable"
OTHER_POD = "other-pod"
OTHER_NODE = "other-node"
NOT_ASKED = "not-asked"  # the record names a product the pod does not ask for (packing.asks.asks_for)
REFUSALS = (UNREADABLE, OTHER_POD, OTHER_NODE, NOT_ASKED)


class RecordRefused(RecordError):
    """A pod carries a record that is not the extender's record for this very pod on this node."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # one of REFUSALS


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def record_of_pod(pod: Mapping[str, Any], node: str) -> AllocationRecord | None:
    """The allocation record the extender wrote for ``pod`` on ``node``; None when the pod carries none.

    The record's claim must be the pod's own uid (``metadata.uid``: the API server sets it at creation,
    so no record written before the pod existed can name it) and its node ``node`` (the node that
    reads it). RecordRefused otherwise, its ``reason`` one of REFUSALS and its message what is wrong.
    """
    annotations = _meta(pod).get("annotations")
    value = annotations.get(ANNOTATION) if isinstance(annotations, Mapping) else None
    if value is None:
        return None
    try:
        record = decode(value)
    except RecordError as e:
        raise RecordRefused(UNREADABLE, f"its {ANNOTATION} annotation is unreadable: {e}") from None
    uid = _meta(pod).get("uid")
    if not isinstance(uid, str) or record.claim_uid != uid:
        raise RecordRefused(OTHER_POD, f"its allocation record names claim {record.claim_uid}, not this pod "
                                       f"({uid}): a copy, or written by hand; only the pod it was written for gets "
                                       "the card")
    if record.node != node:
        raise RecordRefused(OTHER_NODE, f"its allocation record names node {record.node!r}, not {node!r}")
    return record
