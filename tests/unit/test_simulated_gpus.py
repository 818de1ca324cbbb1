"""``gpuslice agent --simulated-gpus``: a count of V100-32GB cards or a JSON file, a bad value refused in one line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from enforcement import cli
from enforcement.inventory import Inventory
from enforcement.simnode import MAX_CARDS, counted_cards
from packing.cli import main as gpuslice


class _Annotator:
    def __init__(self) -> None:
        self.values: list[str] = []

    def annotate(self, key: str, value: str) -> None:
        self.values.append(value)


def _inventory(args: argparse.Namespace) -> list[dict[str, object]]:
    """What the agent started with these arguments would publish on its Node."""
    backend = cli._open_simulated(args)
    try:
        annotator = _Annotator()
        assert Inventory(backend, annotator, resync_s=60).refresh(0.0)
        cards: list[dict[str, object]] = json.loads(annotator.values[-1])
        return cards
    finally:
        backend.close()


def test_a_count_serves_that_many_v100s_with_uuids_of_the_node() -> None:
    args = cli.parser().parse_args(["--node-name", "gpu-1", "--simulated-gpus", "3"])
    assert args.simulated_gpus == 3
    cards = _inventory(args)
    assert [(c["index"], c["model"], c["memory_mib"], c["healthy"]) for c in cards] == \
        [(i, "Tesla-V100-SXM2-32GB", 32768, True) for i in range(3)]
    again = _inventory(cli.parser().parse_args(["--node-name", "gpu-1", "--simulated-gpus", "3"]))
    other = _inventory(cli.parser().parse_args(["--node-name", "gpu-2", "--simulated-gpus", "3"]))
    assert [c["uuid"] for c in again] == [c["uuid"] for c in cards]  # the same at every start
    assert not {c["uuid"] for c in other} & {c["uuid"] for c in cards}  # never shared between nodes
    assert all(str(c["uuid"]).startswith("GPU-") and len(str(c["uuid"])) == 40 for c in cards)  # NVML's shape


def test_the_environment_twin_takes_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLICE_AGENT_SIMULATED_GPUS", "2")
    assert cli.parser().parse_args([]).simulated_gpus == 2


def test_a_file_is_still_read(tmp_path: Path) -> None:
    cards = tmp_path / "cards.json"
    cards.write_text(json.dumps(counted_cards(1, "x")))
    args = cli.parser().parse_args(["--node-name", "n", "--simulated-gpus", str(cards)])
    assert args.simulated_gpus == cards
    assert [c["uuid"] for c in _inventory(args)] == [counted_cards(1, "x")[0]["uuid"]]


def _bad_files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "bad.json").write_text("[{\"uuid\": ")
    (tmp_path / "object.json").write_text("{\"uuid\": \"GPU-1\"}")
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)))
    return {str(tmp_path / "missing.json"): "no file", str(tmp_path / "bad.json"): "not a JSON list of cards",
            str(tmp_path / "object.json"): "not a JSON list of cards", str(tmp_path): "cannot read",
            str(tmp_path / "binary.json"): "not a JSON list of cards"}


def _refused(value: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The error line ``gpuslice agent --simulated-gpus VALUE`` ends with (exit status 2)."""
    with pytest.raises(SystemExit) as exit_:
        gpuslice(["agent", "--node-name", "n", "--simulated-gpus", value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    error = [line for line in err.splitlines() if ": error: " in line]
    assert len(error) == 1, err
    return error[0]


@pytest.mark.parametrize("value", ["0", "-2", str(MAX_CARDS + 1), "four", "2.5", ""])
def test_a_bad_count_is_one_line_naming_the_flag(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --simulated-gpus" in _refused(value, capsys)


def test_a_bad_file_is_one_line_saying_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path, said in _bad_files(tmp_path).items():
        line = _refused(path, capsys)
        assert "argument --simulated-gpus" in line and said in line, (path, line)
