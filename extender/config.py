"""The extender's settings, carried from ``gpuslice serve`` to the gunicorn worker in ``GPUSLICE_*`` variables.

gunicorn imports the app in its worker process, so the command line cannot hand it objects: the
CLI writes the settings to the environment (``to_env``) and the app factory reads them back
(``from_env``). One table names every setting once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from extender.history.book import DemandBook
from extender.state import StateConfig
from extender.wire import DEFAULT_MAX_NODES
from packing.policies import DEFAULT_POLICY
from packing.products import Catalog

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

DEFAULT_PORT = 8888
DEFAULT_MAX_BODY = 64 * 1024 * 1024  # full Node objects of 5 000 nodes stay well below this


class ConfigError(ValueError):
    """A setting with a value the extender cannot run with."""


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _words(raw: str) -> tuple[str, ...]:
    return tuple(w for w in (p.strip() for p in raw.split(",")) if w)


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """Everything ``gpuslice serve`` configures: HTTP surface, TLS, limits, decisions, standalone seeding."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    webhook_port: int = 0  # cluster: the admission webhook on this port, in a worker process of its own (0: on port)
    threads: int = 8  # threads that run complete requests (a request's body is read before it gets one)
    bind_threads: int = 32  # threads of binds alone (in a cluster each waits for the API server)
    prefix: str = ""
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    bind_verb: str = "bind"
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_nodes: int = DEFAULT_MAX_NODES  # nodes one filter or prioritize may name
    body_timeout_s: float = 10.0  # a body still arriving after this long is refused (408)
    slow_request_s: float = 0.5  # a request slower than this is logged with its phases
    mode: str = "strict"
    policy: str = DEFAULT_POLICY
    reservation_ttl_s: float = 30.0
    pod_cache_size: int = 10_000
    refused_resources: tuple[str, ...] = ()
    standalone: bool = False
    admin: bool = False  # POST /admin/release (on by default in standalone mode)
    learn_nodes: bool = False  # standalone only: inventories from the Node objects of request bodies
    waiting_ttl_s: float = 600.0  # standalone: a waiting claim no filter asked about for this long leaves
    nodes: int = 0  # standalone seeding: nodes of gpus_per_node cards of gpu_model
    gpus_per_node: int = 8
    gpu_model: str = "Tesla-V100-SXM2-32GB"
    catalog: str = ""
    tls_cert: str = ""  # serve HTTPS with this certificate (PEM) and ``tls_key``
    tls_key: str = ""
    client_ca: str = ""  # verify client certificates against this CA (a certificate it did not sign fails TLS)
    require_client_cert: bool = False  # the scheduler verbs need a verified client certificate
    client_subjects: tuple[str, ...] = ()  # allowed client subjects, e.g. CN=kube-scheduler (empty: any the CA signed)
    metrics_subjects: tuple[str, ...] = ()  # client subjects that may read /metrics and nothing else (Prometheus)
    history: bool = True  # keep the demand history (GET /history)
    history_max_age_s: float = 30 * 86400.0  # claims that ended longer ago leave the history
    history_max_mib: int = 64  # the history's size bound (its JSON lines)
    history_names: bool = False  # keep pod names in the history (planners often get it from another team)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be within 1..65535, got {self.port}")
        if not 0 <= self.webhook_port < 65536 or self.webhook_port == self.port:
            raise ConfigError(f"webhook port must be within 1..65535 and not the port ({self.port}), "
                              f"or 0 (served on the port), got {self.webhook_port}")
        if self.webhook_port and self.standalone:
            raise ConfigError("a webhook port (--webhook-port) is for cluster mode: standalone serves no webhook")
        if self.threads < 1 or self.bind_threads < 1:
            raise ConfigError(f"threads must be at least 1, got {self.threads} and {self.bind_threads} for binds")
        if self.max_nodes < 1:
            raise ConfigError(f"max nodes must be at least 1, got {self.max_nodes}")
        for name in ("body_timeout_s", "slow_request_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("the TLS certificate and its key go together (--tls-cert, --tls-key)")
        if self.client_ca and not self.tls_cert:
            raise ConfigError("verifying client certificates (--client-ca) needs TLS (--tls-cert, --tls-key)")
        if (self.require_client_cert or self.client_subjects or self.metrics_subjects) and not self.client_ca:
            raise ConfigError("requiring client certificates or subjects needs the CA that signs them (--client-ca)")
        for subject in self.client_subjects + self.metrics_subjects:
            try:
                parse_subject(subject)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if self.prefix and (not self.prefix.startswith("/") or self.prefix.endswith("/")):
            raise ConfigError(f"prefix must start with '/' and not end with one, got {self.prefix!r}")
        verbs = [self.filter_verb, self.prioritize_verb, self.bind_verb]
        if any(not v or "/" in v for v in verbs) or len(set(verbs)) != 3:
            raise ConfigError(f"verbs must be three distinct path segments, got {verbs}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max body must be at least 1024 bytes, got {self.max_body_bytes}")
        try:
            self.state_config()  # mode, policy, TTL and pod cache are checked where they are used
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.nodes < 0 or self.gpus_per_node < 0:
            raise ConfigError("seeded node and GPU counts must not be negative")
        if not self.history_max_age_s > 0 or self.history_max_mib < 1:
            raise ConfigError(f"the history's bounds must be positive, got {self.history_max_age_s} s and "
                              f"{self.history_max_mib} MiB (--history-max-age, --history-max-mib)")
        if self.nodes and not self.standalone:
            raise ConfigError("seeding nodes (--nodes) is for standalone mode only")

    def state_config(self) -> StateConfig:
        """The decision settings as the state takes them (ValueError if one is bad)."""
        return StateConfig(
            mode=self.mode,
            policy=self.policy,
            reservation_ttl_s=self.reservation_ttl_s,
            pod_cache_size=self.pod_cache_size,
            refused_resources=self.refused_resources,
            learn_nodes=self.learn_nodes,
            standalone=self.standalone,
            waiting_ttl_s=self.waiting_ttl_s,
        )

    def demand_book(self, catalog: Catalog) -> DemandBook | None:
        """The demand history these settings ask for (None when it is off)."""
        if not self.history:
            return None
        return DemandBook(catalog, self.history_max_age_s, self.history_max_mib * 1024 * 1024, self.history_names)

    @property
    def admin_enabled(self) -> bool:
        return self.admin or self.standalone

    def verb_path(self, verb: str) -> str:
        return f"{self.prefix}/{verb}"

    def to_env(self) -> dict[str, str]:
        """``GPUSLICE_<FIELD>`` variables that ``from_env`` turns back into this config."""
        return env_of(self)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExtenderConfig:
        """Read every ``GPUSLICE_<FIELD>`` that is set; defaults for the rest. ConfigError if bad."""
        return cls(**env_values(cls, os.environ if env is None else env))


Subject = tuple[tuple[str, str], ...]
_SUBJECT_KEYS = {"CN": "commonName", "O": "organizationName", "OU": "organizationalUnitName",
                 "C": "countryName", "L": "localityName", "ST": "stateOrProvinceName"}


def parse_subject(text: str) -> Subject:
    """An allowed client subject -> the (attribute, value) pairs a certificate's subject must all carry.

    One attribute (``CN=kube-scheduler``) or several in OpenSSL's one-line form
    (``/O=gpuslice/CN=kube-scheduler``); no commas, so a list of subjects is a comma-separated setting.
    """
    parts = [p for p in text.split("/")[1:] if p] if text.startswith("/") else [text]
    pairs: list[tuple[str, str]] = []
    for part in parts:
        key, sep, value = part.partition("=")
        name = _SUBJECT_KEYS.get(key.strip().upper())
        if not sep or name is None or not value.strip():
            raise ValueError(f"client subject {text!r}: {part!r} is not one of {', '.join(_SUBJECT_KEYS)}=VALUE")
        pairs.append((name, value.strip()))
    if not pairs:
        raise ValueError(f"client subject {text!r} is empty")
    return tuple(pairs)


def env_name(field_name: str) -> str:
    """The environment variable that carries a settings field."""
    return "GPUSLICE_" + field_name.upper()


def env_of(config: DataclassInstance) -> dict[str, str]:
    """Every field of a settings dataclass as ``GPUSLICE_<FIELD>`` text that ``env_values`` parses back."""
    out: dict[str, str] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, tuple):
            text = ",".join(value)
        elif isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = str(value)
        out[env_name(f.name)] = text
    return out


def env_values(cls: type[DataclassInstance], source: Mapping[str, str]) -> dict[str, Any]:
    """The fields of ``cls`` set in ``source``, parsed by their declared type; ConfigError names a bad one."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        raw = source.get(env_name(f.name))
        if raw is None:
            continue
        parse = _PARSERS[str(f.type)]
        try:
            values[f.name] = parse(raw)
        except ValueError as e:
            raise ConfigError(f"{env_name(f.name)}={raw!r}: {e}") from None
    return values


# field type (as written: this module and its users use postponed annotations) -> parser
_PARSERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": _bool,
    "tuple[str, ...]": _words,
}
