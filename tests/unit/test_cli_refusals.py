"""Every command refuses what it cannot honour in one clear line (issue #29): a test per row of its table,
then what it also asked for (--version, help CMD, one name per idea, gates scoped like queue, plain
words in status). Each runs ``gpuslice`` in-process through its real entry point (``packing.cli.main``)."""

from __future__ import annotations

import importlib.metadata
import re
import socket
import warnings
from pathlib import Path

import pytest

from packing.cli import main as gpuslice

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nnode-0,64000,262144,8,V100M32\nnode-1,64000,262144,8,V100M32\n"
PODS_CSV = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
            "scheduled_time\n" + "".join(f"p{i},1000,1024,1,500,,LS,Running,{i},{i + 900},{i}\n" for i in range(30)))
TINY_TRACE = "arrival,duration,product,namespace,priority\n0,1800,v100-25,team-a,0\n12.5,7200,v100-100,team-b,10\n"
MALFORMED_KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: [[[\n"
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team-q}}]
current-context: x
"""
SMALL = ["--jobs", "200", "--cards", "16", "--seeds", "1"]
HINT = re.compile(r"\('gpuslice( \w+)? --help' lists every (option|command)\)")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``gpuslice ARGV``: (exit status, stdout, stderr), whether it returned or exited."""
    try:
        code = gpuslice(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """The one line ``gpuslice ARGV`` refuses with (a usage error may add the hint to --help)."""
    got, out, err = run(argv, capsys)
    lines = err.strip().splitlines()
    assert got == code, (got, out, err)
    assert "Traceback" not in err and "usage:" not in err, err
    assert len(lines) == 1 or (len(lines) == 2 and HINT.fullmatch(lines[1])), err
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    made = {"nodes": NODES_CSV, "pods": PODS_CSV, "trace": TINY_TRACE, "malformed": MALFORMED_KUBECONFIG,
            "kubeconfig": KUBECONFIG, "typo.toml": "[products\nx="}
    paths = {}
    for name, text in made.items():
        (tmp_path / name).write_text(text)
        paths[name] = str(tmp_path / name)
    (tmp_path / "binary").write_bytes(bytes(range(128, 256)) * 4)
    paths["binary"] = str(tmp_path / "binary")
    return paths


@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubeconfig anywhere and not in a pod."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def test_row_1_a_node_list_without_its_pod_list_is_refused(files: dict[str, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["simulate", "--nodes", files["nodes"]], capsys)
    assert "--nodes is the cluster of a trace" in line and "--pods PODS.csv" in line and "--cards N" in line


@pytest.mark.parametrize(("setting", "said"), [
    ("aging-guard:t=5m", "'t' is neither a setting (T, heads, horizon, clock, share, within, front, single, idle, "
                         "spare, worst, ahead.KIND) nor a product of the catalog (v100-25, v100-50, v100-100); "
                         "did you mean 'T'?"),
    ("aging-guard:X=1", "'X' is neither a setting"),
    ("aging-guard:v100-33=5m", "'v100-33' is neither a setting (T, heads, horizon, clock, share, within, "
                               "front, single, idle, spare, worst, ahead.KIND) nor a product of the catalog"),
    ("drain-soonest:clock=8h", "setting 'clock' does not apply to drain-soonest, which has no hold clock; it is for "
                               "worst-first"),
    ("worst-first:share=0", "setting 'share=0'"),
    ("worst-first:within=0", "setting 'within=0': expected a number > 0"),
    ("drain-soonest:within=1", "setting 'within' does not apply to drain-soonest, which has no hold clock"),
    ("worst-first:front=0", "setting 'front=0'"),
    ("worst-first:front=half", "setting 'front=half'"),
    ("drain-soonest:front=8", "setting 'front' does not apply to drain-soonest, which has no hold clock"),
    ("worst-first:single=8", "setting 'single=8': must be own, sure or share, got '8'"),
    ("drain-soonest:single=8", "setting 'single' does not apply to drain-soonest, which has no hold clock"),
    ("worst-first:idle=0", "setting 'idle=0'"),
    ("worst-first:idle=twice", "setting 'idle=twice': expected a number, got 'twice' (or off)"),
    ("drain-soonest:idle=2", "setting 'idle' does not apply to drain-soonest, which has no hold clock"),
    ("worst-first:spare=0", "setting 'spare=0': duration must be > 0"),
    ("worst-first:spare=lately", "setting 'spare=lately'"),
    ("drain-soonest:spare=12h", "setting 'spare' does not apply to drain-soonest, which has no hold clock"),
    ("worst-first:worst=maybe", "setting 'worst=maybe': must be on or off, got 'maybe'"),
    ("drain-soonest:worst=on", "setting 'worst' does not apply to drain-soonest, which has no hold clock"),
    ("worst-first:ahead.v100-33=1h", "head start ahead.'v100-33' names no product of the catalog"),
    ("best-effort-fifo:ahead.v100-25x2=1h", "head start ahead.'v100-25x2' names no product"),
    ("worst-first:ahead.v100-50=2d", "head start ahead.v100-50 must be within +-24h, got 48h"),
    ("worst-first:ahead.v100-50=soon", "a head start looks like 15m, -1h or 0, got 'soon'"),
    ("strict-fifo:T=5m", "setting 'T' does not apply to strict-fifo, which does not age claims"),
    ("aging-guard:horizon=1h", "setting 'horizon' does not apply to aging-guard, which has no horizon"),
])
def test_row_2_an_admission_setting_is_a_known_key_or_a_catalog_product(setting: str, said: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("simulate", "plan"):
        line = refused([command, *([] if command == "plan" else SMALL), "--admission", setting], capsys)
        assert line.startswith(f"gpuslice {command}: error: --admission {setting}: ") and said in line, line


@pytest.mark.parametrize("command", ["queue", "gates", "certs"])
def test_row_3_a_malformed_kubeconfig_is_one_line(command: str, files: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    line = refused([command, "--kubeconfig", files["malformed"]], capsys, code=1)
    assert f"kubeconfig {files['malformed']} is malformed (ParserError: " in line, line


def test_row_4_a_binary_catalog_is_named(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["demo", "--catalog", files["binary"]], capsys)
    assert line == f"gpuslice demo: --catalog {files['binary']}: not a TOML catalog (not UTF-8 text: byte 0)"


def test_row_5_the_demo_server_refuses_a_bad_catalog_before_gunicorn_starts(
        files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["serve", "--standalone", "--demo", "--catalog", files["typo.toml"]], capsys)
    assert line.startswith(f"gpuslice serve: --catalog {files['typo.toml']}: not valid TOML"), line


@pytest.mark.parametrize("value", ["missing.json", "binary"])
def test_row_6_simulated_gpus_of_a_missing_or_bad_file_is_one_line(value: str, files: dict[str, str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["agent", "--node-name", "n", "--simulated-gpus", files.get(value, value)], capsys)
    assert "argument --simulated-gpus: " in line


@pytest.mark.parametrize("flag", ["--catalog", "--simulated-gpus"])
def test_row_7_node_flags_are_refused_with_simulate(flag: str, files: dict[str, str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["agent", "--simulate", flag, files["typo.toml"] if flag == "--catalog" else "2"], capsys)
    assert f"{flag} applies to the node agent, and --simulate runs its own demo" in line
    assert line.endswith("drop it, or drop --simulate")


def test_row_8_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(["serve", "--standalone", "--nodes", "1", "--port", str(port)], capsys, code=1)
    assert line == (f"gpuslice serve: cannot listen on 127.0.0.1:{port}: Address already in use (another server "
                    "there? choose another --port)")


def test_row_9_an_inflation_under_1_is_refused_where_parsed(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["simulate", "--protocol", "a", "--inflation", "0.5"], capsys)
    assert "argument --inflation: " in line and "at least 1, got '0.5'" in line


def test_row_10_a_missed_offered_load_says_so_first_and_exits_1(files: dict[str, str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["simulate", "--trace", files["trace"], "--seeds", "1"], capsys)
    first = out.splitlines()[0]
    assert code == 1 and first.startswith("offered load missed: ρ ") and "not the 0.85 asked (--rho)" in first
    assert "exit status 1 (--allow-missed-load accepts it)" in first
    code, out, _ = run(["simulate", "--trace", files["trace"], "--seeds", "1", "--allow-missed-load"], capsys)
    assert code == 0 and out.startswith("offered load missed: ") and "exit status 1" not in out.splitlines()[0]
    code, out, _ = run(["simulate", "--trace", files["trace"], "--seeds", "1", "--rho", "none"], capsys)
    assert code == 0 and "offered load missed" not in out  # nothing asked, nothing missed
    assert "overloaded" not in out and "no job waited: too few jobs to load the cards" in out
    code, out, _ = run(["simulate", "--trace", files["trace"], "--seeds", "1", "--jobs", "2000"], capsys)
    assert code == 0 and not out.startswith("offered load missed")  # resampled into enough jobs, it is met


@pytest.mark.parametrize("argv", [["simulate", "--protocol", "x"], ["plan", "--percentile", "x"],
                                  ["agent", "--speed", "fast"], ["serve", "--mode", "loose"], ["demo", "--bogus"],
                                  ["queue", "-o", "yaml"], ["status", "--bogus"], ["certs", "--ca-days", "0"],
                                  ["gates", "-n", "a", "-A"]])
def test_row_11_a_usage_error_is_one_line_and_a_hint_not_the_usage(argv: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(argv, capsys)
    assert line.startswith(f"gpuslice {argv[0]}: error: ")


def test_row_12_a_binary_pod_list_is_named(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--pods", "--trace"):
        line = refused(["simulate", flag, files["binary"], "--seeds", "1"], capsys)
        assert line == f"gpuslice simulate: error: {flag} {files['binary']}: not a text file (no UTF-8 at byte 0): " \
                       "is it the right file?"


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize("command", ["queue", "gates"])
def test_row_13_no_kubeconfig_says_what_to_give(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused([command], capsys, code=1)
    assert line.endswith("no kubeconfig ($KUBECONFIG is not set and ~/.kube/config does not exist) and not in a "
                         "pod: give --kubeconfig FILE"), line


@pytest.mark.parametrize(("argv", "said"), [
    (["--offline"], "--offline applies to protocol A only, and this run is protocol B; drop it, or add --protocol a"),
    (["--protocol", "b", "--inflation", "1.5"], "--inflation applies to protocol A only"),
    (["--protocol", "a", "--rho", "0.5"], "--rho applies to protocol B only, and this run is protocol A"),
    (["--nodes", "{nodes}", "--cards", "8", "--trace", "{trace}"], "--nodes and --cards cannot go together"),
    (["--protocol", "a", "--pods", "{pods}", "--nodes", "{nodes}", "--jobs", "9"], "--jobs sizes the built-in "),
    (["--rho", "none"], "--rho none keeps a trace's own timing, and the built-in workload has none"),
    (["--arrivals", "trace"], "--arrivals applies to a trace (--pods or --trace)"),
    (["--never-ran", "sample", "--trace", "{trace}"], "--never-ran applies to openb pod lists (--pods) only"),
    (["--bind-delay", "5m"], "--bind-delay needs --reservation-ttl"),
    (["--admission", "strict-fifo", "--age-limit", "1h"], "--age-limit applies to the admission strategies that "),
])
def test_row_14_an_option_that_does_not_apply_is_refused(argv: list[str], said: str, files: dict[str, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["simulate", *(a.format(**files) for a in argv)], capsys)
    assert said in line, line


@pytest.mark.parametrize("argv", [["plan", "--cards", "8"], ["plan", "--nodes", "{nodes}", "--trace", "{trace}"]])
def test_row_14_plan_refuses_what_it_searches_or_ignores(argv: list[str], files: dict[str, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert "does not apply to plan" in refused([a.format(**files) for a in argv], capsys)


def test_row_15_the_agents_timing_errors_name_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(["agent", "--simulate", "--period", "0.01"], capsys) == \
        "gpuslice agent: error: need 0 < --slot <= --period, got 0.1, 0.01"


def test_row_16_plots_of_a_tiny_trace_leak_no_warning(files: dict[str, str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would now end the run with an error
        code, _, err = run(["simulate", "--trace", files["trace"], "--seeds", "1", "--allow-missed-load",
                            "--plots", str(tmp_path / "plots")], capsys)
    assert code == 0 and err == "", err
    assert (tmp_path / "plots" / "wait_cdf.png").stat().st_size > 1000


def test_row_17_a_file_of_another_format_says_which_option_reads_it(files: dict[str, str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(["simulate", "--trace", files["pods"]], capsys).endswith(
        "; it looks like an openb pod list: that is what --pods reads")
    assert refused(["simulate", "--pods", files["trace"]], capsys).endswith(
        "; it looks like a trace in our own format: that is what --trace reads")
    assert refused(["simulate", "--pods", files["pods"], "--nodes", files["pods"]], capsys).endswith(
        "; it looks like an openb pod list: that is what --pods reads")


# ---- also asked for -----------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([flag], capsys) == (0, f"gpuslice {importlib.metadata.version('gpuslice')}\n", "")


def test_help_command_is_the_commands_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["help", "plan"], capsys)
    assert code == 0 and out.startswith("usage: gpuslice plan")
    line = refused(["simulat"], capsys)
    assert line.startswith("gpuslice: unknown command 'simulat' (did you mean 'simulate'?)")


def test_an_unexpected_error_is_one_line_and_debug_gives_the_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    def broken(argv: list[str]) -> int:
        raise RuntimeError("disk\non fire")

    monkeypatch.setattr("packing.demo.main", broken)
    assert refused(["demo"], capsys, code=1) == \
        "gpuslice demo: unexpected error: RuntimeError: disk on fire (--debug prints the traceback)"
    code, _, err = run(["demo", "--debug"], capsys)
    assert code == 1 and "Traceback (most recent call last)" in err and "RuntimeError: disk" in err
    code, _, err = run(["--debug", "demo"], capsys)
    assert code == 1 and "Traceback (most recent call last)" in err


def test_one_flag_name_per_idea_the_old_ones_warn(capsys: pytest.CaptureFixture[str]) -> None:
    from extender.cli import _parser

    ap = _parser()
    args = ap.parse_args(["--standalone", "--nodes", "1", "--gpus-per-node", "2"])
    assert args.cards_per_node == 2
    assert capsys.readouterr().err == "gpuslice serve: warning: --gpus-per-node is deprecated; use --cards-per-node\n"
    assert ap.parse_args(["--cards-per-node", "3"]).cards_per_node == 3 and capsys.readouterr().err == ""
    line = refused(["serve", "--standalone", "--nodes", "1", "--gpus-per-node", "0"], capsys)
    assert line.startswith("gpuslice serve: error: argument --gpus-per-node: expected a whole number >= 1")


@pytest.mark.parametrize(("scope", "path"), [([], "/api/v1/namespaces/team-q/pods"), (["-A"], "/api/v1/pods"),
                                             (["-n", "x"], "/api/v1/namespaces/x/pods")])
def test_gates_lift_is_scoped_like_queue(scope: list[str], path: str, files: dict[str, str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["gates", "--lift", "--kubeconfig", files["kubeconfig"], *scope], capsys, code=1)
    assert line.startswith("gpuslice gates: cannot list pods: ") and path in line  # the context's namespace, as kubectl


def test_status_speaks_plain_words() -> None:
    from extender.cli import _render

    state = {"mode": "strict", "policy": "gradient-fit", "ready": True, "epoch": 1_700_000_000_000,
             "reservation_ttl_s": 30.0, "durable": False, "free_slices": {"v100-25": 4}, "nodes": [],
             "allocations": [], "queue": [], "placement_phase": {"churning": True, "departure_ratio": 0.62}}
    first, second = _render(state, now=1_700_000_192).splitlines()[:2]
    assert first == ("mode strict, policy gradient-fit, ready; ledger built 3m12s ago (2023-11-14 22:13:20 UTC); a "
                     "filter's reservation waits 30 s for its bind; in memory only (lost at a restart)")
    assert second == ("placement: pods leave about as fast as they arrive (0.62 departures per arrival lately, 0.50 "
                      "or more): best fit, to fill the fullest cards")
    assert "epoch" not in _render(state)


def test_serve_standalone_without_nodes_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["serve", "--standalone"], capsys)
    assert "--standalone with no nodes would serve nothing: seed them with --nodes N" in line
    assert "--learn-nodes" in line


def test_a_short_agent_simulation_says_it_has_not_settled(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["agent", "--simulate", "--duration", "20", "--report-every", "20"], capsys)
    assert code == 0 and out.startswith("note: 20 s is too short for the shares to settle (about 58 s")
    code, out, _ = run(["agent", "--simulate", "--duration", "60", "--report-every", "60"], capsys)
    assert code == 0 and not out.startswith("note:")


def test_plan_says_first_when_it_misses_its_target(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--jobs", "800", "--max-cards", "57", "--target", "0", "--percentile", "100", "--seeds", "1"]
    code, out, _ = run(argv, capsys)
    assert code == 1 and out.startswith("plan: target missed: no card count up to --max-cards 57 holds the p100 (all) "
                                        "wait to 0 min")
    code, out, _ = run([*argv, "--allow-missed-target"], capsys)
    assert code == 0 and out.startswith("plan: target missed:")
