"""Run a runc container in a pod-shaped cgroup and see what runc makes of our freezes (root only).

``python -m tests.unit.runc_probe VIEW WORKDIR`` runs in a private mount namespace (the caller uses
``unshare -m``) and first makes ``/sys/fs/cgroup`` look like one kind of host, so runc picks the
matching cgroup manager: ``hybrid`` (as this machine is: v1 plus a unified mount), ``v1`` (the
unified mount hidden) or ``v2`` (the unified hierarchy mounted at ``/sys/fs/cgroup``). Then, for the
cgroup the agent's freezer chooses (``agent``) and for each raw freeze file (``v1-container``,
``v1-pod``, ``v2-container``, ``v2-pod``, where the view has it): freeze, ask ``runc state``, run
``runc exec`` with a thaw 0.3 s later; and ``runc pause`` followed by a freeze and thaw of ours, then
``runc resume``. Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

from enforcement.cgroups import CgroupResolver
from enforcement.freezer import CgroupFreezer, FreezeController, FreezeJournal, FreezeTarget, target_for

CGROUP = Path("/sys/fs/cgroup")
THAW_AFTER_S = 0.3


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def set_view(view: str) -> None:
    _sh("mount", "--make-rprivate", "/").check_returncode()
    if view == "v1" and (CGROUP / "unified").is_mount():
        _sh("umount", str(CGROUP / "unified")).check_returncode()
    elif view == "v2" and not (CGROUP / "cgroup.controllers").exists():
        _sh("mount", "--bind", str(CGROUP / "unified"), str(CGROUP)).check_returncode()


def bundle(work: Path, cgroups_path: str) -> Path:
    root = work / "bundle"
    (root / "rootfs" / "bin").mkdir(parents=True)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy(busybox, root / "rootfs" / "bin" / "busybox")
    for applet in ("sh", "sleep", "echo", "true"):
        (root / "rootfs" / "bin" / applet).symlink_to("busybox")
    _sh("runc", "spec", "--bundle", str(root)).check_returncode()
    spec = json.loads((root / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["sleep", "100000"]
    spec["linux"]["cgroupsPath"] = cgroups_path
    (root / "config.json").write_text(json.dumps(spec))
    return root


class Container:
    def __init__(self, work: Path, cgroups_path: str) -> None:
        self.runc = ["runc", "--root", str(work / "runc-state")]
        self.name = "probe"
        log = work / "runc-run.log"
        with log.open("w") as out:  # the detached container keeps its stdio: never a pipe we wait on
            argv = [*self.runc, "run", "-d", "--bundle", str(bundle(work, cgroups_path)), self.name]
            rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=30).returncode
        if rc != 0:
            raise RuntimeError(f"runc run failed: {log.read_text().strip()}")
        self.pid = int(json.loads(_sh(*self.runc, "state", self.name).stdout)["pid"])

    def status(self) -> str:
        return str(json.loads(_sh(*self.runc, "state", self.name).stdout)["status"])

    def exec(self) -> dict[str, Any]:
        started = time.monotonic()
        done = _sh(*self.runc, "exec", self.name, "echo", "hi")
        return {
            "rc": done.returncode,
            "out": done.stdout.strip(),
            "err": done.stderr.strip()[-200:],
            "seconds": round(time.monotonic() - started, 3),
        }

    def runc_do(self, verb: str) -> int:
        return _sh(*self.runc, verb, self.name).returncode

    def delete(self) -> None:
        _sh(*self.runc, "kill", self.name, "KILL")
        time.sleep(0.2)
        _sh(*self.runc, "delete", "-f", self.name)


def effectively_frozen(path: Path) -> bool:
    if (path / "cgroup.events").is_file():
        return "frozen 1" in (path / "cgroup.events").read_text()
    return (path / "freezer.state").read_text().strip() == "FROZEN"


def probe(container: Container, freeze: Any, thaw: Any, dirs: list[Path]) -> dict[str, Any]:
    """Freeze, runc's view, exec (thawed after a moment), then a user's pause beside our freeze.

    ``dirs`` are the container's cgroup directories (the first one is watched for the freeze).
    """
    watch = dirs[0]
    out: dict[str, Any] = {}
    freeze()
    try:
        deadline = time.monotonic() + 2
        while not effectively_frozen(watch) and time.monotonic() < deadline:
            time.sleep(0.005)
        out["state_while_frozen"] = container.status()
        timer = threading.Timer(THAW_AFTER_S, thaw)
        timer.start()
        out["exec"] = container.exec()
        timer.join()
    finally:
        thaw()  # whatever failed: runc spins in `state` while a v1 freeze cannot complete
    container.runc_do("pause")
    freeze()
    time.sleep(0.05)
    thaw()
    time.sleep(0.05)
    out["state_after_user_pause_and_our_freeze_thaw"] = container.status()
    out["resume_rc"] = container.runc_do("resume")
    out["state_after_resume"] = container.status()
    if out["state_after_resume"] != "running":  # leave it usable for the next probe
        for d in dirs:
            for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                if (d / name).is_file():
                    (d / name).write_text(value)
    return out


def main(view: str, work: Path) -> dict[str, Any]:
    set_view(view)
    prefix = f"gpuslice-runc-{os.getpid()}"
    uid, cid = str(uuidlib.uuid4()), uuidlib.uuid4().hex + uuidlib.uuid4().hex
    pod_rel = f"{prefix}/kubepods/burstable/pod{uid}"
    container = Container(work, f"/{pod_rel}/{cid}")
    result: dict[str, Any] = {"view": view, "runc": _sh("runc", "--version").stdout.splitlines()[0]}
    # A freeze while runc init is still exec'ing the entrypoint cannot complete on v1 (FREEZING):
    # wait until the container runs its own program before probing.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{container.pid}/exe").resolve().name == "runc" and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        ref = CgroupResolver(Path("/proc")).lookup(container.pid)
        assert ref is not None and ref.container is not None, "the container is not in a pod-shaped cgroup"
        result["proc_cgroup"] = Path(f"/proc/{container.pid}/cgroup").read_text().splitlines()
        target = target_for(ref.container, CGROUP)
        assert target is not None
        result["agent_target"] = f"{target.kind} {target.path.removeprefix(prefix + '/')}"
        controller = FreezeController(CgroupFreezer(CGROUP), FreezeJournal(work / "frozen.json"))
        unified = CGROUP if (CGROUP / "cgroup.controllers").exists() else CGROUP / "unified"
        in_unified = (unified / pod_rel / cid).is_dir()
        in_v1 = (CGROUP / "freezer" / pod_rel / cid).is_dir()
        dirs = [h / pod_rel / cid for h, present in ((unified, in_unified), (CGROUP / "freezer", in_v1)) if present]
        result["agent"] = probe(container, lambda: controller.apply({target}), lambda: controller.apply(set()), dirs)
        raw: dict[str, FreezeTarget] = {}
        if in_v1:
            raw["v1-container"] = FreezeTarget("v1", f"freezer/{pod_rel}/{cid}")
            raw["v1-pod"] = FreezeTarget("v1", f"freezer/{pod_rel}")
        if in_unified:
            base = "" if unified == CGROUP else "unified/"
            raw["v2-container"] = FreezeTarget("v2", f"{base}{pod_rel}/{cid}")
            raw["v2-pod"] = FreezeTarget("v2", f"{base}{pod_rel}")
        freezer = CgroupFreezer(CGROUP)
        for mode, t in raw.items():
            result[mode] = probe(
                container, lambda t=t: freezer.set_frozen(t, True), lambda t=t: freezer.set_frozen(t, False), dirs
            )
    finally:
        ours = [h / prefix for h in [*CGROUP.iterdir(), CGROUP] if (h / prefix).is_dir()]
        for top in ours:  # nothing of ours is left frozen
            for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                for f in top.rglob(name):
                    f.write_text(value)
        container.delete()
        for top in ours:
            if top.is_dir():
                for d, _, _ in os.walk(top, topdown=False):
                    os.rmdir(d)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
