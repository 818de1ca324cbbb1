"""The cluster ledger: inventory, assign/release/reserve, indexes, accounting and explanations."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from packing.ledger import Allocation, GpuShare, Ledger, LedgerError, Misfit, NoFit, UnknownClaim
from packing.products import Catalog, Request, load_catalog
from packing.record import decode

V100 = "Tesla-V100-SXM2-32GB"
T4 = "Tesla-T4"
CATALOG: Catalog = load_catalog()
Q = CATALOG.request("v100-25")
H = CATALOG.request("v100-50")
W = CATALOG.request("v100-100")


def cards(node: str, n: int, model: str = V100, mib: int = 32768) -> list[tuple[str, str, int]]:
    return [(f"{node}-gpu{i}", model, mib) for i in range(n)]


def ledger_with(*shape: int, cpu: int | None = None, mem: int | None = None) -> Ledger:
    """A ledger with nodes n0, n1, ... of ``shape[i]`` V100 cards each."""
    ledger = Ledger()
    for i, n in enumerate(shape):
        ledger.add_node(f"n{i}", cards(f"n{i}", n), cpu_milli=cpu, memory_mib=mem)
    return ledger


def unchanged_after(ledger: Ledger, op: Callable[[], object], error: type[Exception], match: str) -> None:
    """``op`` raises ``error`` matching ``match`` and leaves the ledger exactly as it was."""
    before = ledger.fingerprint()
    with pytest.raises(error, match=match):
        op()
    assert ledger.fingerprint() == before
    ledger.verify()


# ---- inventory -----------------------------------------------------------------------------------


def test_add_node_indexes_every_card() -> None:
    ledger = ledger_with(2, 1)
    assert ledger.capacity_milli() == ledger.free_milli() == 3000
    assert [g.uuid for g in ledger.gpus_from(V100, 1)] == ["n1-gpu0", "n0-gpu0", "n0-gpu1"]
    assert [n.name for n in ledger.nodes_with_whole(V100, 2)] == ["n0"]
    assert ledger.models() == [V100]
    ledger.verify()


@pytest.mark.parametrize(
    ("name", "gpus", "cpu", "message"),
    [
        ("n0", [("x", V100, 1)], None, "node n0 is already in the ledger"),
        ("", [], None, "a node needs a name"),
        ("n9", [("x", V100, 1), ("x", V100, 1)], None, "GPU uuids must be unique and non-empty"),
        ("n9", [("", V100, 1)], None, "GPU uuids must be unique and non-empty"),
        ("n9", [("n0-gpu1", V100, 1)], None, "GPU n0-gpu1 already belongs to node n0"),
        ("n9", [("x", V100, -1)], None, "capacities must not be negative"),
        ("n9", [], -1, "capacities must not be negative"),
    ],
)
def test_bad_nodes_change_nothing(name: str, gpus: list[tuple[str, str, int]], cpu: int | None, message: str) -> None:
    ledger = ledger_with(2)
    unchanged_after(ledger, lambda: ledger.add_node(name, gpus, cpu_milli=cpu), LedgerError, message)


def test_remove_node_drops_its_allocations_and_reservations() -> None:
    ledger = ledger_with(2, 2)
    ledger.assign("a", Q, "n0", ("n0-gpu0",))
    ledger.assign("b", H, "n0", ("n0-gpu1",), expires_at=10.0)
    ledger.assign("c", W, "n1", ("n1-gpu0",))
    dropped = ledger.remove_node("n0")
    assert sorted(a.claim for a in dropped) == ["a", "b"]
    assert set(ledger.allocations) == {"c"} and "n0-gpu0" not in ledger.gpus
    assert ledger.expire(100.0) == []
    ledger.verify()
    unchanged_after(ledger, lambda: ledger.remove_node("n0"), LedgerError, "node n0 is not in the ledger")


def test_node_without_gpus_holds_gpu_less_claims() -> None:
    ledger = Ledger()
    ledger.add_node("cpu", [], cpu_milli=4000, memory_mib=8192)
    alloc = ledger.assign("job", Request(0, count=0, cpu_milli=1000, host_memory_mib=1024), "cpu", ())
    assert alloc.shares == () and ledger.nodes["cpu"].free_cpu == 3000 and ledger.nodes["cpu"].free_mem == 7168
    ledger.verify()


# ---- assign, release, reserve ------------------------------------------------------------------


def test_assign_then_release_is_identity() -> None:
    ledger = ledger_with(2, cpu=8000, mem=65536)
    before = ledger.fingerprint()
    r = CATALOG.request("v100-100", count=2, cpu_milli=1000, host_memory_mib=2048)
    alloc = ledger.assign("a", r, "n0", ("n0-gpu0", "n0-gpu1"))
    assert ledger.fingerprint() != before
    assert ledger.nodes["n0"].free_gpu_milli == 0 and ledger.nodes["n0"].free_cpu == 7000
    assert ledger.release("a") == alloc
    assert ledger.fingerprint() == before


def test_allocation_record_round_trips() -> None:
    ledger = ledger_with(1)
    alloc = ledger.assign("pod-uid", H, "n0", ("n0-gpu0",))
    record = decode(alloc.record().encode())
    assert (record.claim_uid, record.node, record.gpus, record.product, record.milli, record.memory_mib) == (
        "pod-uid", "n0", ("n0-gpu0",), "v100-50", 500, 16384)


def test_slices_share_a_card_until_it_is_full() -> None:
    ledger = ledger_with(1)
    ledger.assign("a", Q, "n0", ("n0-gpu0",))
    ledger.assign("b", H, "n0", ("n0-gpu0",))
    ledger.assign("c", Q, "n0", ("n0-gpu0",))
    g = ledger.gpus["n0-gpu0"]
    assert (g.free_milli, g.free_mib) == (0, 0)
    unchanged_after(ledger, lambda: ledger.assign("d", Q, "n0", ("n0-gpu0",)), NoFit,
                    "GPU n0-gpu0 has 0 milli / 0 MiB free, needs 250 / 8192")


@pytest.mark.parametrize(
    ("claim", "request_", "node", "gpus", "error", "message"),
    [
        ("held", Q, "n0", ("n0-gpu1",), LedgerError, "claim held already holds an allocation on n0"),
        ("", Q, "n0", ("n0-gpu1",), LedgerError, "a claim needs a uid"),
        ("x", Q, "n7", ("n0-gpu1",), LedgerError, "node n7 is not in the ledger"),
        ("x", Q, "n0", (), LedgerError, r"v100-25 needs 1 distinct GPU\(s\)"),
        ("x", Q, "n0", ("n0-gpu1", "n0-gpu2"), LedgerError, "needs 1 distinct"),
        ("x", Request(1000, 32768, 2), "n0", ("n0-gpu1", "n0-gpu1"), LedgerError, "needs 2 distinct"),
        ("x", Q, "n0", ("n1-gpu0",), LedgerError, "GPU n1-gpu0 is not on node n0"),
        ("x", Q, "n0", ("nope",), LedgerError, "GPU nope is not on node n0"),
        ("x", W, "n0", ("n0-gpu0",), NoFit, "GPU n0-gpu0 has 750 milli"),  # whole card on a used card
        ("x", Request(250, model=T4), "n0", ("n0-gpu1",), NoFit, "needs 250 / 0"),
        ("x", Request(250, 40000), "n0", ("n0-gpu1",), NoFit, "needs 250 / 40000"),
        ("x", Request(250, cpu_milli=9000), "n0", ("n0-gpu1",), NoFit, "node n0 lacks CPU or memory"),
    ],
)
def test_bad_assign_changes_nothing(claim: str, request_: Request, node: str, gpus: tuple[str, ...],
                                    error: type[Exception], message: str) -> None:
    ledger = ledger_with(3, 1, cpu=8000)
    ledger.assign("held", Q, "n0", ("n0-gpu0",))
    unchanged_after(ledger, lambda: ledger.assign(claim, request_, node, gpus), error, message)


def test_unknown_claims() -> None:
    ledger = ledger_with(1)
    message = "claim ghost holds no allocation"
    unchanged_after(ledger, lambda: ledger.release("ghost"), UnknownClaim, message)
    unchanged_after(ledger, lambda: ledger.commit("ghost"), UnknownClaim, message)
    unchanged_after(ledger, lambda: ledger.extend("ghost", 5.0), UnknownClaim, message)
    try:
        ledger.release("ghost")
    except UnknownClaim as e:
        assert str(e) == "claim ghost holds no allocation"  # not KeyError's quoted form
        assert isinstance(e, KeyError) and isinstance(e, LedgerError)


def test_reservation_expires_at_its_deadline_unless_committed() -> None:
    ledger = ledger_with(2)
    ledger.assign("early", Q, "n0", ("n0-gpu0",), expires_at=5.0)
    ledger.assign("late", Q, "n0", ("n0-gpu1",), expires_at=9.0)
    ledger.assign("kept", H, "n0", ("n0-gpu0",), expires_at=5.0)
    assert ledger.allocations["kept"].reserved
    committed = ledger.commit("kept")
    assert not committed.reserved and ledger.commit("kept") == committed  # idempotent
    assert ledger.expire(4.999) == []
    assert [a.claim for a in ledger.expire(5.0)] == ["early"]  # at the deadline, not after
    assert set(ledger.allocations) == {"late", "kept"}
    ledger.verify()


def test_extend_moves_a_reservation() -> None:
    ledger = ledger_with(1)
    ledger.assign("r", Q, "n0", ("n0-gpu0",), expires_at=5.0)
    assert ledger.extend("r", 20.0).expires_at == 20.0
    assert ledger.expire(10.0) == [] and "r" in ledger.allocations
    ledger.verify()
    assert [a.claim for a in ledger.expire(20.0)] == ["r"]
    assert ledger.free_milli() == 1000


def test_extend_refuses_a_committed_claim() -> None:
    ledger = ledger_with(1)
    ledger.assign("c", Q, "n0", ("n0-gpu0",))
    unchanged_after(ledger, lambda: ledger.extend("c", 9.0), LedgerError, "claim c is committed, not reserved")


def test_expire_returns_reservations_in_deadline_order() -> None:
    ledger = ledger_with(4)
    for i, t in enumerate([7.0, 3.0, 5.0, 1.0]):
        ledger.assign(f"r{i}", Q, "n0", (f"n0-gpu{i}",), expires_at=t)
    assert [a.claim for a in ledger.expire(6.0)] == ["r3", "r1", "r2"]


# ---- indexes and accounting --------------------------------------------------------------------


def test_gpu_index_is_tightest_first_then_fullest_node() -> None:
    ledger = ledger_with(2, 2)
    ledger.assign("a", H, "n0", ("n0-gpu1",))
    ledger.assign("b", H, "n1", ("n1-gpu0",))
    ledger.assign("c", Q, "n1", ("n1-gpu1",))
    # n1 has 750 + 500 free = 1250 < n0's 1500: among the 500-free cards, n1's comes first
    assert [g.uuid for g in ledger.gpus_from(V100, 250)] == ["n1-gpu0", "n0-gpu1", "n1-gpu1", "n0-gpu0"]
    assert [g.uuid for g in ledger.gpus_from(V100, 600)] == ["n1-gpu1", "n0-gpu0"]
    assert [g.uuid for g in ledger.gpus_from_largest(V100, 600)] == ["n0-gpu0", "n1-gpu1"]
    assert list(ledger.gpus_from(T4, 0)) == []
    assert [n.name for n in ledger.nodes_by_free_gpu()] == ["n1", "n0"]


def test_free_slices_counts_per_card_and_per_node() -> None:
    ledger = ledger_with(3, 3)
    ledger.assign("a", Q, "n0", ("n0-gpu0",))
    ledger.assign("b", H, "n1", ("n1-gpu0",))
    assert ledger.free_slices(Q) == 3 + 4 + 4 + 2 + 4 + 4
    assert ledger.free_slices(H) == 1 + 2 + 2 + 1 + 2 + 2
    assert ledger.free_slices(W) == 4
    assert ledger.free_slices(CATALOG.request("v100-100", count=2)) == 2
    assert ledger.free_slices(Request(250, 20000)) == 5  # memory-bound: one per card with 24 GiB free
    assert ledger.free_slices(Request(0, count=0)) == 0


def test_verify_catches_a_corrupted_ledger() -> None:
    ledger = ledger_with(2)
    ledger.assign("a", Q, "n0", ("n0-gpu0",))
    ledger.gpus["n0-gpu0"].free_milli += 250  # as if a release forgot the allocation
    with pytest.raises(AssertionError, match="milli not accounted once"):
        ledger.verify()


def test_verify_catches_a_stale_index() -> None:
    ledger = ledger_with(2)
    g = ledger.gpus["n0-gpu1"]
    g.free_milli, g.free_mib = 750, 24576  # taken behind the index's back ...
    ledger.allocations["a"] = Allocation("a", "n0", (GpuShare("n0-gpu1", 250, 8192),), Q)  # ... yet accounted
    with pytest.raises(AssertionError, match="index drifted"):
        ledger.verify()


def test_fingerprint_ignores_operation_order() -> None:
    one, two = ledger_with(2, 1), ledger_with(2, 1)
    one.assign("a", Q, "n0", ("n0-gpu0",))
    one.assign("b", H, "n1", ("n1-gpu0",))
    two.assign("b", H, "n1", ("n1-gpu0",))
    two.assign("a", Q, "n0", ("n0-gpu0",))
    assert one.fingerprint() == two.fingerprint()
    two.release("a")
    assert one.fingerprint() != two.fingerprint()


# ---- explain: one test per Misfit code -----------------------------------------------------------


def explained(ledger: Ledger, request: Request, node: str = "n0") -> Misfit:
    """The misfit for ``request`` on ``node``, checked against fits_on."""
    misfit = ledger.explain(request, node)
    assert misfit is not None
    if node in ledger.nodes:
        assert not ledger.fits_on(ledger.nodes[node], request)
    return misfit


def test_explain_fits() -> None:
    ledger = ledger_with(1)
    assert ledger.explain(Q, "n0") is None and ledger.fits_on(ledger.nodes["n0"], Q)


def test_explain_unknown_node() -> None:
    assert explained(ledger_with(1), Q, "n9") == Misfit("UnknownNode", "gpuslice knows no GPUs on node n9", False)


def test_explain_insufficient_cpu() -> None:
    ledger = ledger_with(1, cpu=4000)
    ledger.assign("a", Request(0, count=0, cpu_milli=3000), "n0", ())
    assert explained(ledger, Request(250, cpu_milli=2000)) == Misfit(
        "InsufficientCPU", "needs 2000m CPU; 1000m free", True)
    assert explained(ledger, Request(250, cpu_milli=5000)).resolvable is False  # more than the node has


def test_explain_insufficient_memory() -> None:
    ledger = ledger_with(1, mem=8192)
    ledger.assign("a", Request(0, count=0, host_memory_mib=6144), "n0", ())
    assert explained(ledger, Request(250, host_memory_mib=4096)) == Misfit(
        "InsufficientMemory", "needs 4096 MiB RAM; 2048 MiB free", True)
    assert explained(ledger, Request(250, host_memory_mib=9000)).resolvable is False


def test_explain_no_matching_gpu() -> None:
    assert explained(ledger_with(1), Request(250, model=T4)) == Misfit(
        "NoMatchingGPU", f"no {T4} GPU on this node (has {V100})", False)
    cpu_only = Ledger()
    cpu_only.add_node("n0", [])
    assert explained(cpu_only, Q).message == "no Tesla-V100-*-32GB GPU on this node (has no GPUs)"


def test_explain_too_large() -> None:
    ledger = Ledger()
    ledger.add_node("n0", cards("n0", 2, "Tesla-V100-SXM2-16GB", 16384))
    assert explained(ledger, Request(500, 20000)) == Misfit(
        "TooLarge", "500-milli is larger than this node's cards", False)
    assert explained(ledger_with(2), CATALOG.request("v100-100", count=4)) == Misfit(
        "TooLarge", "4 x v100-100 is larger than this node's cards", False)


def test_explain_not_enough_whole_gpus() -> None:
    ledger = ledger_with(2)
    ledger.assign("a", Q, "n0", ("n0-gpu0",))
    assert explained(ledger, CATALOG.request("v100-100", count=2)) == Misfit(
        "NotEnoughWholeGPUs", "needs 2 empty card(s); 1 empty here", True)


def test_explain_no_gpu_memory_free() -> None:
    ledger = ledger_with(1)
    ledger.assign("a", Request(250, 30000), "n0", ("n0-gpu0",))
    assert explained(ledger, Request(250, 4096)) == Misfit(
        "NoGPUMemoryFree", "needs 4096 MiB on one GPU; largest free 2768 MiB", True)


def test_explain_no_slice_free() -> None:
    ledger = ledger_with(2)
    ledger.assign("a", W, "n0", ("n0-gpu0",))
    ledger.assign("b", H, "n0", ("n0-gpu1",))
    ledger.assign("c", Q, "n0", ("n0-gpu1",))
    assert explained(ledger, H) == Misfit("NoSliceFree", "no GPU with 500 milli free; largest free 250", True)


def test_change_feed_names_each_node_whose_capacity_changed() -> None:
    """A feed gathers the nodes changed since its last take, each once; labels are not capacity."""
    ledger = ledger_with(2, 2)
    feed = ledger.feed()
    assert feed.take() == set()
    ledger.assign("a", Q, "n0", ("n0-gpu0",))
    ledger.assign("b", Q, "n0", ("n0-gpu1",))
    ledger.withdraw("n1-gpu0")
    assert len(feed) == 2 and feed.take() == {"n0", "n1"}
    ledger.set_facts("n0", {"zone": "a"})
    assert feed.take() == set(), "labels, taints and cordon are not capacity"
    ledger.release("a")
    ledger.add_node("n2", cards("n2", 1))
    ledger.remove_node("n1")
    assert feed.take() == {"n0", "n1", "n2"}
    late = ledger.feed()
    ledger.release("b")
    assert feed.take() == late.take() == {"n0"}, "every feed hears every change from its start on"


def test_a_dropped_feed_costs_the_ledger_nothing() -> None:
    import gc

    ledger = ledger_with(1)
    ledger.feed()  # nobody holds it
    gc.collect()
    assert len(ledger._feeds) == 0
