"""gpuslice certs: the PKI (cryptography) and the plan of what a run writes (pure, on a fixed clock).

The API half (Secrets, the webhook's caBundle, the restart) runs against the real kube-apiserver in
tests/e2e/test_deploy.py.
"""

from __future__ import annotations

import socket
import ssl
import tempfile
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from extender.certs.pki import KeyPair, inspect, issue, key_matches, new_ca, signed_by, split_bundle
from extender.certs.plan import CA_SECRET, CLIENT_SECRET, METRICS_SECRET, SERVING_SECRET, Options, PlanError, plan

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NS = "gpuslice-system"
HOST = f"gpuslice-extender.{NS}.svc"


def fresh(options: Options | None = None, now: datetime = NOW) -> dict[str, dict[str, bytes] | None]:
    decided = plan({}, options or Options(NS), now)
    return {name: dict(data) for name, data in decided.secrets.items()}


def test_a_first_run_makes_a_ca_and_both_leaves_signed_by_it() -> None:
    decided = plan({}, Options(NS), NOW)
    assert set(decided.changed) == {CA_SECRET, SERVING_SECRET, CLIENT_SECRET, METRICS_SECRET}
    ca = decided.secrets[CA_SECRET]
    assert inspect(ca["ca.crt"]).is_ca and key_matches(ca["ca.crt"], ca["ca.key"])
    assert decided.bundle == ca["bundle.crt"] == ca["ca.crt"]
    serving, client = decided.secrets[SERVING_SECRET], decided.secrets[CLIENT_SECRET]
    info = inspect(serving["tls.crt"])
    assert info.common_name == HOST
    assert set(info.dns_names) == {"gpuslice-extender", f"gpuslice-extender.{NS}", HOST, f"{HOST}.cluster.local"}
    assert not info.is_ca and info.not_after == NOW + timedelta(days=365)
    assert inspect(client["tls.crt"]).common_name == "gpuslice-scheduler"
    assert inspect(decided.secrets[METRICS_SECRET]["tls.crt"]).common_name == "gpuslice-metrics"
    for leaf in (serving, client, decided.secrets[METRICS_SECRET]):
        assert signed_by(leaf["tls.crt"], ca["ca.crt"]) and key_matches(leaf["tls.crt"], leaf["tls.key"])
        assert leaf["ca.crt"] == decided.bundle
    assert decided.leaves_changed


def test_a_second_run_changes_nothing() -> None:
    current = fresh()
    again = plan(current, Options(NS), NOW + timedelta(days=1))
    assert again.changed == ()
    assert again.secrets == current


@pytest.mark.parametrize(("later", "renewed"),
                         [(timedelta(days=300), ()), (timedelta(days=340), ("serving", "client", "metrics"))])
def test_leaves_are_renewed_within_the_window_only(later: timedelta, renewed: tuple[str, ...]) -> None:
    current = fresh()
    decided = plan(current, Options(NS, renew_within_days=30), NOW + later)
    names = {"serving": SERVING_SECRET, "client": CLIENT_SECRET, "metrics": METRICS_SECRET}
    assert set(decided.changed) == {names[n] for n in renewed}
    assert decided.secrets[CA_SECRET] == current[CA_SECRET]
    for n in renewed:
        assert decided.secrets[names[n]]["tls.crt"] != (current[names[n]] or {})["tls.crt"]


def test_a_new_name_reissues_the_serving_certificate_only() -> None:
    current = fresh()
    decided = plan(current, Options(NS, extra_names=("127.0.0.1",)), NOW)
    assert decided.changed == (SERVING_SECRET,)
    assert inspect(decided.secrets[SERVING_SECRET]["tls.crt"]).ip_addresses == ("127.0.0.1",)


def test_a_leaf_whose_key_does_not_match_or_from_another_ca_is_reissued() -> None:
    current = fresh()
    other = fresh()
    current[SERVING_SECRET] = {**(current[SERVING_SECRET] or {}), "tls.key": (other[SERVING_SECRET] or {})["tls.key"]}
    current[CLIENT_SECRET] = other[CLIENT_SECRET]
    decided = plan(current, Options(NS), NOW)
    assert set(decided.changed) == {SERVING_SECRET, CLIENT_SECRET}
    assert any("key does not match" in n for n in decided.notes)
    assert any("not signed by a trusted CA" in n for n in decided.notes)


def test_ca_rotation_is_three_steps_and_every_step_keeps_every_peer_trusted() -> None:
    start = fresh()
    old_ca = (start[CA_SECRET] or {})["ca.crt"]
    step1 = plan(start, Options(NS, rotate_ca=True), NOW)
    new_ca_pem = step1.secrets[CA_SECRET]["ca.crt"]
    assert new_ca_pem != old_ca
    assert split_bundle(step1.bundle) == [new_ca_pem, old_ca]
    assert step1.secrets[SERVING_SECRET]["tls.crt"] == (start[SERVING_SECRET] or {})["tls.crt"]  # leaves unchanged
    assert step1.leaves_changed  # their ca.crt now trusts both: a restart loads it
    with pytest.raises(PlanError, match="--renew"):
        plan(step1.secrets, Options(NS, drop_old_ca=True), NOW)
    step2 = plan(step1.secrets, Options(NS, renew=True), NOW)
    for leaf in (SERVING_SECRET, CLIENT_SECRET, METRICS_SECRET):
        assert signed_by(step2.secrets[leaf]["tls.crt"], new_ca_pem)
    assert split_bundle(step2.bundle) == [new_ca_pem, old_ca]
    step3 = plan(step2.secrets, Options(NS, drop_old_ca=True), NOW)
    assert step3.bundle == new_ca_pem
    assert step3.secrets[SERVING_SECRET]["ca.crt"] == new_ca_pem


