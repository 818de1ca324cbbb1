"""``gpuslice demo``: the sample packed with every policy; a bad --catalog named, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from packing.demo import SAMPLE, main
from packing.policies import POLICIES

PRODUCT = '[[products]]\nname = "{name}"\nmodel = "m"\n{milli} = 250\nmemory_mib = 8192\n'
MODEL = 'resource_prefix = "gpuslice.io"\n[[models]]\nname = "m"\nmemory_mib = 32768\n'


def test_every_policy_packs_the_sample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "1", "--cards-per-node", "2"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("policy ")] == [f"policy {p}:" for p in POLICIES]
    assert out.count("waits:") > 0  # 1 node x 2 cards cannot hold the 12 pods: some wait, and say so


@pytest.mark.parametrize(("text", "said"), [
    (MODEL + PRODUCT.format(name="v100-25", milli="mili"),
     "{path}: product 'v100-25': unknown key 'mili' (did you mean 'milli'?"),
    ("[[models]\n", "{path}: not valid TOML"),
    (b"\x89PNG\r\n\x1a\n\xe7\x00", "{path}: not a TOML catalog (not UTF-8 text: byte 0)"),  # issue #29, row 4
    (MODEL + PRODUCT.format(name="x", milli="milli"),
     "the sample workload asks for v100-25, v100-50, v100-100, which {path} does not offer (it offers x)"),
])
def test_a_bad_catalog_is_named_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    text: str | bytes | None, said: str) -> None:
    path = tmp_path / "catalog.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text, encoding="utf-8")
    assert main(["--catalog", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("gpuslice demo: ") and err.count("\n") == 1, err
    assert said.format(path=path) in err


def test_a_missing_catalog_is_refused_where_parsed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--catalog", str(tmp_path / "catalog.toml")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith(f"gpuslice demo: error: argument --catalog: no file {tmp_path}")


@pytest.mark.parametrize("flag", ["--nodes", "--cards-per-node", "--gpus"])
@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_counts_must_be_whole_and_positive(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([flag, value])
    assert exit_.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err


def test_sample_names_products_of_the_built_in_catalog() -> None:
    from packing.products import load_catalog

    assert set(SAMPLE) <= {p.name for p in load_catalog().products}


def test_the_old_name_gpus_still_works_and_says_to_use_cards_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "1", "--gpus", "2"]) == 0
    out, err = capsys.readouterr()
    assert err == "gpuslice demo: warning: --gpus is deprecated; use --cards-per-node\n"
    assert "  node-0: [" in out and out.split("  node-0: ")[1].count("[") == 2  # two cards, as asked
