"""Raw-JSON access to the API server over the ``kubernetes`` client's connection and credentials.

The generated client validates every argument and reply with pydantic models, which costs more
than the call itself for pods, rejects plain dicts as bodies of typed calls (Binding, Lease), and
with ``_preload_content=False`` stops checking the HTTP status. So gpuslice builds its few calls
itself: ``Kube.request`` signs and sends a path with the client's configuration (client certs,
bearer token, CA) and returns the reply as a dict, raising ``KubeError`` with the API server's
message for any status outside 2xx. The extender and the node agent both reach the API server
through it (``connect``: a kubeconfig file or the pod's service account); an operator's command
through ``operator_kube`` (also ``$KUBECONFIG`` and ``~/.kube/config``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import orjson

if TYPE_CHECKING:  # the kubernetes client (and urllib3) take a second to import: only where one is used
    import urllib3
    from kubernetes import client

Obj = dict[str, Any]
T = TypeVar("T")

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
REQUEST_TIMEOUT = (5.0, 30.0)  # (connect, read) seconds: one stuck call must not hang a controller
# a reply of the object's metadata only (kube-apiserver's PartialObjectMetadata), else the whole object: for
# writes whose caller reads nothing back, kube-apiserver encodes and the client decodes a fraction of a pod
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
AUTH = ["BearerToken"]


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # the Status reason (AlreadyExists, Conflict, NotFound, ...)


def _status_error(status: int, data: bytes) -> KubeError:
    """A KubeError carrying the API server's Status message when the body has one."""
    text = data.decode("utf-8", "replace") if data else ""
    try:
        doc = json.loads(text) if text else None
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return KubeError(status, doc["message"], str(doc.get("reason") or ""))
    return KubeError(status, text[:500] or f"HTTP {status}")


def q(segment: str) -> str:
    """A path segment, escaped."""
    return quote(segment, safe="")


class Kube:
    """Signed raw requests through one ``kubernetes.client.ApiClient``."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, Any] | None = None,
        timeout: float | tuple[float, float] = REQUEST_TIMEOUT,
        accept: str = "application/json",
    ) -> Obj:
        """Send ``method path`` (with ``body`` as JSON) and return the reply object; KubeError otherwise."""
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        params = [(k, _param(v)) for k, v in (query or {}).items() if v is not None]
        try:
            m, url, hdrs, _, _ = self.api.param_serialize(
                method, path, query_params=params or None, header_params=headers, auth_settings=AUTH
            )
            # the client's own connection pool (its TLS and credentials), the body encoded here: its
            # RESTClientObject would json.dumps it again and wrap the reply, for nothing gpuslice reads
            resp = self.api.rest_client.pool_manager.request(
                m, url, body=None if body is None else orjson.dumps(body), headers=hdrs,
                timeout=_timeout(timeout), preload_content=False)
            try:
                data: bytes = resp.read()
            finally:
                resp.release_conn()
        except Exception as e:  # connection refused, TLS, timeouts: the server was not reached
            raise KubeError(0, f"{type(e).__name__}: {e}") from None
        if not 200 <= resp.status < 300:
            raise _status_error(resp.status, data)
        if not data:
            return {}
        doc = orjson.loads(data)
        return doc if isinstance(doc, dict) else {"items": doc}

    def stream(self, path: str, query: Mapping[str, Any], read_timeout: float) -> Any:
        """Open a watch: the urllib3 response, to read line by line (KubeError for a non-2xx status)."""
        params = [(k, _param(v)) for k, v in query.items() if v is not None]
        try:
            m, url, hdrs, _, _ = self.api.param_serialize(
                "GET", path, query_params=params, header_params={"Accept": "application/json"}, auth_settings=AUTH
            )
            resp = self.api.call_api(m, url, header_params=hdrs, _request_timeout=(5.0, read_timeout))
        except Exception as e:
            raise KubeError(0, f"{type(e).__name__}: {e}") from None
        if not 200 <= resp.status < 300:
            raise _status_error(resp.status, resp.read())  # type: ignore[no-untyped-call]
        return resp.response

    # ---- the calls gpuslice makes ----------------------------------------------------------------

    def get(self, path: str) -> Obj | None:
        """The object at ``path``, None when it does not exist."""
        try:
            return self.request("GET", path)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        return self.get(pod_path(namespace, name))

    def patch_pod(self, namespace: str, name: str, body: Any, content_type: str, metadata_only: bool = False) -> Obj:
        """Patch the pod; the reply is the patched pod, or only its metadata with ``metadata_only``."""
        return self.request("PATCH", pod_path(namespace, name), body, content_type=content_type,
                            accept=METADATA_ONLY if metadata_only else "application/json")

    def patch_pod_status(self, namespace: str, name: str, body: Any, content_type: str) -> Obj:
        return self.request("PATCH", pod_path(namespace, name) + "/status", body, content_type=content_type)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str,
                 annotations: Mapping[str, str] | None = None) -> None:
        """Create the pod's Binding; ``uid`` is a precondition (a re-created pod of that name fails).

        ``annotations`` are written on the pod in the same update that sets its node (kube-apiserver
        merges a Binding's annotations into the pod's): both land, or neither does.
        """
        meta: Obj = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.request("POST", pod_path(namespace, name) + "/binding", body)

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Evict the pod through the Eviction API (PodDisruptionBudgets apply; 429 while one forbids it);
        ``uid`` is a precondition, so a re-created pod of that name is left alone (409)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        self.request("POST", pod_path(namespace, name) + "/eviction", body)

    def create_event(self, namespace: str, body: Obj) -> None:
        self.request("POST", f"/api/v1/namespaces/{q(namespace)}/events", body)

    def annotate_node(self, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into the Node's (nothing else of it changes)."""
        self.request("PATCH", f"/api/v1/nodes/{q(name)}", {"metadata": {"annotations": dict(annotations)}},
                     content_type=MERGE_PATCH)

    def get_claim_template(self, namespace: str, name: str) -> Obj | None:
        return self.get(f"/apis/resource.k8s.io/v1/namespaces/{q(namespace)}/resourceclaimtemplates/{q(name)}")

    def get_claim(self, namespace: str, name: str) -> Obj | None:
        return self.get(f"/apis/resource.k8s.io/v1/namespaces/{q(namespace)}/resourceclaims/{q(name)}")


