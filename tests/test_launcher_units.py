"""Pure parts of the launcher: environment, program classification, line prefixing, messages, CLI parsing."""

from __future__ import annotations

import argparse
import signal
import sys

import pytest

from aiodist.launch.cli import build_command, configure_parser
from aiodist.launch.env import RANK_ENV_NAMES, merged_env, rank_env
from aiodist.launch.prefix import LinePrefixer, rank_prefix
from aiodist.launch.program import ProgramKind, classify_source
from aiodist.launch.status import describe_returncode, failure_message, launcher_exit_code
from aiodist.launch.supervisor import LaunchConfig

# ------------------------------------------------------------------ env


def test_rank_env_multi_node_numbering() -> None:
    env = rank_env(
        local_rank=2, nproc_per_node=4, nnodes=3, node_rank=1, master_addr="h0", master_port=29500,
        restart_count=2, max_restarts=5, run_id="job7",
    )
    assert env["RANK"] == "6"
    assert env["LOCAL_RANK"] == "2"
    assert env["GROUP_RANK"] == "1"
    assert env["WORLD_SIZE"] == "12"
    assert env["LOCAL_WORLD_SIZE"] == "4"
    assert env["GROUP_WORLD_SIZE"] == "3"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("h0", "29500")
    assert env["TORCHELASTIC_RESTART_COUNT"] == env["AIODIST_RESTART_COUNT"] == "2"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == env["AIODIST_MAX_RESTARTS"] == "5"
    assert env["TORCHELASTIC_RUN_ID"] == env["AIODIST_RUN_ID"] == "job7"
    assert tuple(env) == RANK_ENV_NAMES


@pytest.mark.parametrize(
    "kwargs",
    [
        {"local_rank": 4, "nproc_per_node": 4},
        {"local_rank": 0, "nproc_per_node": 0},
        {"local_rank": 0, "nproc_per_node": 1, "nnodes": 2, "node_rank": 2},
        {"local_rank": 0, "nproc_per_node": 1, "master_port": 70000},
    ],
)
def test_rank_env_rejects_inconsistent_numbers(kwargs: dict) -> None:
    kwargs = {"master_addr": "x", "master_port": 1, **kwargs}
    with pytest.raises(ValueError):
        rank_env(**kwargs)


def test_merged_env_overrides_base_and_keeps_user_omp_setting() -> None:
    vars_ = rank_env(local_rank=0, nproc_per_node=2, master_addr="a", master_port=5)
    env = merged_env({"RANK": "99", "KEEP": "1"}, vars_, nproc_per_node=2)
    assert env["RANK"] == "0" and env["KEEP"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert merged_env({"OMP_NUM_THREADS": "8"}, vars_, nproc_per_node=2)["OMP_NUM_THREADS"] == "8"
    assert "OMP_NUM_THREADS" not in merged_env({}, vars_, nproc_per_node=1)


# ------------------------------------------------------------------ program rule

ASYNC_MAIN_NO_GUARD = "import asyncio\nasync def main():\n    await asyncio.sleep(0)\n"
SYNC_MAIN_NO_GUARD = "def main():\n    print('hi')\n"
WITH_GUARD = ASYNC_MAIN_NO_GUARD + "if __name__ == '__main__':\n    asyncio.run(main())\n"
REVERSED_GUARD = ASYNC_MAIN_NO_GUARD + "if '__main__' == __name__:\n    asyncio.run(main())\n"
CALLS_MAIN_AT_TOP = ASYNC_MAIN_NO_GUARD + "asyncio.run(main())\n"
PLAIN_SCRIPT = "print('hello')\n"
MAIN_REBOUND_TO_CLASS = SYNC_MAIN_NO_GUARD + "class main:\n    pass\n"
MAIN_USED_ONLY_IN_FUNCTION = ASYNC_MAIN_NO_GUARD + "def helper():\n    return main()\n"
MAIN_USED_IN_DECORATOR = ASYNC_MAIN_NO_GUARD + "@register(main)\ndef other():\n    pass\n"


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        (ASYNC_MAIN_NO_GUARD, ProgramKind.MAIN_FUNCTION),
        (SYNC_MAIN_NO_GUARD, ProgramKind.MAIN_FUNCTION),
        (MAIN_USED_ONLY_IN_FUNCTION, ProgramKind.MAIN_FUNCTION),
        (WITH_GUARD, ProgramKind.SCRIPT),
        (REVERSED_GUARD, ProgramKind.SCRIPT),
        (CALLS_MAIN_AT_TOP, ProgramKind.SCRIPT),
        (PLAIN_SCRIPT, ProgramKind.SCRIPT),
        (MAIN_REBOUND_TO_CLASS, ProgramKind.SCRIPT),
        (MAIN_USED_IN_DECORATOR, ProgramKind.SCRIPT),
        ("def main(:\n", ProgramKind.SCRIPT),
        ("from train import main\n", ProgramKind.MAIN_FUNCTION),  # (was a script: nothing ran, exit 0)
        ("from train import run as main\n", ProgramKind.MAIN_FUNCTION),
        ("import asyncio\nfrom train import main\nasyncio.run(main())\n", ProgramKind.SCRIPT),
    ],
    ids=[
        "async-main", "sync-main", "main-used-in-function", "guard", "reversed-guard", "calls-main",
        "plain-script", "main-rebound", "main-in-decorator", "syntax-error", "imported-main", "imported-as-main",
        "imported-main-called",
    ],
)
def test_classify_source(source: str, kind: ProgramKind) -> None:
    assert classify_source(source) is kind


