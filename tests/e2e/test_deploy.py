"""Deploying gpuslice, against the real kube-apiserver: what the README's install exercises.

- every object the chart renders, under every values combination of ``tests/chart/matrix.py`` and as
  the plain manifests, applies with server-side dry-run (every check the API server makes: schema,
  defaulting, validation, admission; nothing stored). CRD-backed kinds (cert-manager's Certificate
  and Issuer, the Prometheus Operator's PrometheusRule) are checked against the real CRDs, read
  from those projects' Go modules and installed here; KubeVirt's CRDs are generated in Go, not
  shipped as files, so its two kinds get a stand-in CRD that keeps every field (the policy reads them);
- the admission policies refuse each example of ``deploy/examples/refused/`` with the message its
  first line documents (the README lists the same), and admit the examples of ``deploy/examples/``;
- the Ollama-style example's pod gets its v100-25 slice, the batch Job's its v100-50 by claim, the
  training Job's a whole card (the pods their controllers would create; no kubelet runs them);
- ``gpuslice certs`` run again changes nothing, ``--renew --restart`` renews and rolls the
  Deployments under the chart's RBAC for it; ``gpuslice status`` reaches the TLS service with the
  chart's Secrets and settings; ``gpuslice gates`` lists and lifts the queue gate.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.certs.plan import METRICS_SECRET
from packing.claims import DEFAULT_ADMISSION
from packing.kube.client import Kube, KubeError
from packing.policies import DEFAULT_POLICY
from tests.chart.helm import HelmUnavailable, helm_binary, objects, template
from tests.chart.matrix import MATRIX
from tests.chart.schemas import SchemasUnavailable, crd_documents

from . import gpuslice_harness as h
from . import manifests
from .cluster import ControlPlane, create_namespace, create_ready_node, wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
Obj = dict[str, Any]

KUBEVIRT_STAND_INS = [
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": f"{plural}.kubevirt.io"},
     "spec": {"group": "kubevirt.io", "scope": "Namespaced",
              "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
              "versions": [{"name": "v1", "served": True, "storage": True,
                            "schema": {"openAPIV3Schema": {"type": "object",
                                                           "x-kubernetes-preserve-unknown-fields": True}}}]}}
    for kind, plural in (("VirtualMachineInstance", "virtualmachineinstances"), ("VirtualMachine", "virtualmachines"))
]


def unavailable(message: str) -> None:
    if os.environ.get("GPUSLICE_E2E_ALLOW_SKIP") == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return helm_binary()
    except HelmUnavailable as e:
        unavailable(str(e))
        raise


@pytest.fixture(scope="module")
def gs(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.Gpuslice]:
    g = h.install(control_plane, tmp_path_factory.mktemp("deploy"))
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def crds(gs: h.Gpuslice) -> None:
    """cert-manager's and the Prometheus Operator's CRDs (real), KubeVirt's stand-ins; established."""
    try:
        docs = [*crd_documents(), *KUBEVIRT_STAND_INS]
    except SchemasUnavailable as e:
        unavailable(str(e))
        raise
    for crd in docs:
        h.apply(gs.kube, crd)
    for crd in docs:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"

        def established(path: str = path) -> bool:
            conditions = (gs.kube.request("GET", path).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, 60, what=f"CRD {crd['metadata']['name']} established")
    h.resources(gs.kube).refresh()


@pytest.fixture
def ns(gs: h.Gpuslice) -> Iterator[str]:
    name = create_namespace(gs.cp.api_client(), "deploy")
    yield name
    h.clear_namespace(gs.kube, name)


def ensure_namespaces(kube: Kube, objs: list[Obj]) -> None:
    """The namespaces a render puts objects in must exist for a dry-run of them (the chart makes its
    own only with namespace.create; the example claim templates go to the users' namespaces)."""
    for name in sorted({o["metadata"]["namespace"] for o in objs if o["metadata"].get("namespace")}):
        if kube.get(f"/api/v1/namespaces/{name}") is None:
            kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": name}})


def dry_run_failures(kube: Kube, objs: list[Obj]) -> dict[str, str]:
    failures = {}
    for obj in objs:
        try:
            manifests.apply(kube, h.resources(kube), obj, dry_run=True)
        except KubeError as e:
            failures[f"{obj['kind']}/{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"] = str(e)
    return failures


