"""--metrics-subject: a client certificate of that subject (a Prometheus) may read /metrics and
nothing else; the scheduler's subject keeps its routes; any other subject is refused everywhere."""

from __future__ import annotations

import json

import pytest

from extender.app import CLIENT_SUBJECT, create_app
from extender.config import ConfigError, ExtenderConfig
from extender.samples import filter_args, pod
from extender.standalone import build_state

SCHEDULER = (("commonName", "gpuslice-scheduler"),)
PROMETHEUS = (("commonName", "gpuslice-metrics"),)
OTHER = (("commonName", "someone-else"),)


def client() -> object:
    config = ExtenderConfig(standalone=True, nodes=1, tls_cert="t.crt", tls_key="t.key", client_ca="ca.crt",
                            require_client_cert=True, client_subjects=("CN=gpuslice-scheduler",),
                            metrics_subjects=("CN=gpuslice-metrics",))
    return create_app(build_state(config), config).test_client()


def ask(method: str, path: str, subject: tuple[tuple[str, str], ...]) -> tuple[int, str]:
    c = client()
    environ = {CLIENT_SUBJECT: subject, "REMOTE_ADDR": "10.1.2.3"}  # not loopback: the certificate decides
    body = json.dumps(filter_args(pod("p", "v100-25"), ["node-0"])) if method == "POST" else None
    resp = c.open(path, method=method, data=body, content_type="application/json",  # type: ignore[attr-defined]
                  environ_overrides=environ)
    return resp.status_code, resp.get_data(as_text=True)


@pytest.mark.parametrize(("method", "path", "subject", "status", "says"), [
    ("GET", "/metrics", PROMETHEUS, 200, "gpuslice_extender_requests"),
    ("GET", "/state", PROMETHEUS, 403, "may read /metrics only"),
    ("POST", "/filter", PROMETHEUS, 403, "may read /metrics only"),
    ("POST", "/bind", PROMETHEUS, 403, "may read /metrics only"),
    ("POST", "/filter", SCHEDULER, 200, "NodeNames"),
    ("GET", "/metrics", SCHEDULER, 200, "gpuslice_extender_requests"),
    ("GET", "/metrics", OTHER, 403, "not on this extender's allow-list"),
])
def test_who_may_ask_what(method: str, path: str, subject: tuple[tuple[str, str], ...], status: int,
                          says: str) -> None:
    got, text = ask(method, path, subject)
    assert (got, says in text) == (status, True), text[:300]


def test_a_metrics_subject_needs_the_client_ca_and_must_parse() -> None:
    with pytest.raises(ConfigError, match="client-ca"):
        ExtenderConfig(standalone=True, tls_cert="t", tls_key="k", metrics_subjects=("CN=x",))
    with pytest.raises(ConfigError, match="not one of"):
        ExtenderConfig(standalone=True, tls_cert="t", tls_key="k", client_ca="c", metrics_subjects=("nonsense",))
