"""Settings travel from ``gpuslice serve`` to the gunicorn worker through GPUSLICE_* variables, intact."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.cli import _parser, config_from_args
from extender.config import ConfigError, ExtenderConfig

words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8)


@st.composite
def configs(draw: st.DrawFn) -> ExtenderConfig:
    verbs = draw(st.lists(words, min_size=3, max_size=3, unique=True))
    standalone = draw(st.booleans())
    return ExtenderConfig(
        host=draw(st.sampled_from(["127.0.0.1", "0.0.0.0", "::1"])),
        port=draw(st.integers(1, 65535)),
        threads=draw(st.integers(1, 64)),
        prefix=draw(st.sampled_from(["", "/v1", "/gpuslice/x"])),
        filter_verb=verbs[0], prioritize_verb=verbs[1], bind_verb=verbs[2],
        max_body_bytes=draw(st.integers(1024, 2**30)),
        mode=draw(st.sampled_from(["strict", "cooperative"])),
        policy=draw(st.sampled_from(["best-fit", "first-fit", "spread", "frag-aware"])),
        reservation_ttl_s=draw(st.floats(0.001, 1e6)),
        pod_cache_size=draw(st.integers(1, 10**6)),
        refused_resources=tuple(draw(st.lists(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu"]), unique=True))),
        standalone=standalone,
        admin=draw(st.booleans()),
        nodes=draw(st.integers(0, 100)) if standalone else 0,
        gpus_per_node=draw(st.integers(0, 16)),
        learn_nodes=draw(st.booleans()) if standalone else False,
        waiting_ttl_s=draw(st.floats(0.001, 1e6)),
        max_nodes=draw(st.integers(1, 10**6)),
        body_timeout_s=draw(st.floats(0.001, 1e3)),
        slow_request_s=draw(st.floats(0.001, 1e3)),
        **draw(st.sampled_from([{}, {"tls_cert": "/tls/c.crt", "tls_key": "/tls/c.key"},
                                {"tls_cert": "c.crt", "tls_key": "c.key", "client_ca": "ca.crt",
                                 "require_client_cert": True,
                                 "client_subjects": ("CN=kube-scheduler", "/O=gpuslice/CN=status")}])),
    )


@settings(max_examples=100, deadline=None)
@given(configs())
def test_env_round_trip_is_exact(config: ExtenderConfig) -> None:
    assert ExtenderConfig.from_env(config.to_env()) == config


@pytest.mark.parametrize("env, needle", [
    ({"GPUSLICE_PORT": "eighty"}, "GPUSLICE_PORT"),
    ({"GPUSLICE_PORT": "0"}, "port"),
    ({"GPUSLICE_STANDALONE": "maybe"}, "GPUSLICE_STANDALONE"),
    ({"GPUSLICE_MODE": "lenient"}, "mode"),
    ({"GPUSLICE_POLICY": "worst-fit"}, "unknown policy"),
    ({"GPUSLICE_PREFIX": "v1/"}, "prefix"),
    ({"GPUSLICE_FILTER_VERB": "bind"}, "distinct"),
    ({"GPUSLICE_RESERVATION_TTL_S": "0"}, "TTL"),
    ({"GPUSLICE_NODES": "3"}, "standalone mode only"),
    ({"GPUSLICE_LEARN_NODES": "1"}, "standalone mode only"),
    ({"GPUSLICE_STANDALONE": "1", "GPUSLICE_WAITING_TTL_S": "-1"}, "waiting TTL"),
    ({"GPUSLICE_MAX_NODES": "0"}, "max nodes"),
    ({"GPUSLICE_TLS_CERT": "c.crt"}, "go together"),
    ({"GPUSLICE_CLIENT_CA": "ca.crt"}, "needs TLS"),
    ({"GPUSLICE_REQUIRE_CLIENT_CERT": "1"}, "needs the CA"),
    ({"GPUSLICE_TLS_CERT": "c", "GPUSLICE_TLS_KEY": "k", "GPUSLICE_CLIENT_CA": "ca",
      "GPUSLICE_CLIENT_SUBJECTS": "commonname-kube"}, "not one of"),
])
def test_bad_settings_name_what_is_wrong(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ExtenderConfig.from_env(env)


def test_unset_variables_keep_the_defaults() -> None:
    assert ExtenderConfig.from_env({}) == ExtenderConfig()
    assert ExtenderConfig.from_env({"UNRELATED": "1"}).port == 8888


def test_command_line_maps_onto_the_config() -> None:
    args = _parser().parse_args(["--standalone", "--port", "9000", "--prefix", "/v1", "--mode", "cooperative",
                                 "--refuse-resource", "nvidia.com/gpu", "--nodes", "4", "--gpus-per-node", "2",
                                 "--max-body-mib", "8", "--reservation-ttl", "12.5"])
    config = config_from_args(args)
    assert (config.port, config.prefix, config.mode, config.refused_resources) == \
        (9000, "/v1", "cooperative", ("nvidia.com/gpu",))
    assert (config.nodes, config.gpus_per_node, config.max_body_bytes, config.reservation_ttl_s) == \
        (4, 2, 8 * 1024 * 1024, 12.5)
    assert config.admin_enabled and config.verb_path("bind") == "/v1/bind"
    with pytest.raises(SystemExit):
        _parser().parse_args(["--standalone", "--cluster"])


def test_the_sample_scheduler_configuration_matches_the_catalog_and_the_defaults() -> None:
    import yaml

    from packing.products import load_catalog

    path = Path(__file__).resolve().parents[2] / "deploy" / "scheduler-config.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1" and doc["percentageOfNodesToScore"] == 100
    (extender,) = doc["extenders"]
    defaults = ExtenderConfig()
    assert extender["urlPrefix"] == f"http://{defaults.host}:{defaults.port}"
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == \
        (defaults.filter_verb, defaults.prioritize_verb, defaults.bind_verb)
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False and extender["weight"] > 0
    resources = {p.resource for p in load_catalog().products}
    assert {m["name"] for m in extender["managedResources"]} == resources
    assert all(m["ignoredByScheduler"] is True for m in extender["managedResources"])
