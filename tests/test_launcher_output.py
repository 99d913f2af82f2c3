"""The launcher's output: written by threads of its own, so a reader that stops reading never blocks the launcher.

Unit tests of :class:`aiodist.launch.output.StreamWriter` (order, backpressure,
a broken stream, a bounded close), then ``python -m aiodist run`` with a
stdout pipe that the test does not read, or reads slowly.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import signal
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path

import pytest

from aiodist.launch.output import Outputs, StreamWriter
from test_launcher_run import _alive, child_env


class Gate(io.RawIOBase):
    """A binary stream whose writes block until the gate opens (a reader that stopped reading)."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.open_ = threading.Event()
        self.data = bytearray()
        self.fail = fail

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.open_.wait(30)
        if self.fail:
            raise BrokenPipeError(32, "Broken pipe")
        self.data += b
        return len(b)


class Reader:
    """A pausable reader that records what backpressure did to it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ the writer


async def test_writer_writes_every_byte_in_order_to_any_binary_stream() -> None:
    out = io.BytesIO()
    writer = StreamWriter(out, high_water=100, low_water=10, drop_above=1000)
    chunks = [f"line {i}\n".encode() for i in range(5000)]
    for chunk in chunks:
        writer.write(chunk)
    assert await writer.close(idle=5.0)
    assert out.getvalue() == b"".join(chunks)
    assert writer.written == len(out.getvalue()) and writer.pending == 0 and writer.dropped == 0


async def test_writer_writes_to_a_file_descriptor_in_order(tmp_path: Path) -> None:
    path = tmp_path / "out"
    with open(path, "wb") as f:
        f.write(b"before\n")  # (still in the Python buffer: flushed before the writer's own writes)
        writer = StreamWriter(f)
        for i in range(1000):
            writer.write(f"{i}\n".encode())
        assert await writer.close(idle=5.0)
    assert path.read_bytes() == b"before\n" + b"".join(f"{i}\n".encode() for i in range(1000))


async def test_backpressure_pauses_readers_above_high_water_and_resumes_them_at_low_water() -> None:
    gate = Gate()
    writer = StreamWriter(gate, high_water=1000, low_water=100, drop_above=10_000)
    reader, late = Reader(), Reader()
    writer.attach(reader)
    try:
        writer.write(b"x" * 1000)  # (at the mark, not above it)
        await asyncio.sleep(0.05)
        assert reader.calls == [] and not writer.paused
        writer.write(b"y")
        assert reader.calls == ["pause"] and writer.paused
        writer.write(b"z" * 5000)  # (what a paused pipe had already read is still accepted)
        assert reader.calls == ["pause"] and writer.pending == 6001
        writer.attach(late)  # a rank started while paused starts paused
        assert late.calls == ["pause"]
        gate.open_.set()
        await until(lambda: reader.calls == ["pause", "resume"])
        assert late.calls == ["pause", "resume"] and not writer.paused
        assert await writer.close(idle=5.0)
        assert bytes(gate.data) == b"x" * 1000 + b"y" + b"z" * 5000
    finally:
        gate.open_.set()


async def test_detaching_a_paused_reader_resumes_it_and_may_drop_output_is_dropped_beyond_its_bound() -> None:
    gate = Gate()
    writer = StreamWriter(gate, high_water=10, low_water=5, drop_above=100)
    reader = Reader()
    writer.attach(reader)
    try:
        writer.write(b"a" * 50)
        assert reader.calls == ["pause"]
        writer.detach(reader)  # (a rank being stopped: read to the end)
        assert reader.calls == ["pause", "resume"]
        writer.write(b"b" * 60, may_drop=True)  # 50 waiting: accepted
        writer.write(b"c" * 10, may_drop=True)  # 110 waiting: dropped
        writer.write(b"d" * 10)  # (backpressured output is never dropped)
        assert writer.pending == 120 and writer.dropped == 10
        gate.open_.set()
        assert await writer.close(idle=5.0)
        assert bytes(gate.data) == b"a" * 50 + b"b" * 60 + b"d" * 10
    finally:
        gate.open_.set()


async def test_a_broken_stream_drops_its_output_silently_and_resumes_the_readers() -> None:
    gate = Gate(fail=True)
    writer = StreamWriter(gate, high_water=10, low_water=5, drop_above=100)
    reader = Reader()
    writer.attach(reader)
    writer.write(b"x" * 20)
    assert reader.calls == ["pause"]
    gate.open_.set()
    await until(lambda: writer.broken)
    await until(lambda: reader.calls == ["pause", "resume"])  # the ranks run on
    writer.write(b"more")  # accepted, and dropped
    assert writer.pending == 0 and writer.dropped == 24 and not writer.paused
    start = time.monotonic()
    assert not await writer.close(idle=5.0)
    assert time.monotonic() - start < 1


async def test_a_closed_pipe_is_epipe_and_the_writer_keeps_accepting_and_dropping() -> None:
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "wb") as f:
        writer = StreamWriter(f)
        writer.write(b"lost\n")
        await until(lambda: writer.broken)
        for _ in range(100):
            writer.write(b"lost too\n")
        assert not await writer.close(idle=5.0)
        assert writer.dropped == 5 + 900


async def test_close_gives_up_on_a_reader_that_never_reads_and_drops_what_waits() -> None:
    gate = Gate()
    writer = StreamWriter(gate)
    try:
        writer.write(b"x" * 1000)
        writer.write(b"y" * 1000)
        start = time.monotonic()
        assert not await writer.close(idle=0.3)
        took = time.monotonic() - start
        assert 0.25 < took < 2, took
        assert writer.dropped == 2000 and writer.pending == 0
        writer.write(b"after")  # (after close: dropped)
        assert writer.dropped == 2005
    finally:
        gate.open_.set()  # the thread left in its write ends now
    await until(lambda: not writer._thread.is_alive())
    assert bytes(gate.data) == b"x" * 1000 + b"y" * 1000  # (the write it was in, counted as dropped; nothing after)


async def test_close_waits_as_long_as_the_reader_makes_progress_but_no_longer_than_its_limit() -> None:
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: a small pipe (Linux)
    with os.fdopen(w, "wb") as f, os.fdopen(r, "rb", buffering=0) as rf:
        writer = StreamWriter(f)
        data = bytes(range(256)) * 400  # 100 KiB
        writer.write(data)
        got = bytearray()

        def slow_reader() -> None:
            while len(got) < len(data):
                got.extend(rf.read(4096))
                time.sleep(0.01)

        thread = threading.Thread(target=slow_reader)
        thread.start()
        try:
            start = time.monotonic()
            assert await writer.close(idle=0.3)  # (the whole read takes longer than idle)
            assert time.monotonic() - start > 0.2
        finally:
            thread.join(10)
        assert bytes(got) == data

        writer = StreamWriter(f)
        writer.write(data)
        start = time.monotonic()
        stop = threading.Event()

        def trickle() -> None:
            while not stop.is_set():
                rf.read(64)
                time.sleep(0.02)

        thread = threading.Thread(target=trickle)
        thread.start()
        try:
            assert not await writer.close(idle=0.5, limit=0.5)  # progress, but the limit ends the wait
            assert time.monotonic() - start < 1.5
        finally:
            stop.set()
            thread.join(10)


async def test_outputs_share_one_writer_per_stream_so_order_is_kept() -> None:
    out = io.BytesIO()
    outputs = Outputs(high_water=100, low_water=10, drop_above=1000)
    a, b = outputs.writer(out, "stdout"), outputs.writer(out, "stderr")
    assert a is b
    for i in range(100):
        (a if i % 2 else b).write(f"{i}\n".encode())
    await outputs.close(idle=5.0)
    assert out.getvalue() == b"".join(f"{i}\n".encode() for i in range(100))


# ------------------------------------------------------------------ the launcher with a reader that stalls

PRINTER = """
import os, sys
from pathlib import Path
Path(f"pid.{os.environ['RANK']}").write_text(str(os.getpid()))
line = "x" * 200
for i in range(20000):  # 4 MiB: more than every pipe and buffer between here and the test
    print(i, line)
