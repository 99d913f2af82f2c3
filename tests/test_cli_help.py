"""Every ``aiodist`` subcommand answers ``--help`` with text for every option; torchrun's flags are accepted."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from aiodist.cli import build_parser
from aiodist.launch.cli import configure_parser, ignored_options, ranked_by_rendezvous, resolve_options
from aiodist.launch.conventions import DEFAULT_NPROC, rank_tag

ROOT = Path(__file__).resolve().parent.parent


def _aiodist(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aiodist", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["store", "--help"], ["store", "serve", "--help"],
                                  ["trace", "--help"], ["sim", "--help"], ["sim", "run", "--help"]])
def test_every_subcommand_answers_help(args: list[str]) -> None:
    out = _aiodist(*args)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")


def _parsers() -> list[argparse.ArgumentParser]:
    found: list[argparse.ArgumentParser] = []
    todo = [build_parser()]
    while todo:
        p = todo.pop()
        found.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


def test_every_option_of_aiodists_own_subcommands_has_help_text() -> None:
    missing = []
    for p in _parsers():
        if p.prog.endswith(" sim"):
            continue  # the simulator's own parser (python -m sim) answers for itself
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{p.prog} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing


def _run_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    configure_parser(p)
    return resolve_options(p.parse_args([*argv, "prog.py"]))


def test_torchruns_flags_are_accepted_and_mean_the_same() -> None:
    a = _run_args("--standalone", "--nproc_per_node", "2", "--max_restarts", "1")
    assert (a.nproc_per_node, a.max_restarts, a.on_failure, a.master_addr) == (2, 1, "restart", "127.0.0.1")
    b = _run_args("--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h0:29400",
                  "--rdzv-id", "job7", "--rdzv-conf", "join_timeout=60,last_call_timeout=2,foo=bar")
    assert (b.nnodes, b.node_rank, b.master_addr, b.master_port, b.run_id) == (2, 1, "h0", 29400, "job7")
    assert (b.rdzv_timeout, b.rdzv_last_call) == (60.0, 2.0)
    c = _run_args("--master_addr", "10.0.0.1", "--master_port", "1234", "--nproc-per-node", "auto")
    assert (c.master_addr, c.master_port) == ("10.0.0.1", 1234) and c.nproc_per_node >= 1
    assert _run_args().nproc_per_node == DEFAULT_NPROC
    with pytest.raises(ValueError, match="etcd"):
        _run_args("--rdzv-backend", "etcd")
    with pytest.raises(ValueError, match="disagree"):
        _run_args("--rdzv-endpoint", "h0:1", "--master-port", "2")
    with pytest.raises(ValueError, match="contradicts"):
        _run_args("--on-failure", "continue", "--max-restarts", "2")


def test_port_0_means_any_free_port_on_one_node_as_in_torchrun() -> None:
    # Before: the ranks were given MASTER_PORT=0 and tried to reach a store at port 0 until their timeout.
    assert _run_args("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0").master_port is None
    assert _run_args("--master-port", "0").master_port is None
    with pytest.raises(ValueError, match="one node only"):
        _run_args("--nnodes", "2", "--master-port", "0")


def test_an_rdzv_endpoint_without_a_port_means_port_29400_as_in_torchrun() -> None:
    # Before: --rdzv-endpoint h0 set no port (a free port on one node; with several nodes: "needs a master port").
    assert (_run_args("--rdzv-endpoint", "h0").master_addr, _run_args("--rdzv-endpoint", "h0").master_port) == (
        "h0", 29400)
    assert _run_args("--rdzv-endpoint", "h0", "--master-port", "5").master_port == 5


def test_several_nodes_without_a_node_rank_are_ranked_by_the_rendezvous() -> None:
    assert ranked_by_rendezvous(_run_args("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h0"), 2)
    assert ranked_by_rendezvous(_run_args("--nnodes", "2:2", "--master-port", "5"), 2)
    assert not ranked_by_rendezvous(_run_args("--nnodes", "2", "--node-rank", "0", "--master-port", "5"), 2)
    assert not ranked_by_rendezvous(_run_args("--nnodes", "2", "--rdzv-backend", "static", "--master-port", "5"), 2)
    # torchrun's default backend is static: without --rdzv-backend c10d, a node without --node-rank is node 0
    # (a job whose other nodes give --node-rank 1... keeps working)
    assert not ranked_by_rendezvous(_run_args("--nnodes", "2", "--master-port", "5"), 2)
    assert not ranked_by_rendezvous(_run_args(), 1)
    out = _aiodist("run", "--nnodes", "2", "--rdzv-backend", "c10d", "-n", "1", __file__)  # (not started)
    assert out.returncode == 2 and "--nnodes 2 without --node-rank needs --master-port PORT" in out.stderr, out.stderr


def test_torchrun_options_that_change_nothing_here_are_accepted_and_named_in_a_warning() -> None:
    a = _run_args("--tee", "3", "--redirects", "3", "--log-dir", "/tmp/x", "--role", "trainer", "--monitor_interval", "5",
                  "--start-method", "spawn", "--local-ranks-filter", "0", "--local-addr", "h", "--run-path")
    assert ignored_options(a) == ["--tee 3", "--redirects 3", "--log-dir /tmp/x", "--local-ranks-filter 0",
                                  "--monitor-interval 5", "--start-method spawn", "--local-addr h",
                                  "--run-path"]
    assert ignored_options(_run_args()) == []
    with pytest.raises(ValueError, match="Python programs only"):
        _run_args("--no-python")


def test_role_sets_role_name_as_in_torchrun(tmp_path: Path) -> None:
    # Before: --role was accepted and ignored (ROLE_NAME was always 'default').
    prog = tmp_path / "p.py"
    prog.write_text("import os\nprint(os.environ['ROLE_NAME'], os.environ['ROLE_RANK'], os.environ['ROLE_WORLD_SIZE'])\n")
    out = _aiodist("run", "--nproc-per-node", "2", "--role", "trainer", str(prog))
    assert out.returncode == 0, out.stderr
    assert "ignoring" not in out.stderr
    assert sorted(line.split(": ", 1)[1] for line in out.stdout.splitlines()) == ["trainer 0 2", "trainer 1 2"]
    out = _aiodist("run", "--nproc-per-node", "1", str(prog))
    assert out.stdout.split(": ", 1)[1].split() == ["default", "0", "1"]


def test_a_torchrun_command_line_with_ignored_options_runs(tmp_path: Path) -> None:
    prog = tmp_path / "p.py"
    prog.write_text("import os\nprint('rank', os.environ['RANK'], 'port', os.environ['MASTER_PORT'] != '0')\n")
    out = _aiodist("run", "--nproc-per-node", "2", "--tee", "3", "--rdzv-endpoint", "localhost:0", str(prog))
    assert out.returncode == 0, out.stderr
    assert "ignoring torchrun's --tee 3" in out.stderr
    assert sorted(line.split(": ", 1)[1] for line in out.stdout.splitlines()) == ["rank 0 port True", "rank 1 port True"]


def test_one_rank_prefix_and_one_default_world_size() -> None:
    assert rank_tag(3) == "[rank3]: "
    assert f"default: {DEFAULT_NPROC}" in _aiodist("run", "--help").stdout