def is_policy_or_catalog(obj: Obj) -> bool:
    """What decides which products the admission policies take: the policies, their bindings (the paramRef)
    and the catalog ConfigMap they read."""
    return obj["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding") or (
        obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "gpuslice-catalog")


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_object_of_every_render_applies_with_server_side_dry_run(
    gs: h.Gpuslice, crds: None, helm: Path, case: str
) -> None:
    objs = objects(template(helm, MATRIX[case]))
    ensure_namespaces(gs.kube, objs)
    policies = [o for o in objs if is_policy_or_catalog(o)]
    if "catalog" not in MATRIX[case]:
        assert dry_run_failures(gs.kube, objs) == {}
    else:
        # a new catalog's claim templates pass only once the policies read the new catalog (their params,
        # the catalog ConfigMap): the policies, their bindings and the catalog are applied here for real,
        # then the defaults restored
        try:
            for policy in policies:
                h.apply(gs.kube, h.as_installed(policy))
            wait_for(lambda: dry_run_failures(gs.kube, objs) == {}, 20, interval=1.0,
                     what="the render's objects to pass its own policies")
        finally:
            defaults = manifests.rendered()
            for policy in defaults:
                if is_policy_or_catalog(policy):
                    h.apply(gs.kube, h.as_installed(policy))
            # the API server takes the policies in a moment: the next test must meet the defaults
            wait_for(lambda: dry_run_failures(gs.kube, defaults) == {}, 20, interval=1.0,
                     what="the default policies back in force")
    assert len(objs) > 20


@pytest.mark.parametrize("name", ["gpuslice.yaml", "monitoring.yaml"])
def test_every_object_of_the_plain_manifests_applies_with_server_side_dry_run(
    gs: h.Gpuslice, crds: None, name: str
) -> None:
    objs = manifests.rendered(name)
    assert dry_run_failures(gs.kube, objs) == {}


def example_objects(path: Path, namespace: str) -> list[Obj]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:
        d["metadata"]["namespace"] = namespace
    return docs


