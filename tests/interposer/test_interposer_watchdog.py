"""An Ollama-like client against the agent's memory watchdog: it reads free memory and takes 90 %
of it in chunks. Under the limiter it reads its slice, fits itself into it, and the watchdog
(reading the fake driver's per-process figures through pynvml, contexts included) kills nothing;
without the limiter it reads the whole card, takes more than its slice and is killed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.interposer.conftest import CAP_MIB, CHECK_CLIENT, CONTEXT_MIB, FAKE_CONTEXT_MIB, Node, assert_clean

PROBE = Path(__file__).with_name("watchdog_probe.py")


def _report(dog: subprocess.Popen[str]) -> dict[str, Any]:
    assert dog.stdin and dog.stdout
    dog.stdin.write("report\n")
    dog.stdin.flush()
    return json.loads(dog.stdout.readline())  # type: ignore[no-any-return]


def _watched(node: Node, clients: list[list[str]], limited: bool = True, **env: str) -> tuple[list[Any], list[int],
                                                                                             dict[str, Any]]:
    """Runs the clients (one after another, all holding) under the watchdog; returns what each
    printed (None if killed before it could), their exit codes, and the watchdog's figures."""
    dog = node.spawn([sys.executable, str(PROBE), str(CAP_MIB)], node.env(limited=False, python=True))
    assert dog.stdout and json.loads(dog.stdout.readline())["ready"]
    running, results = [], []
    try:
        for args in clients:
            client = node.spawn([sys.executable, str(CHECK_CLIENT), *args, "--hold"],
                                {**node.env(limited=limited, python=True), **env})
            line = client.stdout.readline() if client.stdout else ""
            results.append(json.loads(line) if line else None)
            running.append(client)
        seen = _report(dog)["scans"]
        deadline = time.monotonic() + 20
        while _report(dog)["scans"] < seen + 5:  # let it look at the peak a few times
            assert time.monotonic() < deadline, "the watchdog stopped scanning"
            time.sleep(0.02)
        codes = []
        for client in running:
            _, err = client.communicate("", timeout=60)
            assert_clean(err)
            codes.append(client.returncode)
    finally:
        for client in running:
            if client.poll() is None:
                client.kill()
        out, err = dog.communicate("", timeout=60)
    assert dog.returncode == 0, err
    return results, codes, json.loads(out.splitlines()[-1])


def test_ollama_like_client_fits_its_slice_and_is_not_killed(node: Node) -> None:
    [result], [code], dog = _watched(node, [["ollama"]])
    assert result["free_read_mib"] == CAP_MIB - CONTEXT_MIB and result["total_read_mib"] == CAP_MIB
    assert result["allocated_mib"] == result["target_mib"] == int((CAP_MIB - CONTEXT_MIB) * 0.9)
    assert result["refused"] == 0
    assert code == 0 and dog["kills"] == []
    # the watchdog really saw it: its allocations and its context, and that is under the cap
    assert dog["max_used_mib"] == result["allocated_mib"] + FAKE_CONTEXT_MIB
    assert dog["max_used_mib"] <= CAP_MIB


def test_two_ollama_like_processes_share_the_slice_and_none_is_killed(node: Node) -> None:
    """The first server sizes itself to half the slice; the second reads what is left (its own
    context charged too) and takes 90 % of that."""
    [first, second], codes, dog = _watched(node, [["ollama", "--fraction", "0.5"], ["ollama"]])
    assert second["free_read_mib"] == CAP_MIB - 2 * CONTEXT_MIB - first["allocated_mib"]
    assert second["allocated_mib"] == int(second["free_read_mib"] * 0.9) and second["refused"] == 0
    assert codes == [0, 0] and dog["kills"] == []
    assert dog["max_used_mib"] == first["allocated_mib"] + second["allocated_mib"] + 2 * FAKE_CONTEXT_MIB
    assert dog["max_used_mib"] <= CAP_MIB


def test_filling_to_the_cap_gets_out_of_memory_not_a_kill(node: Node) -> None:
    [result], [code], dog = _watched(node, [["fill", "--chunk-mib", "64"]])
    assert result["allocated_mib"] == CAP_MIB - CONTEXT_MIB
    assert code == 0 and dog["kills"] == []
    assert dog["max_used_mib"] == CAP_MIB - CONTEXT_MIB + FAKE_CONTEXT_MIB <= CAP_MIB


def test_without_the_limiter_the_same_client_is_killed(node: Node) -> None:
    """The control: the watchdog in this bench does kill, so its silence above means something."""
    [result], [code], dog = _watched(node, [["ollama"]], limited=False)
    assert code == -signal.SIGKILL
    assert len(dog["kills"]) == 1 and dog["kills"][0]["holder_mib"] > CAP_MIB
    assert result is None or result["allocated_mib"] > CAP_MIB  # killed while allocating, or right after


def test_a_context_larger_than_the_reserve_is_the_watchdogs_to_catch(node: Node) -> None:
    """The documented limit: the limiter cannot see context memory, it reserves for it. A context
    of 1024 MiB against the default 768 MiB reserve passes the cap when filled, and is killed;
    GPUSLICE_SLICE_CONTEXT_MIB raised above it keeps the same client alive."""
    node.fake["FAKEGPU_CONTEXT_MIB"] = "1024"
    _, [code], dog = _watched(node, [["fill", "--chunk-mib", "64"]])
    assert code == -signal.SIGKILL and len(dog["kills"]) == 1
    [result], [code], dog = _watched(node, [["fill", "--chunk-mib", "64"]], GPUSLICE_SLICE_CONTEXT_MIB="1100")
    assert CAP_MIB - 1100 - 64 < result["allocated_mib"] <= CAP_MIB - 1100  # whole 64 MiB chunks
    assert code == 0 and dog["kills"] == []