def test_build_command_starts_every_program_through_the_bootstrap(tmp_path) -> None:
    # The bootstrap applies the program rule in the child and records how the rank ended.
    mod = tmp_path / "mod.py"
    mod.write_text(ASYNC_MAIN_NO_GUARD)
    script = tmp_path / "script.py"
    script.write_text(WITH_GUARD)
    boot = ["py", "-m", "aiodist.launch_bootstrap"]
    assert build_command(str(mod), ["-x"], python="py") == [*boot, str(mod), "-x"]
    assert build_command(str(script), ["-x"], python="py") == [*boot, str(script), "-x"]
    assert build_command("pkg.mod", ["a"], module=True, python="py") == [*boot, "-m", "pkg.mod", "a"]
    assert build_command(str(script), [])[0] == sys.executable


# ------------------------------------------------------------------ prefixing


def test_prefixer_splits_lines_across_chunks_and_flushes_partial_tail() -> None:
    p = LinePrefixer(rank_prefix(3))
    assert p.feed(b"hel") == b""
    assert p.feed(b"lo\nwor") == b"[rank3]: hello\n"
    assert p.pending == 3
    assert p.feed(b"ld\n\nx") == b"[rank3]: world\n[rank3]: \n"
    assert p.flush() == b"[rank3]: x\n"
    assert p.flush() == b""


def test_prefixer_bounds_a_line_without_newline() -> None:
    p = LinePrefixer(b"> ", max_line=4)
    assert p.feed(b"abcdefghij") == b"> abcd\n> efgh\n"
    assert p.pending == 2
    assert p.feed(b"\n") == b"> ij\n"


# ------------------------------------------------------------------ messages


def test_failure_messages_name_rank_pid_and_cause() -> None:
    assert failure_message(rank=2, pid=1234, returncode=1) == "rank 2 (pid 1234) failed with exit code 1"
    assert failure_message(rank=0, pid=7, returncode=-9) == "rank 0 (pid 7) was killed by signal SIGKILL (9)"
    assert describe_returncode(-int(signal.SIGTERM)) == "signal SIGTERM (15)"
    assert launcher_exit_code(3) == 3
    assert launcher_exit_code(-9) == 137
    assert launcher_exit_code(300) == 1


# ------------------------------------------------------------------ CLI parsing


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(argv)


def test_cli_options_before_program_and_everything_after_goes_to_program() -> None:
    ns = _parse(["-n", "4", "--max-restarts", "2", "--master-port", "1234", "train.py", "--lr", "0.1", "-n", "9", "-m", "-h"])
    assert ns.nproc_per_node == 4 and ns.max_restarts == 2 and ns.master_port == 1234
    assert ns.program == "train.py"
    assert ns.program_args == ["--lr", "0.1", "-n", "9", "-m", "-h"]
    assert not ns.module


def test_cli_module_flag_and_torchrun_spellings() -> None:
    ns = _parse(["--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1", "--master_addr", "h",
                 "--master_port", "5", "-m", "pkg.train", "x"])
    assert (ns.nproc_per_node, ns.nnodes, ns.node_rank, ns.master_addr, ns.master_port) == (2, 2, 1, "h", 5)
    assert ns.module and ns.program == "pkg.train" and ns.program_args == ["x"]


def test_config_requires_master_port_for_several_nodes() -> None:
    with pytest.raises(ValueError, match="master_port"):
        LaunchConfig(command=["x"], nproc_per_node=2, nnodes=2)
    with pytest.raises(ValueError):
        LaunchConfig(command=["x"], nproc_per_node=2, nnodes=2, node_rank=2, master_port=5)
    LaunchConfig(command=["x"], nproc_per_node=2, nnodes=2, node_rank=1, master_port=5)