print("done", flush=True)
import time
time.sleep(60)
"""


def _launcher(tmp_path: Path, source: str, n: int, stdout: int) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp_path / "p.py").write_text(textwrap.dedent(source))
    err = tmp_path / "launcher.err"
    with open(err, "wb") as errf:
        proc = subprocess.Popen([sys.executable, "-m", "aiodist", "run", "-n", str(n), "p.py"], cwd=tmp_path,
                                env=child_env(), stdout=stdout, stderr=errf, stdin=subprocess.DEVNULL)
    return proc, err


def _unread(fd: int) -> int:
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, sys.byteorder)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()  # (its ranks die with it: PR_SET_PDEATHSIG)
        proc.wait(10)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_stops_the_launcher_at_once_while_nobody_reads_its_output(tmp_path: Path, signum: int) -> None:
    r, w = os.pipe()
    capacity = fcntl.fcntl(r, 1032)  # F_GETPIPE_SZ (full is a little less: lines do not fill whole pages)
    proc, err = _launcher(tmp_path, PRINTER, 2, w)
    os.close(w)
    try:
        deadline = time.monotonic() + 30
        # Full: more than half of it holds output and nothing more came for a second (pages of a pipe filled by
        # separate writes are not filled to the byte: "full" may be 10-20% short of its capacity).
        last, since = -1, time.monotonic()
        while True:
            unread, now = _unread(r), time.monotonic()
            if unread != last:
                last, since = unread, now
            elif unread > capacity // 2 and now - since >= 1.0 and all((tmp_path / f"pid.{k}").exists() for k in range(2)):
                break
            assert now < deadline and proc.poll() is None, f"the ranks never filled the pipe ({unread} of {capacity})"
            time.sleep(0.05)
        pids = [int((tmp_path / f"pid.{k}").read_text()) for k in range(2)]
        start = time.monotonic()
        proc.send_signal(signum)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher did not exit within 15 s of {signal.Signals(signum).name} (its reader stalled)")
        took = time.monotonic() - start
        assert proc.returncode == 128 + signum, err.read_text()
        assert took < 5, took
        assert f"received {signal.Signals(signum).name}" in err.read_text()
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        _kill(proc)
        os.close(r)


def _rss_kib(pid: int, field: str = "VmHWM") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


SPEAKER = """
import os
rank = os.environ["RANK"]
pad = "." * 1000
for i in range({lines}):
    print(rank, i, pad)
