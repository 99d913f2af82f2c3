"""The sim CLI's per-rank output prefixer: unfinished lines, and closing after (or before) its stream.

``RankPrefixedOutput`` writes to a stream that is not its own (sys.stdout of
the run, often a test's captured stdout that is closed before the prefixer
is collected). Closing it, explicitly or by finalization at any later time,
never raises and never closes that stream.
"""

from __future__ import annotations

import contextvars
import io
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from aiodist.context import set_rank_environ
from conftest import ROOT
from sim.cli import RankPrefixedOutput
from sim.loop import LANE


def _as_rank(rank: int, fn: Callable[[], object]) -> None:
    """Call ``fn`` as the virtual rank ``rank`` would (its lane and its RANK)."""
    def inside() -> None:
        LANE.set(rank)
        set_rank_environ({"RANK": str(rank)})
        fn()

    contextvars.copy_context().run(inside)


def test_lines_are_prefixed_and_an_unfinished_one_is_written_by_flush_or_close() -> None:
    stream = io.StringIO()
    out = RankPrefixedOutput(stream)
    _as_rank(1, lambda: out.write("one\ntw"))
    _as_rank(0, lambda: out.write("zero"))
    assert stream.getvalue() == "[rank1]: one\n"
    out.flush()
    assert stream.getvalue() == "[rank1]: one\n[rank0]: zero\n[rank1]: tw\n"
    _as_rank(2, lambda: out.write("last"))
    out.close()
    assert stream.getvalue().endswith("[rank2]: last\n") and out.closed and not stream.closed
    out.close()  # (again: nothing happens)


def test_closing_after_the_stream_was_closed_drops_what_is_buffered_and_does_not_raise() -> None:
    stream = io.StringIO()
    out = RankPrefixedOutput(stream)
    _as_rank(0, lambda: out.write("unfinished"))
    stream.close()
    out.close()  # ValueError (I/O operation on closed file) before
    assert out.closed


def test_finalized_after_its_stream_was_closed_it_reports_nothing() -> None:
    """Collected late (here: by gc after the stream was closed; likewise at interpreter teardown).

    ``-X dev`` makes every Python (not only 3.13+) report an exception from a
    file's finalizer as unraisable ("Exception ignored in: ...").
    """
    code = textwrap.dedent("""
        import gc, io
        from sim.cli import RankPrefixedOutput

        stream = io.TextIOWrapper(io.BytesIO())
        out = RankPrefixedOutput(stream)
        out.write("from the simulator itself, unflushed")
        out.cycle = out  # (collected by gc, not at once)
        del out
        stream.close()
        gc.collect()
        print("collected")
        late = RankPrefixedOutput(io.TextIOWrapper(io.BytesIO()))
        late._out.close()  # and one left for interpreter teardown
    """)
    proc = subprocess.run([sys.executable, "-X", "dev", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "collected\n"
    assert "Exception ignored" not in proc.stderr and "ValueError" not in proc.stderr, proc.stderr


def test_writing_to_a_closed_one_is_the_callers_error() -> None:
    out = RankPrefixedOutput(io.StringIO())
    out.close()
    with pytest.raises(ValueError, match="closed"):
        out.write("late")
