"""The Helm chart rendered under every combination of values a user may choose (``matrix.py``):
each object validates against Kubernetes 1.34's own OpenAPI schema (or its CRD's), and says what
the values asked for. Bad values are refused by ``values.schema.json`` with the value named."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from packing.products import load_catalog

from .helm import RENDERS, manifest, objects, template
from .matrix import MATRIX
from .schemas import Schemas

Obj = dict[str, Any]
RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "DeviceClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def merged(values: dict[str, Any]) -> dict[str, Any]:
    """values.yaml overlaid with ``values`` (as helm does)."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "values.yaml"
    base: dict[str, Any] = yaml.safe_load(path.read_text())

    def overlay(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for k, v in b.items():
            out[k] = overlay(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return overlay(base, values)


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind}/{name}"
    return found[0]


def containers(obj: Obj) -> list[Obj]:
    spec = obj["spec"]
    pod = spec["jobTemplate"]["spec"]["template"]["spec"] if obj["kind"] == "CronJob" else spec["template"]["spec"]
    return list(pod.get("initContainers") or []) + list(pod["containers"])


@pytest.fixture(scope="module")
def renders(helm: Path) -> dict[str, list[Obj]]:
    return {name: objects(template(helm, values)) for name, values in MATRIX.items()}


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_object_validates_against_the_kubernetes_1_34_schema(
    case: str, renders: dict[str, list[Obj]], schemas: Schemas
) -> None:
    objs = renders[case]
    assert objs
    problems = {f"{o['kind']}/{o['metadata']['name']}": schemas.errors(o) for o in objs}
    assert {k: v for k, v in problems.items() if v} == {}
    seen = set()
    for o in objs:
        key = (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        assert key not in seen, f"{key} rendered twice"
        seen.add(key)
        assert (o["kind"] in CLUSTER_SCOPED) == ("namespace" not in o["metadata"]), key
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpuslice", key


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_what_the_values_ask_for_is_what_is_rendered(case: str, renders: dict[str, list[Obj]]) -> None:
    values, objs = merged(MATRIX[case]), renders[case]
    kinds = {o["kind"] for o in objs}
    extender = one(objs, "Deployment", "gpuslice-extender")
    command = containers(extender)[0]["command"]
    assert command[command.index("--mode") + 1] == values["mode"]
    assert command[command.index("--policy") + 1] == values["policy"]
    assert extender["spec"]["replicas"] == values["extender"]["replicas"]
    refused = [command[i + 1] for i, w in enumerate(command) if w == "--refuse-resource"]
    bare = values["admission"]["refuseBareGpu"]
    assert refused == (bare["resources"] if bare["enabled"] else [])
    # the scheduler profile: the extender's weight by mode unless set
    config = yaml.safe_load(one(objs, "ConfigMap", "gpuslice-scheduler-config")["data"]["scheduler-config.yaml"])
    weight = values["scheduler"]["extenderWeight"] or (150 if values["mode"] == "cooperative" else 20)
    assert config["extenders"][0]["weight"] == weight
    assert config["extenders"][0]["urlPrefix"] == "https://gpuslice-extender.gpuslice-system.svc:8888"
    assert config["extenders"][0]["managedResources"] == [] and config["extenders"][0]["ignorable"] is False
    # the catalog: one TOML for the extender and the agent, one DeviceClass per product, the same list in the policy
    catalog = one(objs, "ConfigMap", "gpuslice-catalog")["data"]
    products = [p["name"] for p in values["catalog"]["products"]]
    assert [p["name"] for p in tomllib.loads(catalog["catalog.toml"])["products"]] == products
    # the admission policies' params, in the same ConfigMap: they cannot disagree with the catalog
    assert catalog["products"].split(",") == products
    assert catalog["fractional"] == ",".join(p["name"] for p in values["catalog"]["products"] if p["milli"] < 1000)
    assert sorted(o["metadata"]["name"] for o in objs if o["kind"] == "DeviceClass") == sorted(
        f"{p}.gpuslice.io" for p in products)
    if values["admission"]["enabled"]:
        for name in ("gpuslice-workload-asks", "gpuslice-claims"):
            policy = one(objs, "ValidatingAdmissionPolicy", name)
            listed = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "products")
            assert listed == "params.data.products.split(',')"
            assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
            binding = one(objs, "ValidatingAdmissionPolicyBinding", name)["spec"]["paramRef"]
            assert binding == {"name": "gpuslice-catalog", "namespace": "gpuslice-system",
                               "parameterNotFoundAction": "Allow"}
        policies = {o["metadata"]["name"] for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
        assert ("gpuslice-virtual-machines" in policies) == values["admission"]["refuseVirtualMachines"]
        # the allocation record: written by the extender's ServiceAccount alone, in every namespace
        record = one(objs, "ValidatingAdmissionPolicy", "gpuslice-allocation-record")
        assert "namespaceSelector" not in record["spec"]["matchConstraints"]
        assert [c["expression"] for c in record["spec"]["matchConditions"]] == [
            'request.userInfo.username != "system:serviceaccount:gpuslice-system:gpuslice-extender"']
        extender_sa = one(objs, "ServiceAccount", "gpuslice-extender")
        assert extender_sa["metadata"]["namespace"] == "gpuslice-system"
        assert one(objs, "ValidatingAdmissionPolicyBinding", "gpuslice-allocation-record")["spec"][
            "validationActions"] == ["Deny"]
    else:
        assert not [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
                    and o["metadata"]["name"] != "gpuslice-agent-own-node"]
    templates = {(o["metadata"]["namespace"], o["metadata"]["name"])
                 for o in objs if o["kind"] == "ResourceClaimTemplate"}
    assert templates == {(ns, p) for ns in values["claimTemplates"]["namespaces"] for p in products}
    entitlements = one(objs, "ConfigMap", "gpuslice-entitlements")["data"]
    assert entitlements == values["entitlements"]
    # the agent on the shared pool only, and only when enabled
    if values["agent"]["enabled"]:
        agent = one(objs, "DaemonSet", "gpuslice-agent")
        assert agent["spec"]["template"]["spec"]["nodeSelector"] == values["sharedPool"]["nodeSelector"]
        assert ("--no-pacing" in containers(agent)[0]["args"]) == (not values["agent"]["pacing"])
    else:
        assert "DaemonSet" not in kinds
    # TLS: the bootstrap Job and CronJob, or cert-manager's Certificates and its CA injection
    webhook = one(objs, "MutatingWebhookConfiguration", "gpuslice")
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"]
    certs_jobs = {o["metadata"]["name"] for o in objs if o["kind"] in ("Job", "CronJob")} - {"gpuslice-uninstall-check"}
    if values["tls"]["mode"] == "bootstrap":
        assert certs_jobs == {"gpuslice-certs-init", "gpuslice-certs", "gpuslice-certs-renew"}
        assert "Certificate" not in kinds
        # the Secrets exist before the pods that mount them (helm install --wait), the caBundle is set after
        init = one(objs, "Job", "gpuslice-certs-init")
        assert init["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert one(objs, "Job", "gpuslice-certs")["metadata"]["annotations"]["helm.sh/hook"] == \
            "post-install,post-upgrade"
        hooked = {(o["kind"], o["metadata"]["name"]) for o in objs
                  if "pre-install" in ((o["metadata"].get("annotations") or {}).get("helm.sh/hook") or "")}
        assert hooked == {("ServiceAccount", "gpuslice-certs-init"), ("Role", "gpuslice-certs-init"),
                          ("RoleBinding", "gpuslice-certs-init"), ("Job", "gpuslice-certs-init")}
        assert "cert-manager.io/inject-ca-from" not in (webhook["metadata"].get("annotations") or {})
    else:
        assert not certs_jobs
        certificates = {o["spec"]["secretName"]: o for o in objs if o["kind"] == "Certificate"}
        assert {"gpuslice-extender-tls", "gpuslice-scheduler-client-tls"} <= set(certificates)
        issuer = values["tls"]["certManager"]["issuerRef"] or {"name": "gpuslice-ca", "kind": "Issuer"}
        assert certificates["gpuslice-extender-tls"]["spec"]["issuerRef"] == issuer
        assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
            "gpuslice-system/gpuslice-extender"
    assert ("Namespace" in kinds) == values["namespace"]["create"]
    assert ("PrometheusRule" in kinds) == values["monitoring"]["prometheusRule"]["enabled"]
    assert ("PodMonitor" in kinds) == values["monitoring"]["podMonitor"]["enabled"]
    metrics = [command[i + 1] for i, w in enumerate(command) if w == "--metrics-subject"]
    assert metrics == ["CN=gpuslice-metrics"]  # the subject gpuslice certs and cert-manager issue for Prometheus
    if values["tls"]["mode"] == "cert-manager":
        certificates = {o["spec"]["secretName"]: o["spec"] for o in objs if o["kind"] == "Certificate"}
        assert certificates["gpuslice-metrics-client-tls"]["commonName"] == "gpuslice-metrics"
    # images: images.registry for all three (the scheduler's too), else each image's own registry
    mirror = values["images"]["registry"].rstrip("/")
    for name, obj in (("extender", extender), ("scheduler", one(objs, "Deployment", "gpuslice-scheduler")),
                      ("agent", None if "DaemonSet" not in kinds else one(objs, "DaemonSet", "gpuslice-agent"))):
        if obj is None:
            continue
        image = values["images"][name]
        expected = f"{mirror or image['registry']}/{image['repository']}:{image['tag'] or '0.1.0'}"
        assert containers(obj)[0]["image"] == expected
        assert containers(obj)[0]["imagePullPolicy"] == image["pullPolicy"]
    if values["agent"]["enabled"]:
        args = containers(one(objs, "DaemonSet", "gpuslice-agent"))[0]["args"]
        count = values["agent"]["simulatedGpus"]
        assert [a for a in args if a.startswith("--simulated-gpus")] == ([f"--simulated-gpus={count}"] if count else [])
    # the uninstall check: a pre-delete hook unless turned off; it evicts first with evictPods
    uninstall = values["uninstall"]
    checks = [o for o in objs if o["kind"] == "Job" and o["metadata"]["name"] == "gpuslice-uninstall-check"]
    assert len(checks) == int(uninstall["refuseWhileInUse"] or uninstall["evictPods"])
    for job in checks:
        assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
        timeout = uninstall["evictTimeoutSeconds"]
        if uninstall["evictPods"]:
            assert containers(job)[0]["command"] == ["gpuslice", "slices", "--all-namespaces", "--evict",
                                                     "--timeout", str(timeout)]
            assert job["spec"]["activeDeadlineSeconds"] > timeout  # the command names what stays, not the Job's end
            assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-succeeded,hook-failed"
        else:
            assert containers(job)[0]["command"] == ["gpuslice", "slices", "--all-namespaces", "--refuse"]


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_our_own_containers_run_non_root_read_only_without_privilege_escalation(
    case: str, renders: dict[str, list[Obj]]
) -> None:
    """Every container but the agent's (privileged on purpose: each privilege justified in its template)."""
    for o in renders[case]:
        if o["kind"] in ("Deployment", "Job", "CronJob"):
            for c in containers(o):
                assert c["securityContext"] == RESTRICTED, (o["metadata"]["name"], c["name"])
                assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]
        if o["kind"] == "DaemonSet":
            (c,) = containers(o)
            assert c["securityContext"] == {"privileged": True}


def test_the_default_catalog_is_the_built_in_one(renders: dict[str, list[Obj]], tmp_path: Path) -> None:
    toml = one(renders["defaults"], "ConfigMap", "gpuslice-catalog")["data"]["catalog.toml"]
    (tmp_path / "catalog.toml").write_text(toml)
    rendered, built_in = load_catalog(str(tmp_path / "catalog.toml")), load_catalog(None)
    assert (rendered.products, rendered.models, rendered.resource_prefix) == (
        built_in.products, built_in.models, built_in.resource_prefix)


def test_the_extender_service_reaches_the_leader_only(renders: dict[str, list[Obj]]) -> None:
    objs = renders["defaults"]
    selector = one(objs, "Service", "gpuslice-extender")["spec"]["selector"]
    extender = one(objs, "Deployment", "gpuslice-extender")
    env = {e["name"]: e.get("value") for e in containers(extender)[0]["env"]}
    label = env["GPUSLICE_LEADER_LABEL"]
    assert selector == {"app.kubernetes.io/name": "gpuslice-extender", label: "true"}
    # both replicas Ready while they serve: a rolling update with maxUnavailable 0 and a PDB can proceed
    assert containers(extender)[0]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert extender["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize(("values", "message"), [
    ({"mode": "fast"}, "at '/mode': value must be one of 'strict', 'cooperative'"),
    ({"extender": {"replica": 3}}, "additional properties 'replica' not allowed"),
    ({"extender": {"replicas": 0}}, "at '/extender/replicas'"),
    ({"catalog": {"products": [{"name": "V100_25", "model": "x", "milli": 250, "memoryMiB": 8192}]}},
     "at '/catalog/products/0/name'"),
    ({"catalog": {"products": [{"name": "v100-25", "model": "x", "milli": 1500, "memoryMiB": 8192}]}},
     "at '/catalog/products/0/milli'"),
    ({"tls": {"mode": "vault"}}, "at '/tls/mode'"),
    ({"entitlements": {"team-a": 8}}, "at '/entitlements/team-a'"),
    ({"policy": "best_fit"}, "at '/policy'"),
    ({"extender": {"podGroups": {"bindWaitSeconds": 30}}}, "at '/extender/podGroups/bindWaitSeconds'"),
    ({"uninstall": {"evictPods": True, "evictTimeoutSeconds": -1}}, "at '/uninstall/evictTimeoutSeconds'"),
    ({"uninstall": {"evictPods": "yes"}}, "at '/uninstall/evictPods'"),
])
def test_bad_values_are_refused_naming_the_value(helm: Path, values: dict[str, Any], message: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape(message)):
        template(helm, values)


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_the_plain_manifests_are_a_fresh_render_of_the_chart(helm: Path, name: str) -> None:
    path = Path(__file__).resolve().parents[2] / "deploy" / "manifests" / name
    assert path.read_text() == manifest(helm, name), f"{path} is stale: run `make manifests`"


def test_helm_lint_passes(helm: Path) -> None:
    import subprocess

    chart = Path(__file__).resolve().parents[2] / "deploy" / "chart"
    out = subprocess.run([str(helm), "lint", "--strict", str(chart)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_policy_values_are_the_policies_the_extender_serves() -> None:
    # the schema's list is written out for helm; it must name exactly the registry's policies, default first
    from packing.policies import DEFAULT_POLICY, policy_names

    root = Path(__file__).resolve().parents[2] / "deploy" / "chart"
    schema = json.loads((root / "values.schema.json").read_text())
    assert schema["properties"]["policy"]["enum"] == policy_names()
    assert yaml.safe_load((root / "values.yaml").read_text())["policy"] == DEFAULT_POLICY
