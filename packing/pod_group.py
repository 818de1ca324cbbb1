"""How a pod says it is one of a gang: the label ``gpuslice.io/pod-group`` (the group's name, unique in
its namespace) and the annotation ``gpuslice.io/pod-group-size`` (how many pods the group has).

The group starts all together or not at all (``packing.group_book``). Kueue's pair maps one to one:
``kueue.x-k8s.io/pod-group-name`` is our label, ``kueue.x-k8s.io/pod-group-total-count`` our
annotation (README, "Pod groups"). ``group_of`` reads them; ``members_disagree`` is the webhook's
check of a new member against the members already created.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from packing.claims import MemberOf

GROUP_LABEL = "gpuslice.io/pod-group"
SIZE_ANNOTATION = "gpuslice.io/pod-group-size"
_SIZE = re.compile(r"[1-9][0-9]{0,5}")  # ASCII digits only: a positive whole number, no sign, no spaces
TERMINAL = ("Succeeded", "Failed")


class GroupError(ValueError):
    """A pod's pod-group label or size that gpuslice cannot take; the message says which and why."""


def _meta(pod: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = (pod.get("metadata") or {}).get(key) or {}
    if not isinstance(value, Mapping):
        raise GroupError(f"Pod.metadata.{key} must be an object")
    return value


def group_of(pod: Mapping[str, Any], max_size: int | None = None) -> MemberOf | None:
    """The pod's group (None when it names none); GroupError for a label without a size, a size
    without a label, or a size that is not a whole number from 1 to ``max_size``."""
    name = _meta(pod, "labels").get(GROUP_LABEL)
    size = _meta(pod, "annotations").get(SIZE_ANNOTATION)
    if name is None and size is None:
        return None
    # the admission policy (deploy/chart/templates/admission-policy.yaml) says the same words
    if name is None:
        raise GroupError(f"the annotation {SIZE_ANNOTATION}={size} without the label {GROUP_LABEL}: name the pod "
                         "group its pods belong to, or drop the annotation")
    if not isinstance(name, str) or not name:
        raise GroupError(f"the label {GROUP_LABEL} must name the pod group")
    if size is None:
        raise GroupError(f"the label {GROUP_LABEL}={name} without the annotation {SIZE_ANNOTATION}: say how many "
                         "pods the group has, on every member")
    if not isinstance(size, str) or not _SIZE.fullmatch(size):
        raise GroupError(f"{SIZE_ANNOTATION} {size} is not a positive whole number")
    count = int(size)
    if max_size is not None and count > max_size:
        raise GroupError(f"annotation {SIZE_ANNOTATION}={size}: gpuslice binds at most {max_size} pods of a group "
                         "at once (--bind-threads); use fewer pods with more cards each, or raise --bind-threads")
    return MemberOf(name, count)


def effective_scheduler(pod: Mapping[str, Any], routed_to: str | None) -> str:
    """The scheduler a pod will have once the webhook routed it (a pod naming another keeps it)."""
    name = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
    return routed_to if routed_to and name == "default-scheduler" else str(name)


def _alive(pod: Mapping[str, Any]) -> bool:
    """Not finished and not being deleted: a member its group still counts."""
    finished = (pod.get("status") or {}).get("phase") in TERMINAL
    return not finished and not (pod.get("metadata") or {}).get("deletionTimestamp")


def members_disagree(pod: Mapping[str, Any], tag: MemberOf, others: Iterable[Mapping[str, Any]],
                     routed_to: str | None) -> str | None:
    """Why ``pod`` cannot join its group, given the group's other pods as the API lists them (terminal
    and deleted ones do not count); None when it may. The webhook's check: members must agree on the
    size and on the scheduler, and a group takes no more pods than its size."""
    scheduler = effective_scheduler(pod, routed_to)
    uid = (pod.get("metadata") or {}).get("uid")
    live = [o for o in others if _alive(o) and (o.get("metadata") or {}).get("uid") != uid]
    for o in live:
        other = (o.get("metadata") or {}).get("name", "?")
        said = ((o.get("metadata") or {}).get("annotations") or {}).get(SIZE_ANNOTATION)
        if said != str(tag.size):
            return (f"pod group {tag.name}: member {other} says {SIZE_ANNOTATION}={said}, this pod says {tag.size}; "
                    "every member must say the same size")
        theirs = (o.get("spec") or {}).get("schedulerName") or "default-scheduler"
        if theirs != scheduler:
            return (f"pod group {tag.name}: member {other} is scheduled by {theirs}, this pod by {scheduler}; "
                    "the members of a group must ask for one scheduler")
    if len(live) >= tag.size:
        return (f"pod group {tag.name} already has its {tag.size} member(s) "
                f"({', '.join(sorted((o.get('metadata') or {}).get('name', '?') for o in live)[:5])}); "
                "a group takes no more pods than its size")
    return None
