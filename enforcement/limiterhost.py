"""The node's side of the in-container limiter: install it, check it, keep the per-slice state directories.

* :func:`install` copies the library the agent's image carries into ``--limiter-dir`` (a host
  directory the agent sees at the same path) and writes the preload file from
  :func:`~enforcement.limiter.preload_line`, both atomically (a temporary name, then a rename: a
  running container keeps the inode it mounted), at every agent start;
* :class:`NodeLimiter` is what ``enforcement.edits`` asks for each container: the mode's edits,
  with the files this node lacks left out and named (``LimiterEdits.missing``), never mounted;
* :func:`make_state_dir` / :func:`release_state_dir`: a slice's state directory, created empty
  (mode 0777: any user of the container locks the ledger) before the container starts, removed
  once no CDI spec mounts it (``enforcement.handoff.Writer`` decides when). The state root is
  0700: nothing outside a container's own mount reaches its ledger.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from enforcement.limiter import LimiterEdits, LimiterHost, LimiterMode, limiter_edits, preload_line


@dataclass(frozen=True, slots=True)
class NodeLimiter:
    """The in-container limiter as this node hands it: a mode and where its files are."""

    mode: LimiterMode = LimiterMode.GPUSLICE
    host: LimiterHost = field(default_factory=LimiterHost)

    def missing(self) -> tuple[str, ...]:
        """Each file the mode mounts that is absent, empty or wrong here, as ``path: why``."""
        out: list[str] = []
        for path, want in self.host.files(self.mode):
            try:
                data = Path(path).read_bytes() if want is not None else b""
                size = os.stat(path).st_size
            except OSError as e:
                out.append(f"{path}: {e.strerror or e}")
                continue
            if not Path(path).is_file():
                out.append(f"{path}: not a regular file")
            elif want is None and size == 0:
                out.append(f"{path}: empty")
            elif want is not None and data.decode(errors="replace") != want:
                out.append(f"{path}: holds {data[:80]!r}, not {want!r}")
        return tuple(out)

    def edits(self, cap_mib: int, devices: int, key: str) -> LimiterEdits:
        """:func:`~enforcement.limiter.limiter_edits` for this node, as its files are now."""
        return limiter_edits(cap_mib, devices, key, self.mode, self.host, self.missing())


def _write_atomic(path: Path, data: bytes, mode: int) -> bool:
    """Replace ``path`` with ``data`` unless it holds it already; True when written."""
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            os.chmod(path, mode)
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)  # a container that mounted the old file keeps its inode
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return True


def install(limiter: NodeLimiter, source: Path | None) -> list[str]:
    """Install what ``limiter.mode`` needs into its host directory; what was done, as lines to log.

    Our library is copied from ``source`` (the agent image's build; None or absent: what is
    installed stays, and :meth:`NodeLimiter.missing` says what is lacking). The state root and,
    for HAMi-core, its lock directory are created. Raises OSError when the directory cannot be
    written.
    """
    host, done = limiter.host, []
    state_root = Path(host.state_root)
    state_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_root, 0o700)
    if limiter.mode is LimiterMode.GPUSLICE:
        library = Path(host.library)
        if source is not None and source.is_file():
            if _write_atomic(library, source.read_bytes(), 0o755):
                done.append(f"installed {library} from {source}")
        elif source is not None:
            done.append(f"no limiter library at {source} to install")
        if _write_atomic(Path(host.preload_file), preload_line(limiter.mode).encode(), 0o644):
            done.append(f"wrote {host.preload_file}")
    elif limiter.mode is LimiterMode.HAMI:
        lock = Path(host.hami_lock_dir)
        lock.mkdir(parents=True, exist_ok=True)
        os.chmod(lock, 0o1777)  # HAMi-core's processes of any user lock there; sticky, as /tmp
        if host.hami_library is not None and _write_atomic(
                Path(host.hami_preload_file), preload_line(limiter.mode).encode(), 0o644):
            done.append(f"wrote {host.hami_preload_file}")
    return done


def make_state_dir(path: str) -> None:
    """Create a slice's state directory (and the 0700 state root above it), or accept it as is."""
    directory = Path(path)
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o777)
    except FileExistsError:
        if directory.is_symlink() or not directory.is_dir():
            raise NotADirectoryError(f"{directory} exists and is not a directory") from None
    os.chmod(directory, 0o777)  # mkdir's mode passed through the umask


def release_state_dir(path: str, state_root: str) -> bool:
    """Remove a state directory that is a child of ``state_root``; False when there was none.

    Anything elsewhere (a spec written under another ``--limiter-dir``) is left alone: ValueError.
    """
    directory = Path(path)
    if directory.parent != Path(state_root) or directory.name in ("", ".", ".."):
        raise ValueError(f"{path} is not a state directory under {state_root}")
    try:
        shutil.rmtree(directory)  # symlinks a container left inside are removed, never followed
    except FileNotFoundError:
        return False
    return True


def state_dirs(state_root: str) -> list[str]:
    """Every state directory under ``state_root`` now."""
    with contextlib.suppress(FileNotFoundError):
        return sorted(str(p) for p in Path(state_root).iterdir() if p.is_dir() and not p.is_symlink())
    return []
