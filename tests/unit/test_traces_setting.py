"""``tests/traces.py``: the traces are found by the setting only; a broken promise fails, no setting skips."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.traces import OPENB, TRACES_ENV, require_openb


def test_no_setting_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACES_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="is not set"):
        require_openb()


def test_no_setting_under_ci_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACES_ENV, raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="is not set"):
        require_openb()


def test_setting_without_traces_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception, match=f"has no {OPENB}/openb_node_list_gpu_node.csv"):
        require_openb()


def test_setting_with_traces_gives_the_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / OPENB).mkdir()
    (tmp_path / OPENB / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,num_gpu,gpu_model\n")
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    assert require_openb() == tmp_path / OPENB
