"""README.md's own commands, as the install suite runs them: never a copy that could drift.

A block the suite runs is a fenced ``sh`` block right after a marker line ``<!-- e2e-install: NAME -->``;
:func:`blocks` reads them all (a name given twice, a marker without its block, are errors), and
:func:`run` executes one with bash, ``set -euo pipefail``, from the repository's root, as a reader
pasting it into a shell there would (the suite gives that shell ``REGISTRY``, kubectl's and helm's
paths and the cluster's kubeconfig).
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARKER = re.compile(r"^<!-- e2e-install: ([a-z0-9-]+) -->\n```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)


class ReadmeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Ran:
    """What one block did: its text, exit status, output and seconds."""

    name: str
    script: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def check(self) -> Ran:
        if self.returncode != 0:
            raise ReadmeError(f"README block {self.name!r} exited {self.returncode} after {self.seconds:.1f} s\n"
                              f"---- script ----\n{self.script}---- stdout ----\n{self.stdout[-4000:]}\n"
                              f"---- stderr ----\n{self.stderr[-4000:]}")
        return self


def blocks(text: str | None = None) -> dict[str, str]:
    """Every marked block of README.md, by name."""
    text = README.read_text() if text is None else text
    found: dict[str, str] = {}
    for m in MARKER.finditer(text):
        if m.group(1) in found:
            raise ReadmeError(f"README.md marks two blocks {m.group(1)!r}")
        found[m.group(1)] = m.group(2)
    markers = re.findall(r"<!-- e2e-install: ([a-z0-9-]+) -->", text)
    if sorted(markers) != sorted(found):
        raise ReadmeError(f"README.md markers without a ```sh block right after them: {set(markers) - set(found)}")
    return found


def run(name: str, env: dict[str, str], timeout: float = 900, cwd: Path = REPO) -> Ran:
    """Run README's block ``name``; the result, whatever its exit status (``.check()`` raises on failure)."""
    script = blocks()[name]
    started = time.monotonic()
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, env=env,
                         cwd=cwd, timeout=timeout)
    seconds = time.monotonic() - started
    print(f"[e2e-install] README block {name!r}: exit {out.returncode} in {seconds:.1f} s")
    return Ran(name, script, out.returncode, out.stdout, out.stderr, seconds)
