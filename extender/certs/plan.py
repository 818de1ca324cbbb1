"""What ``gpuslice certs`` writes, decided from the Secrets as they are (pure: the clock is an argument).

Three Secrets in the extender's namespace:

- ``gpuslice-ca``: ``ca.crt`` (the signing CA), ``ca.key``, ``bundle.crt`` (every CA trusted); read by
  ``gpuslice certs`` only;
- ``gpuslice-extender-tls``: ``tls.crt``, ``tls.key`` (the serving certificate), ``ca.crt`` (the
  bundle); read by the extender, and by kube-scheduler (``ca.crt``);
- ``gpuslice-scheduler-client-tls``: ``tls.crt``, ``tls.key`` (``CN=gpuslice-scheduler``), ``ca.crt``;
  read by kube-scheduler;
- ``gpuslice-metrics-client-tls``: ``tls.crt``, ``tls.key`` (``CN=gpuslice-metrics``), ``ca.crt``; read
  by Prometheus, to scrape the extender's ``/metrics`` (that subject may read nothing else).

The webhook's ``caBundle`` is the bundle too. A run keeps what is valid and re-issues a leaf that is
missing, unreadable, not from a trusted CA, for other names, or expiring within the renewal window.
A CA rotation is three runs, each followed by a restart, so no peer ever meets a certificate it
does not trust: ``rotate_ca`` (a new signing CA, trusted next to the old one; leaves unchanged),
``renew`` (leaves from the new CA), ``drop_old_ca`` (only the signing CA trusted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from extender.certs.pki import KeyPair, PkiError, inspect, issue, key_matches, new_ca, signed_by, split_bundle

CA_SECRET = "gpuslice-ca"
SERVING_SECRET = "gpuslice-extender-tls"
CLIENT_SECRET = "gpuslice-scheduler-client-tls"
CLIENT_CN = "gpuslice-scheduler"  # the subject the extender's --client-subject allows
METRICS_SECRET = "gpuslice-metrics-client-tls"
METRICS_CN = "gpuslice-metrics"  # the subject the extender's --metrics-subject allows: /metrics only
CA_CN = "gpuslice-ca"

Data = dict[str, bytes]


class PlanError(ValueError):
    """A change asked for that would break a peer (said why, nothing written)."""


@dataclass(frozen=True, slots=True)
class Options:
    namespace: str
    service: str = "gpuslice-extender"
    extra_names: tuple[str, ...] = ()  # more DNS names or IP addresses for the serving certificate
    ca_days: int = 3650
    leaf_days: int = 365
    renew_within_days: int = 30
    renew: bool = False
    rotate_ca: bool = False
    drop_old_ca: bool = False

    def __post_init__(self) -> None:
        if sum((self.renew, self.rotate_ca, self.drop_old_ca)) > 1:
            raise PlanError("renew, rotate the CA and drop the old CA are separate steps: one at a time")
        if not 0 < self.leaf_days <= self.ca_days:
            raise PlanError(f"leaf days must be positive and at most the CA's ({self.ca_days}), got {self.leaf_days}")
        if not 0 <= self.renew_within_days < self.leaf_days:
            raise PlanError(f"the renewal window ({self.renew_within_days} days) must be shorter than a leaf's "
                            f"life ({self.leaf_days} days)")

    @property
    def serving_names(self) -> tuple[str, ...]:
        host = f"{self.service}.{self.namespace}.svc"
        names = [self.service, f"{self.service}.{self.namespace}", host, f"{host}.cluster.local"]
        return tuple(dict.fromkeys([*names, *self.extra_names]))


@dataclass(frozen=True, slots=True)
class Plan:
    """The three Secrets' data as they should be, which of them change, and why."""

    secrets: dict[str, Data]
    changed: tuple[str, ...]
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    bundle: bytes = b""

    @property
    def leaves_changed(self) -> bool:
        """Whether the extender or kube-scheduler must restart to load their Secrets (Prometheus reads
        its certificate at each scrape)."""
        return any(name in self.changed for name in (SERVING_SECRET, CLIENT_SECRET))


@dataclass
class _Draft:
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _ca_from(data: Mapping[str, bytes] | None) -> KeyPair | None:
    if not data or "ca.crt" not in data or "ca.key" not in data:
        return None
    try:
        if not inspect(data["ca.crt"]).is_ca or not key_matches(data["ca.crt"], data["ca.key"]):
            return None
    except PkiError:
        return None
    return KeyPair(data["ca.crt"], data["ca.key"])