def test_a_ca_near_its_end_is_kept_and_warned_about() -> None:
    current = fresh(Options(NS, ca_days=400, leaf_days=365))
    decided = plan(current, Options(NS, ca_days=400, leaf_days=365), NOW + timedelta(days=390))
    assert decided.secrets[CA_SECRET]["ca.crt"] == (current[CA_SECRET] or {})["ca.crt"]
    assert decided.warnings and "--rotate-ca" in decided.warnings[0]
    # a leaf never outlives its CA
    assert inspect(decided.secrets[SERVING_SECRET]["tls.crt"]).not_after <= inspect(
        decided.secrets[CA_SECRET]["ca.crt"]).not_after


def test_an_unreadable_ca_secret_is_replaced_and_the_leaves_with_it() -> None:
    current = fresh()
    current[CA_SECRET] = {"ca.crt": b"garbage", "ca.key": b"garbage"}
    decided = plan(current, Options(NS), NOW)
    assert set(decided.changed) == {CA_SECRET, SERVING_SECRET, CLIENT_SECRET, METRICS_SECRET}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"renew": True, "rotate_ca": True}, "one at a time"),
    ({"leaf_days": 0}, "positive"),
    ({"leaf_days": 4000}, "at most"),
    ({"renew_within_days": 365}, "shorter"),
])
def test_bad_options_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Options(NS, **kwargs)


def test_renew_without_a_ca_is_refused() -> None:
    with pytest.raises(PlanError, match="no CA"):
        plan({}, Options(NS, renew=True), NOW)


def _files(directory: Path, name: str, pair: KeyPair) -> tuple[str, str]:
    (directory / f"{name}.crt").write_bytes(pair.cert)
    (directory / f"{name}.key").write_bytes(pair.key)
    return str(directory / f"{name}.crt"), str(directory / f"{name}.key")


def test_the_certificates_complete_a_mutual_tls_handshake_with_pythons_ssl() -> None:
    """The extender's side (Python's ssl, client CA verification) against a client with the
    scheduler's certificate: what gunicorn and kube-scheduler do, over a socket pair."""
    now = datetime.now(UTC)
    decided = plan({}, Options(NS), now)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        serving = decided.secrets[SERVING_SECRET]
        client = decided.secrets[CLIENT_SECRET]
        (d / "ca.crt").write_bytes(decided.bundle)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(*_files(d, "tls", KeyPair(serving["tls.crt"], serving["tls.key"])))
        server_ctx.load_verify_locations(str(d / "ca.crt"))
        server_ctx.verify_mode = ssl.CERT_REQUIRED
        client_ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        client_ctx.load_cert_chain(*_files(d, "client", KeyPair(client["tls.crt"], client["tls.key"])))
        a, b = socket.socketpair()
        seen: dict[str, object] = {}

        def serve() -> None:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                seen["peer"] = s.getpeercert()
                s.sendall(b"ok")

        thread = threading.Thread(target=serve)
        thread.start()
        with client_ctx.wrap_socket(b, server_hostname=HOST) as c:
            assert c.recv(2) == b"ok"
        thread.join(10)
        peer = seen["peer"]
        assert isinstance(peer, dict)
        assert peer["subject"] == ((("commonName", "gpuslice-scheduler"),),)


def test_a_leaf_of_another_ca_is_not_signed_by_this_one() -> None:
    ca, other = new_ca("a", 10, NOW), new_ca("b", 10, NOW)
    leaf = issue(other, "x", server=False, days=5, now=NOW)
    assert signed_by(leaf.cert, other.cert) and not signed_by(leaf.cert, ca.cert)


class _SecretsOnlyApi:
    """Serves Secrets; any other path (the webhook's configuration) fails the test: the pre-install hook may not."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, object]] = {}

    def get(self, path: str) -> dict[str, object] | None:
        assert "/secrets/" in path, f"read {path}"
        return self.secrets.get(path.rsplit("/", 1)[1])

    def request(self, method: str, path: str, body: dict[str, object] | None = None, **_: object) -> dict[str, object]:
        assert method == "POST" and path.endswith("/secrets") and body is not None, f"{method} {path}"
        self.secrets[body["metadata"]["name"]] = body  # type: ignore[index]
        return body


def test_secrets_only_writes_the_four_secrets_and_never_reads_the_webhook() -> None:
    """The chart's pre-install hook: the webhook does not exist yet and its Role may not read it."""
    from extender.certs.cli import run

    api = _SecretsOnlyApi()
    done = run(api, Options(NS), webhook=None, wait_s=0, restart=False, now=NOW)  # type: ignore[arg-type]
    assert set(api.secrets) == {CA_SECRET, SERVING_SECRET, CLIENT_SECRET, METRICS_SECRET}
    assert any("--secrets-only" in note for note in done.notes)