def connect(kubeconfig: str | None = None, connections: int | None = None) -> Kube:
    """A Kube for a service: ``kubeconfig`` when given, else the pod's service account. Keeps up to
    ``connections`` connections open: every thread that calls the API at once needs one, or the pool
    opens (and then drops) a new one, a TLS handshake on both sides each time. ConfigException or
    OSError when the configuration is unusable."""
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    if kubeconfig:
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    return Kube(client.ApiClient(configuration))


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _kubeconfig_path(kubeconfig: str) -> str | None:
    """The kubeconfig an operator's command reads as kubectl picks it; None: the pod's service account.
    ConfigException when there is neither, in words a user can act on."""
    from kubernetes import config as kube_config

    named = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    path = kubeconfig or named or os.path.expanduser("~/.kube/config")
    if kubeconfig or os.path.exists(path):
        return path
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        return None
    where = f"$KUBECONFIG names {named}, which does not exist" if named else \
        "$KUBECONFIG is not set and ~/.kube/config does not exist"
    raise kube_config.ConfigException(f"no kubeconfig ({where}) and not in a pod: give --kubeconfig FILE")


def _kubeconfig_call(path: str, call: Callable[[], T]) -> T:
    """``call()`` reading the kubeconfig ``path``; whatever it raises (the client raises YAML, type and key
    errors for a malformed file) as one ConfigException line naming the file."""
    from kubernetes import config as kube_config

    try:
        return call()
    except kube_config.ConfigException as e:
        raise kube_config.ConfigException(f"kubeconfig {path}: {' '.join(str(e).split())}") from e
    except OSError as e:
        raise kube_config.ConfigException(f"cannot read kubeconfig {path}: {e.strerror or e}") from e
    except Exception as e:
        raise kube_config.ConfigException(f"kubeconfig {path} is malformed ({type(e).__name__}: "
                                          f"{' '.join(str(e).split())[:300]})") from e


def operator_kube(kubeconfig: str = "") -> Kube:
    """A Kube for an operator's command: ``kubeconfig``, else $KUBECONFIG or ~/.kube/config when it
    exists, else the pod's service account (a Job). ConfigException (one line) when none works."""
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    path = _kubeconfig_path(kubeconfig)
    if path is not None:
        _kubeconfig_call(path, lambda: kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration))
    else:
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return Kube(client.ApiClient(configuration))


def current_namespace(kubeconfig: str = "") -> str:
    """kubectl's default namespace: the kubeconfig context's, else the pod's service account's, else default."""
    from kubernetes import config as kube_config

    path = _kubeconfig_path(kubeconfig)
    if path is not None:
        _, context = _kubeconfig_call(path, lambda: kube_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=path))
        return str(((context or {}).get("context") or {}).get("namespace") or "default")
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _timeout(timeout: float | tuple[float, float]) -> urllib3.Timeout:
    import urllib3

    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout)


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{q(namespace)}/pods/{q(name)}"


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_time(value: object) -> float:
    """Seconds since the epoch of an API time (RFC 3339, with or without microseconds); 0 when unreadable."""
    if not isinstance(value, str) or not value:
        return 0.0
    text = value.rstrip("Z")
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    try:
        return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0
