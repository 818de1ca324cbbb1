"""The group book (``packing.group_book``): membership, validity, the group's place and entry."""

from __future__ import annotations

import pytest

from packing.claims import MemberOf, QueueError, WaitingClaim
from packing.group_book import GroupBook, GroupRequest, entry_id, is_entry
from packing.products import load_catalog

CATALOG = load_catalog()
W = CATALOG.request("v100-100")
H = CATALOG.request("v100-50")


def member(name: str, size: int, at: float = 0.0, group: str = "train", ns: str = "team", priority: int = 0,
           request: object = W) -> WaitingClaim:
    return WaitingClaim(name, ns, request, arrived_at=at, priority=priority,  # type: ignore[arg-type]
                        group=MemberOf(group, size))


@pytest.mark.parametrize(("waiting", "running", "complete", "invalid"), [
    # (declared sizes of the waiting members, of the running ones), complete?, why invalid (a fragment)
    ((3, 3, 3), (), True, None),
    ((3, 3), (), False, None),  # waits for members
    ((3,), (3, 3), True, None),  # the rest of a group whose members were re-created
    ((), (3, 3, 3), False, None),  # everyone runs: nothing waits
    ((3, 3, 2), (), False, "disagree"),
    ((2, 2, 2), (), False, "3 pods are members of a group of 2"),
    ((1,), (), True, None),
])
def test_a_group_is_complete_only_when_valid_with_every_member(
        waiting: tuple[int, ...], running: tuple[int, ...], complete: bool, invalid: str | None) -> None:
    book = GroupBook()
    seq = 0
    for i, size in enumerate(waiting):
        seq += 1
        book.wait(member(f"w{i}", size, at=i), seq)
    for i, size in enumerate(running):
        seq += 1
        book.run(f"r{i}", "team", MemberOf("train", size), 10.0, seq)
    book.verify()
    g = book.get("team", "train")
    assert g is not None
    assert g.complete is complete
    why = g.invalid()
    assert (why is None) == (invalid is None)
    if invalid is not None:
        assert why is not None and invalid in why


def test_the_group_keeps_its_first_members_place_and_the_least_priority() -> None:
    book = GroupBook()
    book.wait(member("b", 2, at=5.0, priority=3), 7)
    book.wait(member("a", 2, at=2.0, priority=1), 9)  # arrived earlier, seen later (watch order)
    g = book.get("team", "train")
    assert g is not None
    assert (g.arrived_at, g.seq, g.priority) == (2.0, 9, 1)
    assert [w.claim for w in g.members()] == ["a", "b"]
    entry = g.entry_claim()
    assert entry.claim == entry_id("team", "train") and is_entry(entry.claim)
    # a complete group's shape is its members, counted: groups asking alike share it
    assert isinstance(entry.request, GroupRequest) and entry.request.members == frozenset({(W, 2)})
    book.wait(member("c", 3, at=9.0, group="other"), 10)
    other = book.get("team", "other")
    assert other is not None and not other.complete
    shape = other.entry_claim().request
    assert isinstance(shape, GroupRequest) and (shape.members, shape.group) == (None, other.entry)
    assert (entry.arrived_at, entry.priority, entry.product) == (2.0, 1, "v100-100")
    # a member leaving keeps the place; the last one leaving forgets the group
    book.leave("a")
    assert g.arrived_at == 2.0 and book.get("team", "train") is g
    book.leave("b")
    assert book.get("team", "train") is None and len(book) == 1
    book.verify()


def test_members_of_several_products_make_a_mixed_entry_and_groups_are_per_namespace() -> None:
    book = GroupBook()
    book.wait(member("a", 2, request=W), 1)
    book.wait(member("b", 2, request=H), 2)
    book.wait(member("c", 1, ns="other"), 3)
    g = book.get("team", "train")
    assert g is not None and g.entry_claim().product == "mixed"
    assert len(book) == 2 and book.of("c") is book.get("other", "train")
    assert book.waiting_members() == 3 and book.lined() == 2
    book.run("a", "team", MemberOf("train", 2), 1.0, 1)
    book.run("b", "team", MemberOf("train", 2), 1.0, 2)
    assert book.waiting_members() == 1 and book.lined() == 1
    book.verify()


def test_a_running_member_goes_back_to_waiting_at_its_old_place() -> None:
    book = GroupBook()
    w = member("a", 1)
    book.wait(w, 4)
    book.run("a", "team", MemberOf("train", 1), 1.0, 4)
    g = book.back(w, 4)
    assert g.waiting == {"a": (w, 4)} and not g.running
    book.verify()


def test_bad_member_tags_are_refused() -> None:
    with pytest.raises(QueueError, match="size"):
        MemberOf("train", 0)
    with pytest.raises(QueueError, match="size"):
        MemberOf("train", True)
    with pytest.raises(QueueError, match="name"):
        MemberOf("", 2)
    with pytest.raises(QueueError, match="MemberOf"):
        WaitingClaim("a", "team", W, arrived_at=0, group=("train", 2))  # type: ignore[arg-type]
