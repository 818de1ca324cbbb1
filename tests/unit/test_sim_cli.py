"""``gpuslice simulate`` / ``gpuslice plan`` on small files: the documented contract."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from simulations.cli import parse_cap, parse_duration, parse_rho, parse_seeds, plan_main, simulate_main
from simulations.sizing import SizingError, lower_bound_cards, smallest_cards

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i},{64000 if i % 2 else 32000},262144,{(2, 4, 8)[i % 3]},{('T4', 'G2')[i % 2]}\n" for i in range(12))
HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
          "creation_time,deletion_time,scheduled_time\n")


def pods_csv(n: int = 60) -> str:
    rows = []
    for i in range(n):
        gpus, milli = [(1, 1000), (1, 470), (1, 810), (1, 230), (0, 0), (2, 1000)][i % 6]
        times = f"{10 * i},{10 * i + 900},{10 * i + 1}"
        rows.append(f"p{i},{2000 + 500 * (i % 5)},4096,{gpus},{milli},,LS,Running,{times}\n")
    return HEADER + "".join(rows)


@pytest.fixture
def openb(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(pods_csv())
    return nodes, pods


def test_argument_parsers() -> None:
    assert parse_seeds("42-51") == tuple(range(42, 52))
    assert parse_seeds("1,3,7") == (1, 3, 7)
    assert parse_duration("15m") == 900 and parse_duration("2d") == 172800 and parse_duration("90") == 90
    assert parse_cap("none") is None and parse_cap("2h") == 7200
    assert parse_rho("none") is None and parse_rho("0.7") == 0.7
    for bad, parser in [("5-1", parse_seeds), ("x", parse_seeds), ("3 weeks", parse_duration), ("-1", parse_rho)]:
        with pytest.raises(argparse.ArgumentTypeError):
            parser(bad)


def test_protocol_a_on_openb_files_writes_the_contract_key(openb: tuple[Path, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = openb
    out = tmp_path / "a.json"
    code = simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--protocol", "a", "--seeds", "42-44",
                          "--policy", "go-best-fit", "--json", str(out), "--csv", str(tmp_path / "a.csv")])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["protocol"] == "a" and data["seeds"] == [42, 43, 44] and data["policy"] == "go-best-fit"
    runs = [r["unallocated_gpu_pct_at_100"] for r in data["runs"] if r["unallocated_gpu_pct_at_100"] is not None]
    assert data["unallocated_gpu_pct_at_100"] == pytest.approx(sum(runs) / len(runs))
    assert "go-best-fit" in capsys.readouterr().out
    assert (tmp_path / "a.csv").read_text().startswith("policy,arrived_pct,allocated_pct")


def test_protocol_b_on_openb_files_with_plots(openb: tuple[Path, Path], tmp_path: Path) -> None:
    _, pods = openb  # the cluster is --cards: --nodes with it is refused (issue #29, row 14)
    code = simulate_main(["--pods", str(pods), "--protocol", "b", "--cards", "8",
                          "--jobs", "300", "--seeds", "1", "--rho", "0.9", "--out", str(tmp_path / "b")])
    assert code == 0
    data = json.loads((tmp_path / "b" / "results.json").read_text())
    run = data["runs"][0]
    assert run["cards"] == 8 and run["waits"]["all"]["jobs"] == 300
    assert data["runtime_cap"]["runtime_cap_s"] == 172800
    assert {"v100-100", "v100-50", "v100-25"} <= set(run["waits"])
    for png in ("wait_cdf.png", "utilisation.png", "fragmentation.png"):
        assert (tmp_path / "b" / png).stat().st_size > 1000


def test_builtin_workload_runs_without_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = simulate_main(["--jobs", "400", "--cards", "16", "--seeds", "1", "--json", str(tmp_path / "b.json")])
    assert code == 0
    assert "built-in synthetic" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text())["protocol"] == "b"


def test_own_trace_format(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("arrival,duration,product,namespace\n" +
                     "".join(f"{5 * i},{60 + i},{['v100-25', 'v100-50', 'v100-100'][i % 3]},t{i % 2}\n"
                             for i in range(50)))
    code = simulate_main(["--trace", str(trace), "--cards", "4", "--rho", "none", "--seeds", "1",
                          "--json", str(tmp_path / "t.json")])
    assert code == 0
    run = json.loads((tmp_path / "t.json").read_text())["runs"][0]
    assert run["waits"]["all"]["jobs"] == 50 and run["offered_load"] == pytest.approx(
        sum((60 + i) * (250, 500, 1000)[i % 3] for i in range(50)) / (4000 * 245))
    assert set(run["namespaces"]) == {"t0", "t1"}
    assert sum(ns["served_share_pct"] for ns in run["namespaces"].values()) == pytest.approx(100)


def test_bad_row_exits_2_naming_file_and_line(openb: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = openb
    pods.write_text(pods_csv(6) + "bad,1,1,1,2000,,LS,Running,0,1,0\n")
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]) == 2
    assert f"{pods}:8: gpu_milli" in capsys.readouterr().err
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--bad-rows", "skip"]) == 0
    assert "skipped 1 bad row" in capsys.readouterr().err


def test_usage_errors_exit_2(openb: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, pods = openb
    assert simulate_main(["--pods", str(pods), "--protocol", "a"]) == 2
    assert "needs --nodes" in capsys.readouterr().err
    assert simulate_main(["--policy", "nope", "--jobs", "10"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_plan_finds_a_card_count_and_writes_the_curve(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code = plan_main(["--jobs", "600", "--ref-cards", "16", "--rho", "0.8", "--target", "5m", "--seeds", "1",
                      "--json", str(out), "--plot", str(tmp_path / "plan.png")])
    assert code == 0
    data = json.loads(out.read_text())
    curve = {p["cards"]: p["wait_s"] for p in data["curve"]}
    n = data["cards"]
    assert curve[n] <= 300 and data["lower_bound_cards"] <= n
    assert all(w > 300 for c, w in curve.items() if c < n)  # every smaller count measured misses
    assert (tmp_path / "plan.png").stat().st_size > 1000


def test_bisection_finds_the_threshold_of_a_monotone_curve() -> None:
    calls: list[int] = []

    def wait(n: int) -> float:
        calls.append(n)
        return 1000.0 / n

    sizing = smallest_cards(wait, 10.0, 5, 1000)
    assert sizing.cards == 100
    assert len(calls) == len(sizing.points) < 25  # bisection, each count measured once
    assert all(w > 10 for n, w in sizing.curve() if n < 100)
    assert smallest_cards(lambda n: 50.0, 10.0, 5, 40).cards is None
    assert lower_bound_cards(8500.0 * 100, 100.0) == 9
    with pytest.raises(SizingError):
        smallest_cards(wait, -1.0, 5, 10)


def test_progress_bar_draws_only_when_enabled() -> None:
    import io

    from simulations.progress import Progress

    quiet = io.StringIO()
    bar = Progress("x", stream=quiet)  # a StringIO is not a terminal
    bar.update(5, 10)
    bar.close()
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    bar = Progress("run", enabled=True, stream=loud)
    bar.update(10, 10)
    bar.close()
    assert "run [" in loud.getvalue() and "100.0%" in loud.getvalue() and loud.getvalue().endswith("\n")


# ---- protocol A sweeps, the offline reference, processes; nothing dropped silently -----------------


def test_a_sweep_over_workloads_and_tie_rules_in_two_processes(openb: tuple[Path, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = openb
    other = tmp_path / "openb_pod_list_other.csv"
    other.write_text(pods_csv(40))
    argv = ["--nodes", str(nodes), "--pods", f"{pods},{other}", "--seeds", "1-2", "--policy", "gradient-fit,fgd",
            "--ties", "stable,random", "--offline"]
    assert simulate_main([*argv, "-j", "2", "--json", str(tmp_path / "two.json")]) == 0
    text = capsys.readouterr().out
    assert "\npods " in text and "\nother " in text and " random " in text and "gradient-fit/fgd" in text
    assert simulate_main([*argv, "--json", str(tmp_path / "one.json")]) == 0
    two, one = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one"))

    def figures(d: dict) -> dict:  # type: ignore[type-arg]
        return {w: {t: {p: {k: v for k, v in s.items() if k != "seconds_per_run"} for p, s in by_p.items()}
                    for t, by_p in by_t.items()} for w, by_t in d["workloads"].items()}

    assert figures(two) == figures(one)  # results do not depend on the number of processes
    assert set(two["workloads"]) == {"pods.csv", "openb_pod_list_other.csv"}
    assert set(two["workloads"]["pods.csv"]) == {"stable", "random"}
    ref = two["offline_by_workload"]["pods.csv"]
    assert ref["seeds"] == [1, 2] and 0 <= ref["unallocated_gpu_pct"] <= 100


def test_a_tie_free_policy_runs_once_and_its_stable_runs_equal_a_real_random_tie_run(
        openb: tuple[Path, Path], tmp_path: Path) -> None:
    from packing.products import load_catalog
    from simulations import command_a, protocol_a
    from simulations.cluster import card_model_for
    from simulations.scheduler import SchedulerModel
    from simulations.traces import read_openb_nodes, read_openb_pods

    nodes, pods = openb
    assert command_a._tie_free("gradient-fit", "exact", ["stable", "random"])
    assert not command_a._tie_free("fgd", "exact", ["stable", "random"])  # FGD's 101 levels tie
    assert not command_a._tie_free("gradient-fit", "extender", ["stable", "random"])  # 0-100 scores tie
    assert not command_a._tie_free("gradient-fit", "exact", ["random"])  # nothing to stand for it
    out = tmp_path / "t.json"
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1-2", "--policy", "gradient-fit",
                          "--ties", "stable,random", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["workloads"]["pods.csv"]
    catalog = load_catalog()
    requests = protocol_a.pod_requests(read_openb_pods(pods)[0], catalog, "none")
    card = card_model_for(catalog, "none")
    for seed in (1, 2):
        real = protocol_a.run_seed(read_openb_nodes(nodes)[0], requests, card, protocol_a.ProtocolAConfig(
            policy="gradient-fit", model=SchedulerModel(ties="random")), seed)
        stable = protocol_a.run_seed(read_openb_nodes(nodes)[0], requests, card, protocol_a.ProtocolAConfig(
            policy="gradient-fit"), seed)
        assert (real.curve, real.failed, real.allocated_pct_final) == (
            stable.curve, stable.failed, stable.allocated_pct_final)
    assert summary["random"]["gradient-fit"]["curve"] == summary["stable"]["gradient-fit"]["curve"]


def test_a_folder_of_pod_lists(openb: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, _ = openb
    folder = tmp_path / "lists"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"openb_pod_list_{name}.csv").write_text(pods_csv(30))
    assert simulate_main(["--nodes", str(nodes), "--pods", str(folder), "--seeds", "1", "--policy", "best-fit",
                          "--json", str(tmp_path / "f.json")]) == 0
    assert list(json.loads((tmp_path / "f.json").read_text())["workloads"]) == [
        "openb_pod_list_a.csv", "openb_pod_list_b.csv"]


def test_gpu_spec_is_honoured_and_models_no_card_has_are_refused(openb: tuple[Path, Path], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = openb
    pinned = pods.read_text().replace(",,LS,", ",T4,LS,")  # every GPU pod may use T4 cards only
    pods.write_text(pinned)
    out = tmp_path / "t4.json"
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--policy", "best-fit",
                          "--json", str(out)]) == 0
    # half the cards are G2: pinned pods leave them idle, so at least a third of the GPU stays unallocated
    assert json.loads(out.read_text())["policies"]["best-fit"]["allocated_pct_final"] < 67
    pods.write_text(pinned.replace(",T4,LS,", ",A100,LS,"))
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]) == 2
    assert "pin GPU model(s) no card of the cluster is: A100" in capsys.readouterr().err
    pods.write_text(pinned)
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--rounding", "slices"]) == 2
    assert "slices cannot honour that pin" in capsys.readouterr().err


def test_our_format_keeps_models_and_refuses_memory_no_card_gives(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,32000,65536,2,T4\nb,32000,65536,2,G2\n")
    trace = tmp_path / "jobs.csv"
    trace.write_text("arrival,milli,count,model,cpu_milli\n" + "".join(f"{i},500,1,T4,1000\n" for i in range(6)))
    out = tmp_path / "a.json"
    assert simulate_main(["--trace", str(trace), "--nodes", str(nodes), "--protocol", "a", "--seeds", "1",
                          "--policy", "best-fit", "--inflation", "1.5", "--json", str(out)]) == 0
    # only the two T4 cards take them: at most half the GPU is ever allocated, nothing is relabelled
    assert json.loads(out.read_text())["policies"]["best-fit"]["allocated_pct_final"] <= 50
    trace.write_text("arrival,milli,gpu_memory_mib\n0,500,4096\n")
    assert simulate_main(["--trace", str(trace), "--nodes", str(nodes), "--protocol", "a", "--seeds", "1"]) == 2
    assert "ask for GPU memory" in capsys.readouterr().err


def test_protocol_b_placements_host_note_and_one_tie_rule(openb: tuple[Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = openb
    placements = tmp_path / "p.csv"
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--protocol", "b", "--jobs", "200",
                          "--seeds", "1", "--placements", str(placements)]) == 0
    assert "host CPU/RAM asked by" in capsys.readouterr().out  # B tracks GPUs only: it says so
    rows = placements.read_text().splitlines()
    assert rows[0] == "policy,admission,seed,job,node,gpus,start_s" and len(rows) > 100
    assert simulate_main(["--nodes", str(nodes), "--pods", str(pods), "--protocol", "b", "--jobs", "50",
                          "--seeds", "1", "--ties", "stable,random"]) == 2
    assert "take one tie rule" in capsys.readouterr().err


def test_protocol_b_borrows_runtimes_for_pod_lists_without_times(openb: tuple[Path, Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _, pods = openb
    untimed = tmp_path / "multi.csv"
    untimed.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" +
                       "".join(f"m{i},1000,1024,{(1, 2)[i % 2]},1000\n" for i in range(20)))
    base = ["--pods", str(untimed), "--protocol", "b", "--cards", "8", "--jobs", "100", "--seeds", "1"]
    assert simulate_main(base) == 2
    assert "no creation_time" in capsys.readouterr().err
    assert simulate_main([*base, "--runtimes-from", str(pods), "--json", str(tmp_path / "m.json"),
                          "--allow-missed-load"]) == 0  # 100 jobs offer a rough load: fine for this test
    assert json.loads((tmp_path / "m.json").read_text())["runs"][0]["waits"]["all"]["jobs"] == 100
    assert simulate_main([*base, "--runtimes-from", str(pods), "--arrivals", "trace"]) == 2


def test_without_the_plots_extra_results_are_written_and_plots_asked_for_are_refused_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The images and a plain `pip install gpuslice` have no matplotlib: say how to get it, lose nothing."""
    from simulations import options

    monkeypatch.setattr(options, "plots_missing", lambda: True)
    monkeypatch.setattr("simulations.cli.plots_missing", lambda: True)
    common = ["--jobs", "300", "--cards", "8", "--seeds", "1"]
    assert simulate_main([*common, "--plots", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "--plots needs matplotlib" in err and "pip install 'gpuslice[plots]'" in err
    assert not (tmp_path / "p").exists()  # refused before any work
    assert simulate_main([*common, "--out", str(tmp_path / "out")]) == 0
    assert "no plots in" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.csv", "results.json"]
    assert plan_main(["--jobs", "300", "--ref-cards", "8", "--seeds", "1", "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
