"""The node side's log on start: INFO while its parts come up, an ERROR only for one that failed, naming why."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from enforcement.node import NodeSide


def side(**parts: Any) -> NodeSide:
    inventory = SimpleNamespace(published=True, last_error="")
    s = NodeSide(inventory=inventory, stop=threading.Event())  # type: ignore[arg-type]
    for name, value in parts.items():
        setattr(s, name, value)
    return s


def test_a_part_that_has_not_tried_yet_is_starting_and_one_that_failed_says_why() -> None:
    plugins = SimpleNamespace(healthy=False, last_error="")
    s = side(device_plugins=plugins)
    assert s.state() == (False, "starting: device plugins yet", False)
    plugins.last_error = "registration failed: kubelet.sock refused"
    assert s.state() == (False, "device plugins: registration failed: kubelet.sock refused", True)
    plugins.healthy, plugins.last_error = True, ""
    assert s.state() == (True, "ok", False) and s.healthy() == (True, "ok")
    s.inventory.published = False  # type: ignore[attr-defined]
    assert s.healthy() == (False, "starting: inventory not published yet")


def test_a_healthy_start_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    plugins = SimpleNamespace(healthy=False, last_error="")
    s = side(device_plugins=plugins)
    with caplog.at_level(logging.INFO, logger="enforcement.node"):
        t = threading.Thread(target=s.report, args=(5.0, 0.01))
        t.start()
        time.sleep(0.1)
        plugins.healthy = True  # registered: the usual start
        time.sleep(0.1)
        s.stop.set()
        t.join(5)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("INFO", "node side: starting: device plugins yet"), ("INFO", "node side: ok")]


def test_a_failure_is_an_error_naming_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    s = side(device_plugins=SimpleNamespace(healthy=False, last_error="kubelet device plugin socket absent"))
    with caplog.at_level(logging.INFO, logger="enforcement.node"):
        t = threading.Thread(target=s.report, args=(5.0, 0.01))
        t.start()
        time.sleep(0.1)
        s.stop.set()
        t.join(5)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["node side: device plugins: kubelet device plugin socket absent"]