def _trusted(data: Mapping[str, bytes] | None, signing: KeyPair, previous: KeyPair, now: datetime) -> list[bytes]:
    """The bundle: the signing CA first, then the previous one and the other still valid CAs the
    Secret already trusted."""
    out = [signing.cert]
    try:
        kept = split_bundle(data["bundle.crt"]) if data and "bundle.crt" in data else []
    except PkiError:
        kept = []
    kept.insert(0, previous.cert)
    for pem in kept:
        try:
            info = inspect(pem)
        except PkiError:
            continue
        if info.is_ca and info.not_after > now and pem not in out:
            out.append(pem)
    return out


def _leaf_problem(data: Mapping[str, bytes] | None, trusted: list[bytes], cn: str, names: tuple[str, ...],
                  server: bool, window: timedelta, now: datetime) -> str | None:
    """Why the leaf in ``data`` must be issued anew, or None when it can stay."""
    if not data or "tls.crt" not in data or "tls.key" not in data:
        return "missing"
    try:
        info = inspect(data["tls.crt"])
    except PkiError as e:
        return f"unreadable ({e})"
    if not key_matches(data["tls.crt"], data["tls.key"]):
        return "its key does not match"
    if not any(signed_by(data["tls.crt"], ca) for ca in trusted):
        return "not signed by a trusted CA"
    if info.common_name != cn:
        return f"CN={info.common_name}, not CN={cn}"
    if server and set(info.dns_names) | set(info.ip_addresses) != set(names):
        return f"names {', '.join(info.dns_names + info.ip_addresses)} are not {', '.join(names)}"
    if info.not_after - now < window:
        return f"expires {info.not_after:%Y-%m-%d}, within the renewal window"
    return None


def plan(current: Mapping[str, Mapping[str, bytes] | None], options: Options, now: datetime) -> Plan:
    """What to write, given the Secrets' current data (None: absent). PlanError when refused."""
    draft = _Draft()
    window = timedelta(days=options.renew_within_days)
    ca_data = current.get(CA_SECRET)
    signing = _ca_from(ca_data)
    previous = signing
    if signing is None:
        if options.drop_old_ca or options.renew:
            raise PlanError(f"there is no CA in Secret {CA_SECRET} to {'renew from' if options.renew else 'keep'}: "
                            "run without --renew / --drop-old-ca first")
        signing = new_ca(CA_CN, options.ca_days, now)
        draft.notes.append(f"{CA_SECRET}: created a CA (expires {inspect(signing.cert).not_after:%Y-%m-%d})")
    elif options.rotate_ca:
        signing = new_ca(CA_CN, options.ca_days, now)
        draft.notes.append(f"{CA_SECRET}: a new signing CA, trusted next to the old one until --drop-old-ca; "
                           "restart, then run with --renew")
    trusted = [signing.cert] if previous is None else _trusted(ca_data, signing, previous, now)
    if options.drop_old_ca:
        for name in (SERVING_SECRET, CLIENT_SECRET, METRICS_SECRET):
            leaf = current.get(name) or {}
            if not signed_by(leaf.get("tls.crt", b""), signing.cert):
                raise PlanError(f"{name} is not signed by the signing CA yet: run with --renew (and restart) "
                                "before dropping the old CA")
        if len(trusted) > 1:
            draft.notes.append(f"{CA_SECRET}: dropped {len(trusted) - 1} old CA(s) from the bundle")
        trusted = [signing.cert]
    ca_expiry = inspect(signing.cert).not_after
    if ca_expiry - now < window:
        draft.warnings.append(f"the CA expires {ca_expiry:%Y-%m-%d}: rotate it (--rotate-ca, then --renew, then "
                              "--drop-old-ca, each followed by a restart)")
    bundle = b"".join(trusted)
    secrets: dict[str, Data] = {CA_SECRET: {"ca.crt": signing.cert, "ca.key": signing.key, "bundle.crt": bundle}}
    leaves = ((SERVING_SECRET, f"{options.service}.{options.namespace}.svc", options.serving_names, True),
              (CLIENT_SECRET, CLIENT_CN, (), False), (METRICS_SECRET, METRICS_CN, (), False))
    for name, cn, names, server in leaves:
        data = current.get(name)
        why = "--renew" if options.renew else _leaf_problem(data, trusted, cn, names, server, window, now)
        if why is None and data is not None:
            secrets[name] = {"tls.crt": data["tls.crt"], "tls.key": data["tls.key"], "ca.crt": bundle}
            continue
        pair = issue(signing, cn, server=server, days=options.leaf_days, now=now, names=names)
        secrets[name] = {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": bundle}
        draft.notes.append(f"{name}: issued CN={cn} (expires {inspect(pair.cert).not_after:%Y-%m-%d}): {why}")
    changed = tuple(name for name, data in secrets.items() if dict(current.get(name) or {}) != data)
    for name in changed:
        if not any(n.startswith(f"{name}:") for n in draft.notes):
            draft.notes.append(f"{name}: trusted CAs updated")
    return Plan(secrets, changed, tuple(draft.notes), tuple(draft.warnings), bundle)
