"""README's install, upgrade and uninstall blocks are the ones ``make e2e-install`` runs (tests/e2e_install).

The suite reads them from README.md itself; here, without a cluster: every marked block is run by the
suite and every block the suite runs is marked, and the example values files those blocks name say what
the README says they do.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.e2e_install.readme import blocks

REPO = Path(__file__).resolve().parents[2]


def test_every_marked_block_is_run_by_the_suite_and_nothing_else_is() -> None:
    marked = set(blocks())
    suite = (REPO / "tests" / "e2e_install" / "test_install.py").read_text()
    run = set(re.findall(r'readme\.run\("([a-z0-9-]+)"', suite))
    assert marked == run
    assert {"images", "install", "check", "first-slice", "upgrade", "uninstall"} <= marked


def test_the_blocks_use_only_what_the_readme_defines() -> None:
    for name, script in blocks().items():
        assert "registry.example.com" not in script, name  # a registry the suite has not: never in a run block
        defined = set(re.findall(r"(?m)(?:^|\s)([A-Z_]+)=", script))
        for variable in re.findall(r"\$\{?([A-Z_]+)", script):
            assert variable in {"REGISTRY"} | defined, (name, variable)  # REGISTRY: README step 1 says what


def test_the_catalog_examples_add_one_product_and_restore_the_default() -> None:
    default = yaml.safe_load((REPO / "deploy" / "chart" / "values.yaml").read_text())["catalog"]
    restore = yaml.safe_load((REPO / "deploy" / "examples" / "catalog-default.yaml").read_text())["catalog"]
    added = yaml.safe_load((REPO / "deploy" / "examples" / "catalog-v100-12.yaml").read_text())["catalog"]
    assert restore == default
    assert added["models"] == default["models"]
    assert [p for p in added["products"] if p not in default["products"]] == [
        {"name": "v100-12", "model": "Tesla-V100-*-32GB", "milli": 125, "memoryMiB": 4096}]
    assert all(p in added["products"] for p in default["products"])
