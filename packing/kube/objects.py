"""Reading API objects (dicts as the API server sends them): a nested field, without trusting their shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def field(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None where a level is missing or not an object."""
    cur = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur
