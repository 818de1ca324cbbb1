"""The chart's example alerts (PrometheusRule): each expression parses as PromQL (Prometheus's own
grammar, by promql-parser) and names only metrics that gpuslice exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from enforcement.metrics import AgentMetrics
from extender.cluster.metrics import ClusterMetrics
from extender.metrics import ExtenderMetrics

from .helm import objects, template

CHILDREN = ("lhs", "rhs", "expr", "args", "vector_selector", "param")


def exported() -> set[str]:
    """Every series name the extender (cluster mode) and the agent expose."""
    gauges = {"free_slices": {}, "waiting": 0, "reserved": 0, "committed": 0, "nodes": 0, "gpus": 0,
              "nodes_by_enforcement": {"none": 0}}
    extender = ExtenderMetrics(lambda: gauges)
    ClusterMetrics(extender.registry)
    agent = AgentMetrics(CollectorRegistry())
    names: set[str] = set()
    for text in (generate_latest(extender.registry), generate_latest(agent.registry)):
        for line in text.decode().splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                names.add(name)
                names.update({"counter": [f"{name}_total"], "histogram": [f"{name}_bucket", f"{name}_sum",
                              f"{name}_count"]}.get(kind, []))
    return names


def selectors(node: Any) -> set[str]:
    found = {node.name} if type(node).__name__ == "VectorSelector" else set()
    for attr in CHILDREN:
        value = getattr(node, attr, None)
        for child in value if isinstance(value, list) else [value] if value is not None else []:
            found |= selectors(child)
    return found


def rules(helm: Path) -> list[dict[str, Any]]:
    (rule,) = objects(template(helm, {"monitoring": {"prometheusRule": {"enabled": True}}},
                               show_only="templates/monitoring.yaml"))
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_every_alert_parses_and_names_exported_metrics_only(helm: Path) -> None:
    known = exported()
    assert "gpuslice_bind_failures_total" in known and "gpuslice_agent_healthy" in known
    alerts = rules(helm)
    assert len(alerts) >= 10
    for rule in alerts:
        expr = promql_parser.parse(rule["expr"])
        names = selectors(expr)
        assert names, rule["alert"]
        assert names <= known, f"{rule['alert']}: {sorted(names - known)} are not exported"
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_a_broken_expression_would_be_caught() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("max(gpuslice_leader < ")
