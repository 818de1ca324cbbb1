"""The allocation record: a strict, versioned round trip between the extender and the node agent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.record import (
    ANNOTATION,
    MAX_ENCODED_BYTES,
    OTHER_NODE,
    OTHER_POD,
    UNREADABLE,
    VERSION,
    AllocationRecord,
    RecordError,
    RecordRefused,
    decode,
    record_of_pod,
)

GOOD = AllocationRecord(
    claim_uid="6d1f0c7e-0000-4000-8000-000000000001",
    node="gpu-node-3",
    gpus=("GPU-aaaaaaaa-0000-0000-0000-000000000001",),
    product="v100-25",
    milli=250,
    memory_mib=8192,
)


def good_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(GOOD.encode())
    return doc


names = st.text(min_size=1, max_size=40)


@st.composite
def records(draw: st.DrawFn) -> AllocationRecord:
    whole = draw(st.booleans())
    gpus = draw(st.lists(names, min_size=1, max_size=8 if whole else 1, unique=True))
    return AllocationRecord(
        claim_uid=draw(names),
        node=draw(names),
        gpus=tuple(gpus),
        product=draw(st.none() | names),
        milli=1000 if whole else draw(st.integers(1, 1000)),
        memory_mib=draw(st.integers(0, 1 << 40)),
    )


def test_annotation_name() -> None:
    assert ANNOTATION == "gpuslice.io/allocation"


def test_encoding_is_compact_sorted_json() -> None:
    assert GOOD.encode() == (
        '{"claim":"6d1f0c7e-0000-4000-8000-000000000001","gpus":["GPU-aaaaaaaa-0000-0000-0000-000000000001"],'
        '"mib":8192,"milli":250,"node":"gpu-node-3","product":"v100-25","v":1}'
    )


@given(records())
@settings(max_examples=200)
def test_round_trip(record: AllocationRecord) -> None:
    text = record.encode()
    if len(text.encode("utf-8")) <= MAX_ENCODED_BYTES:
        assert decode(text) == record
        assert decode(text).encode() == text  # equal records encode to equal strings
    else:
        with pytest.raises(RecordError, match="longer than"):
            decode(text)


def test_eight_whole_cards_with_long_names_fit_the_budget() -> None:
    record = AllocationRecord("u" * 36, "n" * 253, tuple(f"GPU-{i:036d}" for i in range(8)), "v100-100", 1000, 32768)
    assert decode(record.encode()) == record


def test_missing_product_reads_as_none() -> None:
    doc = good_doc()
    del doc["product"]
    assert decode(json.dumps(doc)).product is None


def test_unknown_fields_are_ignored_within_a_version() -> None:
    doc = good_doc() | {"hint": "added by a later v1 writer"}
    assert decode(json.dumps(doc)) == GOOD


# ---- rejections ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not JSON: Expecting value at position 0"),
        ("{", "not JSON"),
        ("gpu-node-3", "not JSON"),
        ("[]", "must be a JSON object"),
        ("42", "must be a JSON object"),
        ("null", "must be a JSON object"),
        ("[" * 2048 + "]" * 2048, "nests too deeply"),
    ],
)
def test_malformed_json(text: str, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        decode(text)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("v", "1"),
        ("v", True),
        ("v", 1.0),
        ("claim", 7),
        ("node", None),
        ("gpus", "GPU-1"),
        ("gpus", {"GPU-1": 1}),
        ("milli", "250"),
        ("milli", True),
        ("milli", 250.0),
        ("mib", [8192]),
        ("product", 25),
    ],
)
def test_wrong_types(field: str, value: object) -> None:
    doc = good_doc() | {field: value}
    with pytest.raises(RecordError, match=f"field '{field}' has the wrong type"):
        decode(json.dumps(doc))


def test_gpu_uuids_must_be_strings() -> None:
    with pytest.raises(RecordError, match="field 'gpus' must list GPU uuid strings"):
        decode(json.dumps(good_doc() | {"gpus": [0]}))


@pytest.mark.parametrize("field", ["v", "claim", "node", "gpus", "milli", "mib"])
def test_missing_fields(field: str) -> None:
    doc = good_doc()
    del doc[field]
    with pytest.raises(RecordError, match=f"allocation record lacks {field}$"):
        decode(json.dumps(doc))


def test_several_missing_fields_are_all_named() -> None:
    with pytest.raises(RecordError, match="lacks claim, gpus, node"):
        decode('{"v":1,"milli":250,"mib":0}')


def test_future_version_says_newer() -> None:
    with pytest.raises(RecordError, match=f"version {VERSION + 1} was written by a newer gpuslice"):
        decode(json.dumps(good_doc() | {"v": VERSION + 1}))


def test_newer_version_wins_over_missing_fields() -> None:
    # a newer writer may have renamed fields: "upgrade me" is the useful message, not "lacks node"
    with pytest.raises(RecordError, match="newer"):
        decode('{"v":2,"claim":"c","place":"elsewhere"}')


@pytest.mark.parametrize("version", [0, -1])
def test_invalid_old_version(version: int) -> None:
    with pytest.raises(RecordError, match=f"version {version} is not valid"):
        decode(json.dumps(good_doc() | {"v": version}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus": []}, "at least one GPU"),
        ({"gpus": [""]}, "at least one GPU"),
        ({"gpus": ["GPU-1", "GPU-1"], "milli": 1000}, "each GPU once"),
        ({"gpus": ["GPU-1", "GPU-2"]}, "only whole cards may span several GPUs"),
        ({"milli": 0}, "bad size: 0 milli"),
        ({"milli": 1001}, "bad size: 1001 milli"),
        ({"mib": -1}, "bad size: 250 milli, -1 MiB"),
        ({"claim": ""}, "must not be empty"),
        ({"node": ""}, "must not be empty"),
    ],
)
def test_invalid_contents(change: dict[str, object], message: str) -> None:
    with pytest.raises(RecordError, match=message):
        decode(json.dumps(good_doc() | change))


def test_oversize_input_is_rejected_before_parsing() -> None:
    with pytest.raises(RecordError, match=f"longer than {MAX_ENCODED_BYTES} bytes"):
        decode(json.dumps(good_doc() | {"node": "n" * MAX_ENCODED_BYTES}))


def test_size_limit_counts_bytes_not_characters() -> None:
    text = json.dumps(good_doc() | {"pad": "é" * 2100}, ensure_ascii=False)
    assert len(text) < MAX_ENCODED_BYTES < len(text.encode("utf-8"))
    with pytest.raises(RecordError, match="longer than"):
        decode(text)


def test_non_string_input() -> None:
    with pytest.raises(RecordError, match="must be a string, got bytes"):
        decode(GOOD.encode().encode())  # type: ignore[arg-type]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["v", "claim", "node", "gpus", "product", "milli", "mib", "x"]),
                       json_values | st.integers(-2, 2), max_size=8))
@settings(max_examples=300)
def test_any_json_object_decodes_or_raises_record_error(doc: dict[str, object]) -> None:
    try:
        record = decode(json.dumps(doc))
    except RecordError:
        return
    assert record.version == doc["v"] and record.gpus == tuple(doc["gpus"])  # type: ignore[arg-type]


@given(st.text(max_size=200))
def test_any_text_decodes_or_raises_record_error(text: str) -> None:
    try:
        record = decode(text)
    except RecordError:
        return
    assert decode(record.encode()) == record


# ---- record_of_pod: the record the extender wrote for this very pod, on this node ---------------------------

def carrying(record: AllocationRecord | str | None, uid: object = GOOD.claim_uid) -> dict[str, Any]:
    annotations = {} if record is None else {ANNOTATION: record if isinstance(record, str) else record.encode()}
    return {"metadata": {"uid": uid, "annotations": annotations}, "spec": {"nodeName": GOOD.node}}


@given(records())
@settings(max_examples=200)
def test_a_pod_gets_back_the_record_written_for_it(record: AllocationRecord) -> None:
    pod = carrying(record.encode(), uid=record.claim_uid)
    if len(record.encode().encode()) <= MAX_ENCODED_BYTES:
        assert record_of_pod(pod, record.node) == record


@given(records(), names, names)
@settings(max_examples=200)
def test_a_record_is_refused_on_any_other_pod_or_node(record: AllocationRecord, uid: str, node: str) -> None:
    if len(record.encode().encode()) > MAX_ENCODED_BYTES:
        return
    if uid != record.claim_uid:
        with pytest.raises(RecordRefused, match="not this pod") as e:
            record_of_pod(carrying(record, uid), record.node)
        assert e.value.reason == OTHER_POD
    if node != record.node:
        with pytest.raises(RecordRefused, match="names node") as e:
            record_of_pod(carrying(record, record.claim_uid), node)
        assert e.value.reason == OTHER_NODE


def test_a_copy_on_another_pod_is_refused_whatever_else_it_says() -> None:
    with pytest.raises(RecordRefused, match=f"names claim {GOOD.claim_uid}, not this pod") as e:
        record_of_pod(carrying(GOOD, uid="another-pod"), GOOD.node)
    assert e.value.reason == OTHER_POD and isinstance(e.value, RecordError)
    for uid in (None, "", 7):  # a pod without a uid is no pod the extender wrote for
        with pytest.raises(RecordRefused):
            record_of_pod(carrying(GOOD, uid=uid), GOOD.node)


def test_no_record_is_none_and_a_broken_one_is_unreadable() -> None:
    assert record_of_pod(carrying(None), GOOD.node) is None
    assert record_of_pod({}, GOOD.node) is None
    assert record_of_pod({"metadata": {"annotations": None}}, GOOD.node) is None
    for broken in ("{nope", json.dumps({**good_doc(), "v": 9}), "[]"):
        with pytest.raises(RecordRefused, match="unreadable") as e:
            record_of_pod(carrying(broken), GOOD.node)
        assert e.value.reason == UNREADABLE


@given(st.dictionaries(st.sampled_from(["metadata", "spec", "x"]),
                       json_values | st.fixed_dictionaries({"uid": json_values, "annotations": st.dictionaries(
                           st.sampled_from([ANNOTATION, "y"]), json_values | st.just(GOOD.encode()))})))
@settings(max_examples=300)
def test_any_pod_object_reads_as_a_record_none_or_a_refusal(pod: dict[str, Any]) -> None:
    try:
        record = record_of_pod(pod, GOOD.node)
    except RecordRefused:
        return
    assert record is None or (record == GOOD and pod["metadata"]["uid"] == GOOD.claim_uid)
