"""``make bench``: run every ``tests/bench/bench_*.py`` module's ``main()`` in turn.

Benchmarks print figures and ratios measured side by side in one run; nothing here asserts a
speed (shared machines are noisy). ``python -m tests.bench.run NAME`` runs only bench_NAME.
``bench_e2e`` (minutes, a real control plane: ``make bench-e2e``) runs only when named.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path

EXPLICIT_ONLY = {"bench_e2e"}


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    wanted = [f"bench_{a}" if not a.startswith("bench_") else a for a in argv]
    for name in names:
        if (wanted and name not in wanted) or (not wanted and name in EXPLICIT_ONLY):
            continue
        print(f"\n=== {name} ===", flush=True)
        started = time.perf_counter()
        importlib.import_module(f"tests.bench.{name}").main()
        print(f"--- {name}: {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