def documented_refusal(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# refused: "), f"{path.name}: the first line must document the message"
    return first.removeprefix("# refused: ").strip()


@pytest.mark.parametrize("path", sorted((EXAMPLES / "refused").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_refused_example_is_refused_with_its_documented_message(
    gs: h.Gpuslice, crds: None, ns: str, path: Path
) -> None:
    (obj,) = example_objects(path, ns)
    with pytest.raises(KubeError) as refused:
        manifests.create(gs.kube, h.resources(gs.kube), obj, dry_run=True)
    assert refused.value.status in (400, 403, 422), refused.value
    assert documented_refusal(path) in str(refused.value), str(refused.value)
    assert str(refused.value).count("gpuslice") >= 1


def test_the_examples_are_admitted_and_their_pods_get_their_slices(gs: h.Gpuslice, ns: str) -> None:
    kube = gs.kube
    node = "deploy-gpu-0"
    create_ready_node(gs.cp.api_client(), node, capacity={"cpu": "64", "memory": "256Gi"}, labels={
        "nvidia.com/gpu.product": h.V100, "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "32768"})
    try:
        h.apply(kube, h.resource_slice(node))
        # the uninstall lists (and deletes) gpuslice's ResourceSlices by this field selector
        listed = kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                              query={"fieldSelector": "spec.driver=gpuslice.io"})
        assert f"{node}-gpuslice" in {s["metadata"]["name"] for s in listed["items"]}
        # the chart's example claim template v100-50, as claimTemplates.namespaces would put it in this namespace
        template_obj = copy.deepcopy(manifests.find(
            [o for o in manifests.rendered() if o["metadata"].get("namespace") == "default"],
            "ResourceClaimTemplate", "v100-50"))
        template_obj["metadata"] = {"name": "v100-50", "namespace": ns}
        manifests.create(kube, h.resources(kube), template_obj)
        # catalog-*.yaml are Helm values files (README "Upgrade", run by make e2e-install), not objects
        examples = {p.stem: example_objects(p, ns) for p in sorted(EXAMPLES.glob("*.yaml"))
                    if not p.stem.startswith("catalog-")}
        # first-slice (README's first slice, a bare Pod) is admitted here; make e2e-install runs it on a real node
        assert set(examples) == {"ollama-v100-25", "batch-v100-50", "training-v100-100", "training-gang-v100-100",
                                 "first-slice"}
        for objs in examples.values():
            for obj in objs:
                manifests.create(kube, h.resources(kube), obj, dry_run=True)  # admitted: no exception
        wanted = {"ollama-v100-25": ("v100-25", 8192), "training-v100-100": ("v100-100", 32768),
                  "batch-v100-50": ("v100-50", 16384)}
        gang = next(o for o in examples["training-gang-v100-100"] if o["kind"] == "Job")
        workers = [f"gang-{i}" for i in range(gang["spec"]["parallelism"])]
        for i, name in enumerate(workers):  # the Job's pods, as its controller would create them: together
            created = h.create_pod(kube, ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": name, "namespace": ns, **gang["spec"]["template"]["metadata"]},
                "spec": gang["spec"]["template"]["spec"]})
            assert h.is_gated(created)
            if i == 0:  # alone, its group incomplete: it waits
                h.poll(lambda: (h.queued(kube.get_pod(ns, "gang-0") or {}) or {}).get("reason") == "WaitingForMembers",
                       20, "the first worker to wait for its group")
        for name in workers:
            record = h.record(h.wait_bound(kube, ns, name, timeout=30))
            assert record is not None and record.product == "v100-100"
        for name in workers:
            h.delete_now(kube, ns, name)
        for stem, (product, memory) in wanted.items():
            workload = next(o for o in examples[stem] if o["kind"] in ("Deployment", "Job"))
            pod = {"apiVersion": "v1", "kind": "Pod",  # what its controller would create from the template
                   "metadata": {"name": stem, "namespace": ns,
                                **{k: v for k, v in workload["spec"]["template"].get("metadata", {}).items()}},
                   "spec": workload["spec"]["template"]["spec"]}
            if stem == "ollama-v100-25":  # no PV controller here binds the claim: the models on an emptyDir
                pod["spec"] = {**pod["spec"], "volumes": [{"name": "models", "emptyDir": {}}]}
            created = h.create_pod(kube, ns, pod)
            assert h.is_gated(created) and created["spec"]["schedulerName"] == h.SCHEDULER_NAME
            if stem == "batch-v100-50":
                h.stand_in_claim_controller(kube, ns, created, template_obj)
            bound = h.wait_bound(kube, ns, stem, timeout=30)
            record = h.record(bound)
            assert record is not None and (record.product, record.memory_mib, record.node) == (product, memory, node)
            if stem == "ollama-v100-25":
                resources = bound["spec"]["containers"][0]["resources"]
                assert (resources["requests"]["memory"], resources["limits"]["memory"]) == ("2Gi", "4Gi")
                env = {e["name"]: e["value"] for e in bound["spec"]["containers"][0]["env"]}
                assert env["OLLAMA_CONTEXT_LENGTH"] == "16384"
                assert bound["spec"]["containers"][0]["image"] == "ollama/ollama:0.24.0"
    finally:
        h.clear_namespace(kube, ns)
        h.delete_nodes(kube, [node])


def run_cli(kubeconfig: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "packing.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(kubeconfig),
                                         **(env or {})})


def test_gpuslice_certs_again_keeps_everything_and_renew_restarts_the_readers(gs: h.Gpuslice) -> None:
    kube = gs.kube
    certs_config = gs.cp.user_kubeconfig(h.CERTS_USER)
    before = {n: h.secret_data(kube, n) for n in (h.CA_SECRET, h.SERVING_SECRET, h.CLIENT_SECRET, METRICS_SECRET)}
    again = h.run_certs(certs_config, "--san", "127.0.0.1", home=gs.work)
    assert again.returncode == 0, again.stderr
    assert "nothing changed" in again.stdout and "caBundle already current" in again.stdout, again.stdout
    assert {n: h.secret_data(kube, n) for n in before} == before
    webhook = kube.request("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpuslice")
    import base64

    assert base64.b64decode(webhook["webhooks"][0]["clientConfig"]["caBundle"]) == before[h.SERVING_SECRET]["ca.crt"]
    # the two readers exist as the manifests make them (no controller runs them here)
    for name in ("gpuslice-extender", "gpuslice-scheduler"):
        h.apply(kube, manifests.find(manifests.rendered(), "Deployment", name))
    renewed = h.run_certs(certs_config, "--san", "127.0.0.1", "--renew", "--restart", home=gs.work)
    assert renewed.returncode == 0, renewed.stderr
    after = {n: h.secret_data(kube, n) for n in before}
    assert after[h.CA_SECRET] == before[h.CA_SECRET]
    for leaf in (h.SERVING_SECRET, h.CLIENT_SECRET, METRICS_SECRET):
        assert after[leaf]["tls.crt"] != before[leaf]["tls.crt"] and after[leaf]["ca.crt"] == before[leaf]["ca.crt"]
    for name in ("gpuslice-extender", "gpuslice-scheduler"):
        deployment = kube.request("GET", f"/apis/apps/v1/namespaces/{h.SYSTEM_NS}/deployments/{name}")
        annotations = deployment["spec"]["template"]["metadata"].get("annotations") or {}
        assert "kubectl.kubernetes.io/restartedAt" in annotations, name
        assert f"Deployment {name}: restarting" in renewed.stdout
    # the running extender and kube-scheduler loaded the old leaves: the same CA keeps trusting them
    (node,) = ["deploy-renew-0"]
    h.gpu_node(kube, gs.cp.api_client(), node, 1)
    try:
        ns = create_namespace(gs.cp.api_client(), "renew")
        h.create_pod(kube, ns, h.slice_pod("after-renew", "v100-25"))
        assert h.node_of(h.wait_bound(kube, ns, "after-renew")) == node
        h.clear_namespace(kube, ns)
    finally:
        h.delete_nodes(kube, [node])
    refused = h.run_certs(certs_config, "--renew", "--rotate-ca", home=gs.work)
    assert refused.returncode == 2 and "not allowed with argument --renew" in refused.stderr
    refused = h.run_certs(certs_config, "--leaf-days", "0", home=gs.work)
    assert refused.returncode == 2 and "argument --leaf-days: expected a whole number >= 1" in refused.stderr
    assert {n: h.secret_data(kube, n) for n in before} == after  # a refusal writes nothing


def test_gpuslice_status_reaches_the_tls_service_with_the_charts_secrets_and_settings(gs: h.Gpuslice) -> None:
    """As `kubectl exec <leader> -- gpuslice status` runs it: the rendered GPUSLICE_STATUS_* settings,
    the CA from the Secret, the serving certificate's Service name; only the port is the test's."""
    container = h.extender_container()
    settings = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("GPUSLICE_STATUS_")}
    assert settings["GPUSLICE_STATUS_URL"] == "https://127.0.0.1:8888"
    settings["GPUSLICE_STATUS_URL"] = gs.extender.url
    settings["GPUSLICE_STATUS_CA"] = str(gs.tls.ca)  # the Secret's ca.crt, mounted at /etc/gpuslice/tls/ca.crt
    assert settings["GPUSLICE_STATUS_SERVER_NAME"] == "gpuslice-extender.gpuslice-system.svc"
    out = run_cli(gs.kubeconfig, "status", env={**settings, "HOME": str(gs.work)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"mode strict, policy {DEFAULT_POLICY}, admission {DEFAULT_ADMISSION}, ready; "), \
        out.stdout  # the chart's
    wrong = run_cli(gs.kubeconfig, "status", env={**settings, "GPUSLICE_STATUS_SERVER_NAME": "someone-else.svc",
                                                 "HOME": str(gs.work)})
    assert wrong.returncode == 1 and "certificate" in wrong.stderr.lower(), wrong.stderr


def test_prometheus_certificate_reads_metrics_and_nothing_else(gs: h.Gpuslice, tmp_path: Path) -> None:
    """The Secret gpuslice certs made for Prometheus, presented as the PodMonitor presents it."""
    data = h.secret_data(gs.kube, METRICS_SECRET)
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    (tmp_path / "tls.key").write_bytes(data["tls.key"])
    cert = (tmp_path / "tls.crt", tmp_path / "tls.key")
    status, _ = gs.extender.call("GET", "/state", cert=cert)
    assert status == 403
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=str(gs.tls.ca))
    context.load_cert_chain(str(cert[0]), str(cert[1]))
    with urllib.request.urlopen(gs.extender.url + "/metrics", timeout=5, context=context) as resp:
        assert resp.status == 200 and b"gpuslice_leader" in resp.read()
    status, reply = gs.extender.call("POST", "/filter", {"Pod": h.slice_pod("p", "v100-25"), "NodeNames": []},
                                     cert=cert)
    assert status == 403 and "may read /metrics only" in reply["error"], reply


def test_gpuslice_gates_lists_and_lifts_the_queue_gate(gs: h.Gpuslice, ns: str) -> None:
    kube = gs.kube
    h.create_pod(kube, ns, h.slice_pod("waits", "v100-100"))  # no GPU node: it waits, gated
    time.sleep(1.0)
    assert h.is_gated(kube.get_pod(ns, "waits") or {})
    admin = gs.cp.kubeconfig
    listed = run_cli(admin, "gates", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if "waits" in line]
    assert row.split()[:3] == [ns, "waits", "v100-100"] and row.split()[-1] == h.SCHEDULER_NAME
    lifted = run_cli(admin, "gates", "-n", ns, "--lift")
    assert lifted.returncode == 0 and "lifted 1 of 1 gates" in lifted.stdout, lifted.stdout + lifted.stderr
    assert not h.is_gated(kube.get_pod(ns, "waits") or {})
    empty = run_cli(admin, "gates", "-n", ns)
    assert "no pod carries the gpuslice.io/queue gate" in empty.stdout


def shape(text: str) -> str:
    """``text`` with its numbers masked."""
    return re.sub(r"\d+", "N", text)


def test_gpuslice_queue_lists_the_waiting_pods_in_line_order(gs: h.Gpuslice, ns: str) -> None:
    """`gpuslice queue` reads the waiting pods' gpuslice.io/Queued conditions from the API, as the README's
    runbook has an operator run it: a table as kubectl prints one, -A with the namespace, -o json. What it
    shows is what the conditions say (the reason is the admission strategy's: not asserted here)."""
    kube, admin = gs.kube, gs.cp.kubeconfig
    node = "deploy-queue-0"
    h.gpu_node(kube, gs.cp.api_client(), node, 1)
    try:
        h.create_pod(kube, ns, h.slice_pod("whole", "v100-100"))
        h.wait_bound(kube, ns, "whole")
        for name, product in (("quarter", "v100-25"), ("second", "v100-100")):
            h.create_pod(kube, ns, h.slice_pod(name, product))
            time.sleep(1.05)  # creation timestamps have second resolution: the line order is unambiguous

        def told(names: tuple[str, ...], positions: tuple[int, ...]) -> dict[str, Obj] | None:
            """The pods' Queued conditions once each names its expected place in line."""
            out = {}
            for name, position in zip(names, positions, strict=True):
                c = h.queued(kube.get_pod(ns, name) or {})
                if c is None or c["status"] != "True" or not c["message"].startswith(f"position {position} "):
                    return None
                out[name] = c
            return out

        conditions = h.poll(lambda: told(("quarter", "second"), (1, 2)), 30, "both waiting pods explained")
        listed = run_cli(admin, "queue", "-n", ns)
        assert listed.returncode == 0, listed.stderr
        header, *rows = listed.stdout.splitlines()
        assert header.split() == ["NAME", "POSITION", "PRODUCT", "REASON", "WAITED", "EXPECTED", "MESSAGE"]
        assert [r.split()[:4] for r in rows] == [
            ["quarter", "1", "v100-25", conditions["quarter"]["reason"]],
            ["second", "2", "v100-100", conditions["second"]["reason"]]], listed.stdout
        # the message without its position prefix (its figures, e.g. how long it waited, move on between reads)
        message = shape(conditions["quarter"]["message"].removeprefix("position 1 in the gpuslice queue: "))
        assert shape(rows[0]).endswith(message) and "position" not in rows[0]
        everywhere = run_cli(admin, "queue", "-A")
        assert everywhere.returncode == 0, everywhere.stderr
        assert everywhere.stdout.splitlines()[0].split()[0] == "NAMESPACE"
        assert [ns, "quarter", "1"] in [r.split()[:3] for r in everywhere.stdout.splitlines()[1:]]
        as_json = run_cli(admin, "queue", "-n", ns, "-o", "json")
        assert as_json.returncode == 0, as_json.stderr
        items = json.loads(as_json.stdout)["items"]
        assert [(i["name"], i["position"], i["product"], i["reason"], i["status"]) for i in items] == [
            ("quarter", 1, "v100-25", conditions["quarter"]["reason"], "gated"),
            ("second", 2, "v100-100", conditions["second"]["reason"], "gated")]
        assert shape(items[0]["message"]) == message and all(i["waitedSeconds"] >= 1 for i in items)
        h.delete_now(kube, ns, "whole")  # the quarter takes the card and leaves the line: the second moves up
        h.wait_bound(kube, ns, "quarter")
        moved = h.poll(lambda: told(("second",), (1,)), 40, "the second pod told it is first in line")
        out = run_cli(admin, "queue", "-n", ns, "--no-headers")
        assert [r.split()[:4] for r in out.stdout.splitlines()] == [
            ["second", "1", "v100-100", moved["second"]["reason"]]], out.stdout
        h.delete_now(kube, ns, "second")
        empty = run_cli(admin, "queue", "-n", ns)
        assert empty.returncode == 0 and empty.stdout == "" and f"No pods wait for a slice in namespace {ns}." \
            in empty.stderr, empty.stdout + empty.stderr
    finally:
        h.clear_namespace(kube, ns)
        h.delete_nodes(kube, [node])


def test_the_queued_message_and_gpuslice_queue_give_the_expected_wait_of_the_pods_product(
        gs: h.Gpuslice, ns: str) -> None:
    """Once enough claims of a product were admitted (packing.wait_history.MIN_SEEN), a waiting pod of that
    product is told what their waits say, in its gpuslice.io/Queued message, and `gpuslice queue` shows the
    same under EXPECTED (and in -o json): the operator's view of "is a quarter forgotten?"."""
    kube, admin = gs.kube, gs.cp.kubeconfig
    node = "deploy-expected-0"
    h.gpu_node(kube, gs.cp.api_client(), node, 2)  # 8 quarters
    try:
        for round_ in range(3):  # 24 quarters admitted: more than MIN_SEEN waits recorded for v100-25
            names = [f"q{round_}-{k}" for k in range(8)]
            for name in names:
                h.create_pod(kube, ns, h.slice_pod(name, "v100-25"))
            for name in names:
                h.wait_bound(kube, ns, name)
            if round_ < 2:
                for name in names:
                    h.delete_now(kube, ns, name)
                h.poll(lambda names=names: all(kube.get_pod(ns, n) is None for n in names), 30, "the quarters gone")
        h.create_pod(kube, ns, h.slice_pod("late", "v100-25"))  # the card is full: it waits

        def told() -> Obj | None:
            c = h.queued(kube.get_pod(ns, "late") or {})
            return c if c is not None and c["status"] == "True" and "v100-25 lately: median" in c["message"] else None

        cond = h.poll(told, 30, "the waiting quarter told its product's recent waits")
        said = re.search(r"; (?:expected start in about ([^;()]+)|(waited longer than every recent v100-25 claim)); "
                         r"v100-25 lately: median [^;()]+, p90 [^;()]+\)$", cond["message"])
        assert said is not None, cond["message"]
        expected = f"~{said.group(1)}" if said.group(1) else "longer"
        listed = run_cli(admin, "queue", "-n", ns)
        assert listed.returncode == 0, listed.stderr
        header, *rows = listed.stdout.splitlines()
        column = header.split().index("EXPECTED")
        assert [r.split()[0] for r in rows] == ["late"], listed.stdout
        assert " ".join(rows[0].split()[column:column + len(expected.split())]) == expected, listed.stdout
        items = json.loads(run_cli(admin, "queue", "-n", ns, "-o", "json").stdout)["items"]
        assert [(i["name"], i["expected"]) for i in items] == [("late", expected)]
    finally:
        h.clear_namespace(kube, ns)
        h.delete_nodes(kube, [node])
