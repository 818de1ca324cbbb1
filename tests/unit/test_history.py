"""The demand history: its format (``packing.demand``), the extender's book (``extender.history.book``)
and ``GET /history`` on the standalone app."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from extender.app import create_app
from extender.config import ExtenderConfig
from extender.history.book import DemandBook
from extender.samples import binding_args, filter_args, pod
from extender.standalone import build_state
from extender.state import ExtenderState
from packing.asks import PodAsk
from packing.demand import (
    DEPARTED,
    LOST,
    WITHDRAWN,
    DemandError,
    DemandRow,
    HistoryHeader,
    catalog_differences,
    catalog_signature,
    constraints_from_json,
    constraints_to_json,
    parse_header,
    parse_row,
    parse_since,
)
from packing.node_fit import NodeConstraints, Requirement, Term, Toleration
from packing.products import load_catalog, parse_catalog

CATALOG = load_catalog()
NAMES = ["node-0", "node-1", "node-2"]


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ask(uid: str, product: str = "v100-25", **kw: Any) -> PodAsk:
    return PodAsk(uid, f"pod-{uid}", kw.pop("namespace", "team-a"), CATALOG.request(product, kw.pop("count", 1)),
                  **kw)


# ---- the format --------------------------------------------------------------------------------------


def test_a_row_round_trips_through_its_json_line_relative_to_an_origin() -> None:
    c = NodeConstraints((("pool", "a"),), (Term((Requirement("zone", "In", ("x", "y")),), ()),),
                        (Toleration("gpu", "Exists", "", "NoSchedule"),))
    row = DemandRow("u1", 1000.5, "v100-100", 2, "team-b", 5, None, c, 3600.0, "team-b/train", 1010.0, "n1",
                    ("g1", "g2"), DEPARTED, 1510.0)
    doc = json.loads(row.encode(origin=1000.0))
    assert doc["arrival"] == 0.5 and doc["admitted"] == 10.0 and doc["end"] == 510.0 and doc["duration"] == 500.0
    assert doc["gpus"] == "g1|g2" and doc["constraints"]["selector"] == {"pool": "a"}
    back = parse_row(doc)
    assert back == DemandRow("u1", 0.5, "v100-100", 2, "team-b", 5, None, c, 3600.0, "team-b/train", 10.0, "n1",
                             ("g1", "g2"), DEPARTED, 510.0)
    assert constraints_from_json(constraints_to_json(c)) == c


@pytest.mark.parametrize(("doc", "message"), [
    ({"arrival": 1}, "claim id"),
    ({"claim": "x", "arrival": -1}, "arrival must be a finite non-negative"),
    ({"claim": "x", "arrival": 1, "ended": "gone"}, "ended must be one of"),
    ({"claim": "x", "arrival": 1, "admitted": 2}, "names its node"),
    ({"claim": "x", "arrival": 5, "end": 2, "ended": "withdrawn"}, "before it arrives"),
    ({"claim": "x", "arrival": 1, "colour": "red"}, "unknown field(s) colour"),
    ({"claim": "x", "arrival": 1, "constraints": {"selector": 3}}, "constraints must be"),
    ({"claim": "x", "arrival": 0, "admitted": 1, "node": "n", "gpus": "g", "ended": "departed", "end": 5,
      "duration": 7}, "is not end - admitted"),
])
def test_bad_rows_say_what_is_wrong(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(DemandError, match=re.escape(message)):
        parse_row(doc)


def test_a_header_round_trips_and_a_foreign_version_is_refused() -> None:
    h = HistoryHeader(1e9, 0.0, 86400.0, 10.0, ((5.0, 7.0),), catalog_signature(CATALOG), True, 3)
    assert parse_header(json.loads(h.encode())) == h
    assert h.gap_seconds == 2.0
    with pytest.raises(DemandError, match="version 2"):
        parse_header({"gpuslice_history": 2})


def test_catalog_differences_name_the_products() -> None:
    other = parse_catalog({"resource_prefix": "gpuslice.io", "models": [{"name": "Tesla-V100-*-32GB",
                                                                           "memory_mib": 32768}],
                           "products": [{"name": "v100-25", "model": "Tesla-V100-*-32GB", "milli": 250,
                                         "memory_mib": 8192}, {"name": "v100-33", "model": "Tesla-V100-*-32GB",
                                                               "milli": 500, "memory_mib": 16384}]})
    diff = catalog_differences(catalog_signature(other), CATALOG)
    assert diff == ["v100-100 (only in this catalog)", "v100-33 (only in the history's)",
                    "v100-50 (only in this catalog)"]
    assert catalog_differences(catalog_signature(CATALOG), CATALOG) == []


def test_since_takes_a_duration_unix_seconds_or_a_zoned_time() -> None:
    now = 1_800_000_000.0
    assert parse_since("7d", now) == now - 7 * 86400
    assert parse_since("90m", now) == now - 5400
    assert parse_since("1700000000", now) == 1_700_000_000.0
    assert parse_since("2026-01-01T00:00:00Z", now) == 1767225600.0
    for bad in ("yesterday", "2026-01-01T00:00:00", "-5", "7 parsecs"):
        with pytest.raises(ValueError, match=r"^since "):
            parse_since(bad, now)  # each message says which forms ``since`` takes


# ---- the book ----------------------------------------------------------------------------------------


def rows_of(data: bytes) -> tuple[HistoryHeader, list[DemandRow]]:
    lines = data.decode().splitlines()
    return parse_header(json.loads(lines[0])), [parse_row(json.loads(x)) for x in lines[1:]]


def test_the_book_records_arrival_admission_departure_and_withdrawal_in_order() -> None:
    clock = Clock()
    book = DemandBook(CATALOG, clock=clock)
    book.arrived(ask("a"))
    book.arrived(ask("b", "v100-100", count=2, priority=3, time_limit_s=600.0))
    book.arrived(ask("a"))  # known: keeps its row
    clock.t += 10
    book.admitted("a", "n1", ["g1"])
    book.admitted("a", "n2", ["g9"])  # the first admission stands
    clock.t += 5
    book.departed("a")
    book.withdrawn("b")
    book.arrived(ask("c", "v100-50"))
    header, rows = rows_of(book.export())
    by = {r.claim: r for r in rows}
    assert header.claims == 3 and header.gaps == () and header.names is False
    assert by["a"].ended == DEPARTED and by["a"].node == "n1" and by["a"].runtime == pytest.approx(5.0)
    assert by["b"].ended == WITHDRAWN and by["b"].count == 2 and by["b"].priority == 3 and by["b"].time_limit == 600
    assert by["c"].open and by["c"].admitted is None
    assert all(r.name is None for r in rows)  # no pod names unless asked
    # the clock is strictly increasing: every recorded time differs, so the order is exact
    times = [t for r in rows for t in (r.arrival, r.admitted, r.end) if t is not None]
    assert len(set(times)) == len(times)


def test_pod_names_only_when_asked() -> None:
    book = DemandBook(CATALOG, names=True)
    book.arrived(ask("a"))
    _, rows = rows_of(book.export())
    assert rows[0].name == "team-a/pod-a"


def test_the_age_and_size_bounds_drop_the_oldest_closed_rows_and_say_since_when_it_is_complete() -> None:
    clock = Clock()
    book = DemandBook(CATALOG, max_age_s=100.0, max_bytes=2048, clock=clock)
    for i in range(40):
        clock.t += 1
        book.arrived(ask(f"c{i}"))
        book.withdrawn(f"c{i}")
    assert book.closed_bytes <= 2048 and book.dropped > 0
    header, rows = rows_of(book.export())
    assert all(r.arrival >= header.complete_since for r in rows)  # everything since then is there
    first_kept = min(r.arrival for r in rows)
    assert header.complete_since <= first_kept
    clock.t += 500  # all ended more than max_age ago: the next close prunes them
    book.arrived(ask("late"))
    book.withdrawn("late")
    _, rows = rows_of(book.export())
    assert [r.claim for r in rows] == ["late"]


def test_lost_claims_and_gaps_after_a_restore() -> None:
    clock = Clock()
    book = DemandBook(CATALOG, clock=clock)
    book.arrived(ask("a"))
    book.admitted("a", "n1", ["g1"])
    book.arrived(ask("b"))
    saved = book.open_rows()
    clock.t += 100
    fresh = DemandBook(CATALOG, clock=clock)
    fresh.restore(saved, book.started, book.started, [])
    fresh.add_gap(clock.t - 50, clock.t)
    assert fresh.lost(["b"], clock.t - 50) == 1  # a ended unseen; b still waits
    header, rows = rows_of(fresh.export())
    by = {r.claim: r for r in rows}
    assert by["a"].ended == LOST and by["a"].runtime is None and by["b"].open
    assert len(header.gaps) == 1 and header.gap_seconds == pytest.approx(50)


# ---- GET /history ------------------------------------------------------------------------------------


def setup(**overrides: Any) -> tuple[ExtenderState, FlaskClient]:
    config = ExtenderConfig(standalone=True, nodes=3, gpus_per_node=2, **overrides)
    state = build_state(config, CATALOG)
    return state, create_app(state, config).test_client()


def post(client: FlaskClient, path: str, doc: Any) -> Any:
    return client.post(path, data=json.dumps(doc), content_type="application/json")


def test_get_history_serves_what_the_extender_saw() -> None:
    state, client = setup()
    a, big, gone = pod("a", "v100-50"), pod("big", "v100-100", count=4), pod("gone", "v100-25")
    node = post(client, "/filter", filter_args(a, NAMES)).get_json()["NodeNames"][0]
    post(client, "/bind", binding_args(a, node))
    post(client, "/filter", filter_args(big, NAMES))  # fits nowhere: waits
    post(client, "/filter", filter_args(gone, NAMES))  # reserved, never bound, then released
    post(client, "/admin/release", {"PodUID": gone["metadata"]["uid"]})
    post(client, "/admin/release", {"PodUID": a["metadata"]["uid"]})
    reply = client.get("/history")
    assert reply.status_code == 200 and reply.mimetype == "application/x-ndjson"
    header, rows = rows_of(reply.get_data())
    by = {r.claim: r for r in rows}
    assert header.catalog == catalog_signature(CATALOG)
    assert by[a["metadata"]["uid"]].ended == DEPARTED and by[a["metadata"]["uid"]].node == node
    assert by[big["metadata"]["uid"]].open and by[big["metadata"]["uid"]].count == 4
    assert by[gone["metadata"]["uid"]].ended == WITHDRAWN
    assert state.history is not None


def test_get_history_checks_since_and_says_when_it_is_off() -> None:
    _, client = setup()
    bad = client.get("/history?since=yesterday")
    assert bad.status_code == 400 and "since must be" in bad.get_json()["error"]
    assert client.get("/history?since=1h").status_code == 200
    _, off = setup(history=False)
    assert off.get("/history").status_code == 404


def test_get_history_answers_only_loopback_or_an_allowed_certificate() -> None:
    _, client = setup()
    far = client.get("/history", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert far.status_code == 403