"""


def test_a_slow_reader_gets_every_line_in_order_and_the_launcher_memory_stays_bounded(tmp_path: Path) -> None:
    lines = 30_000  # ~30 MiB a rank, 60 MiB in all
    r, w = os.pipe()
    proc, err = _launcher(tmp_path, SPEAKER.format(lines=lines), 2, w)
    os.close(w)
    seen = {0: 0, 1: 0}
    peak = 0
    try:
        with os.fdopen(r, "rb", buffering=0) as rf:
            tail = b""
            burst = 0
            deadline = time.monotonic() + 120
            while True:
                assert time.monotonic() < deadline, "the output did not end in time"
                chunk = rf.read(1 << 16)
                if not chunk:
                    break
                burst += len(chunk)
                if burst >= 8 << 20:  # a reader that reads in bursts: 8 MiB, then nothing for a second
                    burst = 0
                    time.sleep(1.0)
                    if proc.poll() is None:
                        peak = max(peak, _rss_kib(proc.pid))
                *complete, tail = (tail + chunk).split(b"\n")
                for line in complete:
                    tag, _, rest = line.partition(b": ")
                    rank = int(tag[len(b"[rank"):-1])
                    number, i, pad = rest.split(b" ")
                    assert int(number) == rank and int(i) == seen[rank] and pad == b"." * 1000, line[:80]
                    seen[rank] += 1
            assert tail == b""
        assert proc.wait(30) == 0, err.read_text()
    finally:
        _kill(proc)
    assert seen == {0: lines, 1: lines}
    print(f"launcher peak RSS {peak / 1024:.1f} MiB")
    assert 0 < peak < 64 * 1024, f"the launcher grew to {peak / 1024:.0f} MiB (60 MiB printed)"


LATE = """
import os, time
rank = int(os.environ["RANK"])
pad = "." * 1000
if rank == 1:
    time.sleep(1.0)  # (until rank 0 has filled the launcher's buffer: rank 1's pipe is paused)
for i in range(2500 if rank == 0 else 30):
    print(rank, i, pad)
"""


def test_a_rank_that_exits_while_a_slow_reader_holds_its_output_back_loses_none_of_it(tmp_path: Path) -> None:
    r, w = os.pipe()
    proc, err = _launcher(tmp_path, LATE, 2, w)
    os.close(w)
    seen = {0: 0, 1: 0}
    try:
        with os.fdopen(r, "rb", buffering=0) as rf:
            time.sleep(2.5)  # rank 0 blocks in print; rank 1's 30 lines wait in its paused pipe; it exits
            tail = b""
            deadline = time.monotonic() + 60
            while True:  # a steady slow reader (~300 KiB/s): the launcher takes longer than 2 s to drain
                assert time.monotonic() < deadline, "the output did not end in time"
                chunk = rf.read(1 << 15)
                if not chunk:
                    break
                time.sleep(0.1)
                *complete, tail = (tail + chunk).split(b"\n")
                for line in complete:
                    rank = int(line[len(b"[rank"):line.index(b"]")])
                    assert line.split(b" ")[2] == str(seen[rank]).encode(), line[:80]
                    seen[rank] += 1
        assert proc.wait(30) == 0, err.read_text()
    finally:
        _kill(proc)
    assert seen == {0: 2500, 1: 30}
