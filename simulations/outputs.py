"""Where ``simulate`` and ``plan`` write: checked before a run, so a typo'd folder costs no simulation.

``writable_folder`` makes the folder (as ``mkdir -p``) and writes and removes a probe file there:
the only test that holds for every cause (permissions, a read-only or pseudo filesystem, a file
where a folder should be, root's bypass of permission bits). ``OutputError`` names the path.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path


class OutputError(ValueError):
    """A result, table or plot cannot be written where it was asked for."""


def writable_folder(folder: str | Path, what: str) -> Path:
    """``folder``, created if missing; OutputError when nothing can be written into it."""
    p = Path(folder)
    blocker = next((a for a in (p, *p.parents) if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise OutputError(f"cannot write {what} into {folder}: {blocker} is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".gpuslice-probe-"):
            pass
    except OSError as e:
        raise OutputError(f"cannot write {what} into {folder}: {e.strerror or e}") from None
    return p


def check_outputs(files: Iterable[tuple[str | None, str]], folders: Iterable[tuple[str | None, str]]) -> None:
    """Every (path, what) of ``files`` can be written (its folder writable, the path no folder), and
    every (folder, what) of ``folders`` too; None entries were not asked for."""
    for path, what in files:
        if path is None:
            continue
        if Path(path).is_dir():
            raise OutputError(f"cannot write {what} to {path}: it is a folder")
        writable_folder(Path(path).parent, what)
    for folder, what in folders:
        if folder is not None:
            writable_folder(folder, what)
