"""What a real-node run leaves on the machine, written down before it is made, and undone even after a killed run.

A kubelet on containerd changes the host well beyond its temp dir: containerd's shims and the
containers under them outlive containerd by design, the kubelet bind-mounts its root dir onto itself
(shared propagation) and mounts pod volumes, iptables gets KUBE-* chains, cgroups get ``kubepods``,
the install suite adds an address to ``lo`` and sets sysctls, and the CNI plugins write their cache.
A stop undoes it; a run that is killed (SIGKILL, a timeout, an outage) never stops.

So each part that changes the host (``RealNode``, ``FullCluster``, the control planes of the real-node
suites) keeps a :class:`Record` in ``RECORDS`` and writes into it *before* making each thing. Its own
stop ends with :func:`undo` of the record and removes it. The next real-node run, holding
``/tmp/gpuslice-realnode.lock`` (``lock.hold``), first undoes every record whose owner process is dead:
it kills every process the dead run started (they carry its ``TAG`` in their environment, containerd's
shims included, as containerd passes its environment on), the containers under those shims and in the
``kubepods`` cgroups the run made, then unmounts, deletes links, chains, addresses, cgroups and paths.

Only what a record names is touched; nothing is matched by a broad name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

RECORDS = Path("/tmp/gpuslice-realnode.d")
TAG = "GPUSLICE_REALNODE_RUN"  # in the environment of every process a real-node run starts
CGROUPS = Path("/sys/fs/cgroup")
CHAIN_PREFIXES = ("KUBE-", "CNI-")  # the kubelet's, kube-proxy's, the CNI bridge plugin's
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's cache of each sandbox's result, not movable by config


def run_tag() -> str:
    """This run's tag, set once in this process's environment: every process started from here on carries it."""
    tag = os.environ.get(TAG)
    if not tag or not tag.startswith(f"{os.getpid()}-"):  # inherited from a parent run: ours is our own
        tag = os.environ[TAG] = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return tag


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): PIDs are reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Record:
    """One part's record of what it made on the host (a JSON file in ``RECORDS``), kept current as it goes.

    Lists: ``roots`` (temp dirs: unmount under, then remove), ``unmount`` (host dirs to unmount under),
    ``made`` (host paths that did not exist: remove), ``links`` (network links to delete),
    ``addresses`` (``[cidr, device]`` to delete), ``containerd_roots`` (whose sandboxes' CNI cache goes),
    ``pids`` (processes to kill). Maps: ``sysctl`` (path -> the value to put back). Sets of what existed
    before: ``chains_before`` (iptables chains with a prefix of ``CHAIN_PREFIXES``), ``cgroups_before``
    (``kubepods`` cgroups); what appeared since goes.
    """

    def __init__(self, what: str) -> None:
        RECORDS.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"what": what, "owner": os.getpid(), "owner_start": _start_time(os.getpid()),
                                     "tag": run_tag(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.path = RECORDS / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)

    def add(self, key: str, *values: Any) -> None:
        """Append to the list ``key`` (before the thing is made)."""
        items = self.data.setdefault(key, [])
        items += [str(v) if isinstance(v, Path) else v for v in values if v not in items]
        self._write()

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self._write()

    def set_once(self, key: str, value: Any) -> None:
        """Keep the first value (what was there before this part's first change)."""
        if key not in self.data:
            self.put(key, value)

    def before(self) -> None:
        """Note the chains and cgroups the machine has now: those that appear later are this part's."""
        self.set_once("chains_before", sorted(map(list, chains())))
        self.set_once("cgroups_before", sorted(map(str, kubepods_cgroups())))

    def made_if_missing(self, *paths: Path) -> None:
        """Note, for each path that does not exist, its outermost missing ancestor: what creating it creates."""
        self.add("made", *sorted({_outermost_missing(p) for p in paths if not p.exists()}, key=str))

    def close(self) -> list[str]:
        """Undo everything (what a clean stop left too), then drop the record."""
        done = undo(self.data, kill_tagged=False)
        self.path.unlink(missing_ok=True)
        return done


def _records() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []:
        try:
            yield path, json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)  # a record half written: its part had made nothing yet


def _owner_alive(data: dict[str, Any]) -> bool:
    pid = int(data.get("owner") or 0)
    return pid > 0 and _start_time(pid) is not None and _start_time(pid) == data.get("owner_start")


def sweep_left(who: str) -> None:
    """Undo every record a dead run left (call it holding the real-node lock), saying what was found."""
    for path, data in _records():
        if _owner_alive(data):
            continue
        done = undo(data, kill_tagged=True)
        print(f"[{who}] undid what an interrupted run left ({data.get('what')}, started {data.get('started')}): "
              f"{'; '.join(done) or 'nothing left'}", file=sys.stderr)
        path.unlink(missing_ok=True)


# ---- undoing ----------------------------------------------------------------------------------------------

def undo(data: dict[str, Any], kill_tagged: bool) -> list[str]:
    """Undo what ``data`` records, in an order that lets each step work; idempotent. What was done, in words."""
    done: list[str] = []
    roots = [Path(p) for p in data.get("roots") or []]
    victims = set(data.get("pids") or []) | set(_shims_under(roots))
    if kill_tagged and data.get("tag"):
        victims |= set(_tagged(str(data["tag"])))
    victims |= set(_descendants(victims))  # the containers under the shims
    victims |= set(_procs_in(_new_cgroups(data)))  # containers whose shim is gone already
    victims -= {os.getpid(), *_ancestors()}
    killed = _kill(victims)
    if killed:
        done.append(f"killed {killed} process(es)")
    for base in [*roots, *(Path(p) for p in data.get("unmount") or [])]:
        n = _unmount_under(base)
        if n:
            done.append(f"unmounted {n} under {base}")
    ids = [d.name for r in data.get("containerd_roots") or []
           for d in (Path(r) / "io.containerd.grpc.v1.cri" / "sandboxes").glob("*")]
    cached = [f for f in (CNI_CACHE.glob("*") if CNI_CACHE.is_dir() and ids else []) if any(i in f.name for i in ids)]
    for f in cached:
        f.unlink(missing_ok=True)
    if cached:
        done.append(f"{len(cached)} CNI cache file(s)")
    for link in data.get("links") or []:
        if subprocess.run(["ip", "link", "delete", link], capture_output=True).returncode == 0:
            done.append(f"link {link}")
    if "chains_before" in data:
        new = chains() - {tuple(c) for c in data["chains_before"]}
        if new:
            drop_chains(new)
            done.append(f"{len(new)} iptables chain(s)")
    for cidr, device in data.get("addresses") or []:
        if subprocess.run(["ip", "addr", "del", cidr, "dev", device], capture_output=True).returncode == 0:
            done.append(f"address {cidr} on {device}")
    for path, value in (data.get("sysctl") or {}).items():
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() != value:
                Path(path).write_text(value)
                done.append(f"{path} back to {value}")
    for cgroup in sorted(_new_cgroups(data), key=lambda p: -len(p.parts)):
        if _remove_cgroup(cgroup):
            done.append(f"cgroup {cgroup}")
    for path in [*roots, *(Path(p) for p in data.get("made") or [])]:
        if path.exists() or path.is_symlink():
            _unmount_under(path)
            shutil.rmtree(path, ignore_errors=True)
            if path.is_symlink() or path.is_file():
                path.unlink(missing_ok=True)
            done.append(f"removed {path}")
    return done


def _proc_pids() -> Iterator[int]:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            yield int(proc.name)


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pid = _ppid(pid) or 1
        pids.add(pid)
    return pids


def _tagged(tag: str) -> Iterator[int]:
    """Processes whose environment carries ``TAG=tag``."""
    needle = f"{TAG}={tag}".encode()
    for pid in _proc_pids():
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                yield pid


def _shims_under(roots: Iterable[Path]) -> Iterator[int]:
    """containerd's shims of these roots: each runs in its task's bundle, under containerd's state dir."""
    prefixes = [str(r) + "/" for r in roots]
    for pid in _proc_pids() if prefixes else ():
        with contextlib.suppress(OSError):
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if any(cwd.startswith(p) for p in prefixes) and "containerd-shim" in Path(f"/proc/{pid}/comm").read_text():
                yield pid


def _descendants(pids: set[int]) -> Iterator[int]:
    children: dict[int, list[int]] = {}
    for pid in _proc_pids():
        parent = _ppid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    stack = list(pids)
    while stack:
        for child in children.get(stack.pop(), []):
            yield child
            stack.append(child)


def _alive_once(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def _kill(pids: set[int], wait_s: float = 10.0) -> int:
    """SIGKILL ``pids`` and wait until they are gone; how many were alive."""
    alive = _alive_once(pids)
    count = len(alive)
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # our own children: reap them, or they linger as zombies
        alive = {p for p in alive if Path(f"/proc/{p}").exists() and _state(p) != "Z"}
        time.sleep(0.05)
    return count


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _unmount_under(base: Path) -> int:
    """Lazily unmount every mount at or under ``base``, the deepest first; how many."""
    prefix = str(base)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    ours = [m for m in mounts if m == prefix or m.startswith(prefix + "/")]
    for m in sorted(ours, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)
    return len(ours)


def chains() -> set[tuple[str, str, str]]:
    """(command, table, chain) of every iptables chain with a prefix of ``CHAIN_PREFIXES``, IPv4 and IPv6."""
    found = set()
    for command in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            try:
                rules = subprocess.run([command, "-t", table, "-S"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            found |= {(command, table, line.split()[1]) for line in rules.splitlines()
                      if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIXES)}
    return found


def drop_chains(gone: set[tuple[str, str, str]]) -> None:
    """Remove the jumps to ``gone``, then the chains themselves."""
    for command, table in {(c, t) for c, t, _ in gone}:
        names = {chain for c, t, chain in gone if (c, t) == (command, table)}
        rules = subprocess.run([command, "-t", table, "-S"], capture_output=True, text=True).stdout
        for line in rules.splitlines():
            parts = shlex.split(line)
            target = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if parts[:1] == ["-A"] and parts[1] not in names and target in names:
                subprocess.run([command, "-t", table, "-D", *parts[1:]], capture_output=True)
        for chain in names:
            subprocess.run([command, "-t", table, "-F", chain], capture_output=True)
        for chain in names:
            subprocess.run([command, "-t", table, "-X", chain], capture_output=True)


def kubepods_cgroups() -> set[Path]:
    """The kubelet's top cgroups (cgroupfs driver): /sys/fs/cgroup/kubepods (v2) or .../<controller>/kubepods (v1)."""
    return {p for p in [*CGROUPS.glob("kubepods*"), *CGROUPS.glob("*/kubepods*")] if p.is_dir()}


def _new_cgroups(data: dict[str, Any]) -> set[Path]:
    if "cgroups_before" not in data:
        return set()
    return kubepods_cgroups() - {Path(p) for p in data["cgroups_before"]}


def _procs_in(cgroups: Iterable[Path]) -> Iterator[int]:
    for top in cgroups:
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                yield from (int(p) for p in procs.read_text().split())


def _remove_cgroup(top: Path) -> bool:
    """rmdir the cgroup tree, the deepest first (a cgroup dir is removed by rmdir, never by its files)."""
    for _ in range(50):
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                d.rmdir()
        if not top.exists():
            return True
        time.sleep(0.1)
    return False


def _outermost_missing(path: Path) -> Path:
    """The highest ancestor of ``path`` (or itself) that does not exist: what creating it creates."""
    while not path.parent.exists():
        path = path.parent
    return path


def interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP end the run as Ctrl-C does (pytest then tears its fixtures down, which stops every
    part), instead of killing the interpreter on the spot; a second one is not waited for."""
    def raise_interrupt(signum: int, frame: object) -> None:
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # the stop is under way: let it finish
        raise KeyboardInterrupt(f"signal {signum}")

    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) in (signal.SIG_DFL, None):
            signal.signal(s, raise_interrupt)
