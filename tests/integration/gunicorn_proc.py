"""Start a real gunicorn extender on a free 127.0.0.1 port for one test, and end it by its PID."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from extender.config import ExtenderConfig
from extender.server import ServerProcess, start_on_free_port


@contextmanager
def running_extender(log_dir: Path, **settings: Any) -> Iterator[ServerProcess]:
    """A standalone extender under gunicorn with ``settings`` (ExtenderConfig fields); stopped after.

    Its log is kept in ``log_dir`` and shown when the test fails inside the block.
    """
    config = ExtenderConfig(standalone=True, **settings)
    server = start_on_free_port(config, log_path=log_dir / "gunicorn.log")
    try:
        yield server
    except BaseException:
        print(f"--- gunicorn log (pid {server.pid}) ---\n{server.log_tail(80)}")
        raise
    finally:
        code = server.stop()
        assert code == 0, f"gunicorn pid {server.pid} exited with {code}:\n{server.log_tail()}"
