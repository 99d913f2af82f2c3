"""What a virtual rank has to itself, as a real process has: environment, random generators, addresses.

N virtual ranks share one Python process, but a program expects what a
process of its own would give it:

* ``os.environ`` / ``os.getenv``: the rank's environment (the launcher's
  variables RANK, WORLD_SIZE, MASTER_ADDR, ... on top of the process
  environment). Writes stay in the rank.
* the module-level random generators: :mod:`random`'s functions, numpy's
  legacy global generator (``np.random.seed``, ``np.random.rand``, ...) and,
  when torch is imported, torch's default CPU generator. Each rank has its
  own, seeded from the run's seed, its rank and its incarnation (a real
  process seeds them from the OS, which no replay could reproduce), so
  ``random.seed(0)`` on every rank gives every rank the same sequence, as it
  does in real processes.
* the clocks: :func:`time.time`, :func:`time.monotonic`,
  :func:`time.perf_counter` (and their ``_ns`` forms) read the virtual clock
  (``time.time()`` is :data:`VIRTUAL_EPOCH` at virtual time 0), so that a
  lease, a deadline or a measured duration in the program passes in virtual
  time, the same in every replay; ``time.sleep`` blocks the rank's process for
  that long in virtual time (as a pause: nothing else of it runs, what it sends
  leaves when the sleep ends, its peers hear nothing meanwhile).
  :mod:`datetime`'s ``now()``, ``utcnow()`` and ``today()`` and the
  argument-less ``time.localtime()`` family read it too (:mod:`sim.rank_dates`);
  ``time.process_time`` stays real.
* ``os.getpid()``: a process id of its own (per rank and incarnation), and
  ``os.urandom`` (with it ``uuid.uuid4``, :mod:`secrets` and
  ``random.SystemRandom``): a seeded stream of the rank's, so ids and tokens
  a program draws replay;
* a nonce source for :func:`aiodist.context.token_bytes` drawn from the seed,
  and an ``AIODIST_SECRET`` derived from the seed (unless the run's ``env``
  chooses the secret), so authentication runs and replays.
* addresses: the names of "this machine" (``127.0.0.1``, ``localhost``,
  the real machine's host name) reach the host that listens on that port,
  preferring the calling host and then the store's host, as on one real
  machine where ``tcp://127.0.0.1:P`` names the one process listening on P.
  (Without this, ``tcp://127.0.0.1:P`` would mean each virtual host itself
  and every rank but the store's would wait for a store that is not there.)

:class:`ProcessGlobals` installs the dispatchers for one run and restores
the module attributes afterwards. The dispatchers look the calling rank up
in a context variable, so code outside any rank (the simulator itself,
other threads) sees the real objects. Code that bound a generator function
before the run (``from random import random``) or holds ``os.environ``
under another name keeps the process-wide object.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from aiodist.net.base import Address, Connection, ConnectionHandler, Listener
from aiodist.net.base import Network as SeamNetwork

from . import rank_dates
from .errors import SimUnsupportedError
from .host_network import LOCAL_NAMES

if TYPE_CHECKING:
    from .network import Fabric, Host

__all__ = ["RankProcess", "ProcessExit", "ProcessGlobals", "RankNetwork", "inherited_environment", "current_process",
           "LOOPBACK_NAMES", "PROCESS", "VIRTUAL_EPOCH"]

PROCESS: contextvars.ContextVar[RankProcess | None] = contextvars.ContextVar("sim_process", default=None)
"""The virtual rank process of the code running in a context (None: not a rank)."""

LAUNCHER_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONHASHSEED",
})
"""Variables of the simulator's own process that a virtual rank does not inherit (the launcher sets its own)."""

LOOPBACK_NAMES = frozenset({"", "0.0.0.0", "::", "127.0.0.1", "localhost", "::1", "localhost.localdomain",
                            socket.gethostname()})
"""The names of "this machine" (what a program started on one real machine may call it)."""


def current_process() -> RankProcess | None:
    """The virtual rank process of the calling code (None outside the simulator's ranks)."""
    return PROCESS.get()


def inherited_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a rank inherits from the simulator's process: all but launcher, aiodist and torchelastic variables.

    (Those come from the run itself, so a replay does not depend on the shell it runs in.)
    """
    return {k: v for k, v in environ.items()
            if k not in LAUNCHER_VARIABLES and not k.startswith(("AIODIST_", "TORCHELASTIC_"))}


def job_secret(seed: int | str) -> str:
    """The run's ``AIODIST_SECRET``: derived from the seed, the same on every rank (one job, one secret)."""
    return hashlib.blake2b(f"{seed}:secret".encode(), digest_size=32).hexdigest()


class RankProcess:
    """One incarnation of a virtual rank's process state.

    Generators are created on first use (most ranks of a big run never draw),
    each from its own stream of the seed, so the order of first use does not
    matter.
    """

    __slots__ = ("rank", "incarnation", "environ", "_seed", "_random", "_numpy", "_tokens", "_urandom", "torch_state")

    def __init__(self, seed: int | str, rank: int, incarnation: int, environ: dict[str, str]) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.environ = environ
        self._seed = seed
        self._random: random.Random | None = None
        self._numpy: Any = None
        self._tokens: random.Random | None = None
        self._urandom: random.Random | None = None
        self.torch_state: Any = None  # torch's default generator state while another rank runs

    def __repr__(self) -> str:
        return f"<sim.RankProcess rank {self.rank} incarnation {self.incarnation}>"

    def stream(self, name: str) -> str:
        return f"{self._seed}:{name}:{self.rank}:{self.incarnation}"

    @property
    def random(self) -> random.Random:
        """This process's instance behind :mod:`random`'s module functions."""
        r = self._random
        if r is None:
            r = self._random = random.Random(self.stream("random"))
        return r

    @property
    def numpy(self) -> Any:
        """This process's numpy legacy global generator (a ``RandomState``)."""
        g = self._numpy
        if g is None:
            import numpy as np

            g = self._numpy = np.random.RandomState(random.Random(self.stream("numpy")).randrange(2**32))
        return g

    def token_bytes(self, n: int) -> bytes:
        """Nonces for :func:`aiodist.context.token_bytes`: a seeded stream of this process."""
        t = self._tokens
        if t is None:
            t = self._tokens = random.Random(self.stream("tokens"))
        return t.randbytes(n)

    def urandom(self, n: int) -> bytes:
        """``os.urandom`` for this process (and so ``uuid.uuid4``, :mod:`secrets`, ``random.SystemRandom``): seeded."""
        u = self._urandom
        if u is None:
            u = self._urandom = random.Random(self.stream("urandom"))
        return u.randbytes(n)

    def getpid(self) -> int:
        """``os.getpid()`` for this process: one per rank and incarnation (a restarted rank has a new one)."""
        return 10_000 + 1_000 * self.incarnation + self.rank

    def torch_seed(self) -> int:
        return random.Random(self.stream("torch")).randrange(2**63)


# --------------------------------------------------------------------------- os.environ


class RankEnviron(MutableMapping[str, str]):
    """``os.environ`` while a simulation runs: the calling rank's environment, else the real one."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real

    def _env(self) -> MutableMapping[str, str]:
        p = PROCESS.get()
        return self.real if p is None else p.environ

    def __getitem__(self, key: str) -> str:
        return self._env()[key]

    def __setitem__(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"str expected, not {type(key if not isinstance(key, str) else value).__name__}")
        self._env()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._env()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._env()))

    def __len__(self) -> int:
        return len(self._env())

    def __contains__(self, key: object) -> bool:
        return key in self._env()

    def get(self, key: str, default: Any = None) -> Any:  # (os.getenv's path: one lookup)
        return self._env().get(key, default)

    def copy(self) -> dict[str, str]:
        return dict(self._env())

    def __repr__(self) -> str:
        p = PROCESS.get()
        who = "process" if p is None else f"rank {p.rank}"
        return f"environ({who}: {dict(self._env())!r})"


# --------------------------------------------------------------------------- generators


def _dispatcher(name: str, fallback: Any, pick: Callable[[RankProcess], Any]) -> Callable[..., Any]:
    original = getattr(fallback, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        p = PROCESS.get()
        if p is None:
            return original(*args, **kwargs)
        return getattr(pick(p), name)(*args, **kwargs)

    call.__name__ = getattr(original, "__name__", name)
    call.__qualname__ = call.__name__
    call.__doc__ = getattr(original, "__doc__", None)
    return call


# --------------------------------------------------------------------------- clocks

VIRTUAL_EPOCH = 1_767_225_600.0
"""What ``time.time()`` says in a rank at virtual time 0 (2026-01-01 00:00 UTC): a fixed wall clock, so runs replay."""

_EPOCH_NS = int(VIRTUAL_EPOCH) * 1_000_000_000

_CLOCKS: dict[str, Callable[[float], float | int]] = {
    "time": lambda t: VIRTUAL_EPOCH + t,
    "time_ns": lambda t: _EPOCH_NS + round(t * 1e9),
    "monotonic": lambda t: t,
    "monotonic_ns": lambda t: round(t * 1e9),
    "perf_counter": lambda t: t,
    "perf_counter_ns": lambda t: round(t * 1e9),
}
"""The clocks of :mod:`time` a rank reads as the virtual clock ``t`` (seconds since the run began)."""


def _rank_clock() -> float | None:
    """The calling rank's virtual clock (seconds since the run began), None outside a rank."""
    if PROCESS.get() is not None:
        loop = asyncio._get_running_loop()
        if loop is not None:
            return loop.lane_clock(loop.lane)  # type: ignore[attr-defined, no-any-return]  # (a SimLoop)
    return None


def _clock(name: str, virtual: Callable[[float], float | int]) -> Callable[[], float | int]:
    """``time.<name>`` as a rank sees it: the virtual clock in a rank's code, the real one elsewhere."""
    real = getattr(time, name)

    def clock() -> float | int:
        t = _rank_clock()
        return real() if t is None else virtual(t)

    clock.__name__ = clock.__qualname__ = name
    clock.__doc__ = real.__doc__
    return clock


def _as_completed(real: Callable[..., Any]) -> Callable[..., Any]:
    """``asyncio.as_completed`` as a rank calls it: the awaitables become tasks in the order given.

    The real one makes them tasks in the order of ``set(fs)``, by address for
    coroutines: their first steps ran in an order that changed with what the
    process had allocated before (a sweep's worker vs. a replay).
    """

    def as_completed(fs: Any, *, timeout: float | None = None) -> Any:
        if PROCESS.get() is None or asyncio.isfuture(fs) or asyncio.iscoroutine(fs):
            return real(fs, timeout=timeout)
        unique: dict[int, Any] = {}
        for f in fs:  # (the same awaitable twice is one, as in the real one)
            unique.setdefault(id(f), f)
        return real([asyncio.ensure_future(f) for f in unique.values()], timeout=timeout)

    as_completed.__doc__ = real.__doc__
    return as_completed


def _rank_wall_time() -> float | None:
    """The calling rank's ``time.time()``, None outside a rank (for :mod:`sim.rank_dates`)."""
    t = _rank_clock()
    return None if t is None else VIRTUAL_EPOCH + t


def _sleep() -> Callable[[float], None]:
    """``time.sleep`` as a rank sees it: its process blocks for that long in virtual time (elsewhere: real)."""
    real = time.sleep
    running_loop = asyncio._get_running_loop

    def sleep(seconds: float, /) -> None:
        if PROCESS.get() is None or (loop := running_loop()) is None:
            return real(seconds)
        if not seconds >= 0:
            raise ValueError("sleep length must be non-negative")
        loop.block_lane(loop.lane, float(seconds))  # type: ignore[attr-defined]  # (a SimLoop)
        return None

    sleep.__doc__ = real.__doc__
    return sleep


class _RankRandomState:
    """Stands in for ``numpy.random.mtrand._rand`` (libraries that read the legacy generator directly)."""

    def __init__(self, real: Any) -> None:
        object.__setattr__(self, "_real", real)

    def __getattr__(self, name: str) -> Any:
        p = PROCESS.get()
        return getattr(self._real if p is None else p.numpy, name)

    def __repr__(self) -> str:
        return "<sim: the calling rank's numpy RandomState>"


class _TorchGenerator:
    """Swaps torch's default CPU generator state when the running rank changes (see :class:`RankTask`)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.generator = torch.default_generator
        self.saved = self.generator.get_state()
        self.owner: RankProcess | None = None

    def switch_to(self, p: RankProcess) -> None:
        gen = self.generator
        owner = self.owner
        if owner is not None:
            owner.torch_state = gen.get_state()
        if p.torch_state is None:
            gen.manual_seed(p.torch_seed())
        else:
            gen.set_state(p.torch_state)
        self.owner = p

    def restore(self) -> None:
        self.generator.set_state(self.saved)
        self.owner = None


class RankTask(Coroutine[Any, Any, Any]):
    """A task's coroutine that installs its rank's torch generator state before each step.

    Only used when torch is imported: torch's random functions draw from one
    C++ generator, which no module attribute can redirect, so its state is
    swapped when a step of another rank's task starts.
    """

    __slots__ = ("coro", "process", "torch")

    def __init__(self, coro: Coroutine[Any, Any, Any], process: RankProcess, torch: _TorchGenerator) -> None:
        self.coro = coro
        self.process = process
        self.torch = torch

    def send(self, value: Any) -> Any:
        if self.torch.owner is not self.process:
            self.torch.switch_to(self.process)
        return self.coro.send(value)

    def throw(self, *args: Any) -> Any:
        if self.torch.owner is not self.process:
            self.torch.switch_to(self.process)
        return self.coro.throw(*args)

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Any:
        return self.coro.__await__()

    @property
    def cr_frame(self) -> Any:
        return getattr(self.coro, "cr_frame", None)

    @property
    def cr_await(self) -> Any:
        return getattr(self.coro, "cr_await", None) or getattr(self.coro, "gi_yieldfrom", None)

    def __repr__(self) -> str:
        return repr(self.coro)


class ProcessExit(SystemExit):
    """``os._exit(code)`` in a rank: its process ends at once, without cleanup (no ``finally``, no
    teardown); raised in the rank, taken by the runner. Outside any rank ``os._exit`` is the real one."""


def _os_exit(real: Callable[[int], Any]) -> Callable[[int], Any]:
    def _exit(code: int, /) -> Any:
        if PROCESS.get() is None:
            return real(code)
        raise ProcessExit(code)

    _exit.__name__ = _exit.__qualname__ = "_exit"
    return _exit


_FATAL = tuple(int(getattr(signal, name)) for name in ("SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT", "SIGHUP")
               if hasattr(signal, name))
"""Signals whose default action ends a process: a rank sending one to itself ends its process so."""


def _os_kill(real: Callable[[int, int], Any]) -> Callable[[int, int], Any]:
    """``os.kill`` as a rank sees it: a signal that ends a process, sent to its own pid (``os.getpid()``),
    ends its process at once with status 128 + the signal (as ``os._exit`` does: its connections close); any
    other signal or process raises SimUnsupportedError. Never a real process: a rank's pids are virtual
    (10000 + ...), and a real process with such a pid would get the signal. Elsewhere: the real one."""

    def kill(pid: int, sig: int, /) -> Any:
        p = PROCESS.get()
        if p is None:
            return real(pid, sig)
        if pid == p.getpid() and int(sig) in _FATAL:
            raise ProcessExit(128 + int(sig))
        raise SimUnsupportedError("os.kill", (
            f"os.kill({pid}, {sig}) in a simulated rank: signals are not simulated (a rank may end itself, "
            "os.kill(os.getpid(), signal.SIGKILL); to stop another, use the faults sim.Crash, sim.Pause, "
            "sim.Restart); no real process is ever signalled"))

    kill.__name__ = kill.__qualname__ = "kill"
    kill.__doc__ = real.__doc__
    return kill


def _os_killpg(real: Callable[[int, int], Any]) -> Callable[[int, int], Any]:
    """``os.killpg`` as a rank sees it: SimUnsupportedError (a real process group could get the signal)."""

    def killpg(pgid: int, sig: int, /) -> Any:
        if PROCESS.get() is None:
            return real(pgid, sig)
        raise SimUnsupportedError("os.killpg", f"os.killpg({pgid}, {sig}) in a simulated rank: signals are not "
                                  "simulated (faults: sim.Crash, sim.Pause, sim.Restart)")

    killpg.__name__ = killpg.__qualname__ = "killpg"
    killpg.__doc__ = real.__doc__
    return killpg


def _os_fork(real: Callable[[], int]) -> Callable[[], int]:
    """``os.fork`` as a rank sees it: SimUnsupportedError (the child would be a copy of the whole simulation,
    every rank and the simulator with them, and would go on running it). Elsewhere: the real one."""

    def fork() -> int:
        if PROCESS.get() is None:
            return real()
        raise SimUnsupportedError("os.fork", (
            "os.fork() in a simulated rank: the virtual ranks share one process, and a child would go on "
            "running the whole simulation. Processes are not simulated: keep forking work (multiprocessing, "
            "a DataLoader's workers: num_workers=0) out of programs run in the simulator"))

    fork.__name__ = fork.__qualname__ = "fork"
    fork.__doc__ = real.__doc__
    return fork


class ProcessGlobals:
    """Installs the per-rank dispatchers for one run (a context manager; nests, restores on exit)."""

    _depth = 0
    _saved: list[tuple[Any, str, Any]] = []
    _lock = threading.Lock()  # (runs in several threads of one process share the patches)

    def __init__(self) -> None:
        self.torch: _TorchGenerator | None = None

    def __enter__(self) -> ProcessGlobals:
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "default_generator"):
            self.torch = _TorchGenerator(torch)
        cls = ProcessGlobals
        with cls._lock:
            cls._depth += 1
            if cls._depth == 1:
                cls._saved = self._install()
        return self

    @staticmethod
    def _install() -> list[tuple[Any, str, Any]]:
        """Patch the module attributes (once per process, while any run is on); return what to restore."""
        saved: list[tuple[Any, str, Any]] = []

        def patch(obj: Any, name: str, value: Any) -> None:
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        patch(os, "environ", RankEnviron(os.environ))
        inst = getattr(random, "_inst")  # the instance behind random's module functions
        for name in sorted(vars(random)):
            if getattr(getattr(random, name), "__self__", None) is inst:
                patch(random, name, _dispatcher(name, inst, lambda p: p.random))
        import numpy.random as np_random  # (numpy loads it lazily: a program may use it later)
        from numpy.random import mtrand

        legacy = mtrand._rand
        for module in (np_random, mtrand):
            for name in sorted(vars(module)):
                if getattr(getattr(module, name), "__self__", None) is legacy:
                    patch(module, name, _dispatcher(name, legacy, lambda p: p.numpy))
        patch(mtrand, "_rand", _RankRandomState(legacy))
        for name, virtual in _CLOCKS.items():
            patch(time, name, _clock(name, virtual))
        patch(time, "sleep", _sleep())
        rank_dates.install(patch, _rank_wall_time)
        ordered = _as_completed(asyncio.tasks.as_completed)
        patch(asyncio.tasks, "as_completed", ordered)
        patch(asyncio, "as_completed", ordered)
        patch(os, "getpid", _dispatcher("getpid", os, lambda p: p))
        patch(os, "_exit", _os_exit(os._exit))
        patch(os, "kill", _os_kill(os.kill))
        if hasattr(os, "killpg"):  # (signal.raise_signal and pthread_kill stay: they signal this process only)
            patch(os, "killpg", _os_killpg(os.killpg))
        if hasattr(os, "fork"):
            patch(os, "fork", _os_fork(os.fork))
        urandom = _dispatcher("urandom", os, lambda p: p)
        patch(os, "urandom", urandom)
        patch(random, "_urandom", urandom)  # (random.SystemRandom, and so secrets, reads its own binding)
        return saved

    def __exit__(self, *exc: Any) -> None:
        if self.torch is not None:
            self.torch.restore()
        cls = ProcessGlobals
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                for obj, name, value in reversed(cls._saved):
                    setattr(obj, name, value)
                cls._saved = []

    def enter_rank(self, process: RankProcess) -> None:
        """Make ``process`` the calling context's process (inside the rank's context)."""
        PROCESS.set(process)

    def wrap(self, coro: Coroutine[Any, Any, Any], process: RankProcess | None) -> Coroutine[Any, Any, Any]:
        """A task's coroutine as it should run for ``process`` (wrapped only when torch needs swapping)."""
        if self.torch is None or process is None:
            return coro
        return RankTask(coro, process, self.torch)


# --------------------------------------------------------------------------- addresses


class RankNetwork(SeamNetwork):
    """A rank's view of the network with one machine's address names (see the module docstring).

    A name of :data:`LOOPBACK_NAMES` reaches the host listening on that port:
    the calling host if it does, else ``store_host``, else the first host
    that does (in the order hosts were added). Other names pass through
    (virtual host names such as ``rank3``; anything else is an unknown host).
    """

    __slots__ = ("_net", "_host", "_fabric", "_store_host")

    def __init__(self, net: SeamNetwork, host: Host, fabric: Fabric, store_host: Callable[[], Host]) -> None:
        self._net = net
        self._host = host
        self._fabric = fabric
        self._store_host = store_host

    def __repr__(self) -> str:
        return f"<sim.RankNetwork {self._host.name}>"

    async def default_host(self) -> str:
        return await self._net.default_host()

    def resolve(self, name: str, port: int) -> str:
        """The virtual host a connection to ``name:port`` reaches (``name`` itself if not loopback)."""
        if name not in LOOPBACK_NAMES:
            return name
        me = self._host
        if port in me.listeners:
            return me.name
        store = self._store_host()
        if port in store.listeners:
            return store.name
        for host in self._fabric.hosts.values():  # (in the order the hosts were added: deterministic)
            if port in host.listeners:
                return host.name
        return me.name  # nobody listens (yet): refused, as by this machine

    def connect(  # (the host network's coroutine itself, not one around it: a coroutine fewer per connection)
        self, address: Address, *, timeout: float | None = None, **kwargs: Any
    ) -> Coroutine[Any, Any, Connection]:
        host, port = address
        if host in LOOPBACK_NAMES:
            address = (self.resolve(host, int(port)), port)
        return self._net.connect(address, timeout=timeout, **kwargs)

    async def listen(self, address: Address, handler: ConnectionHandler, *, max_frame_size: int | None = None,
                     handshake_timeout: float | None = None, ssl: Any = None) -> Listener:
        if address[0] in LOOPBACK_NAMES and address[0] not in LOCAL_NAMES:  # (the machine's host name)
            address = ("", address[1])
        return await self._net.listen(address, handler, max_frame_size=max_frame_size,
                                      handshake_timeout=handshake_timeout, ssl=ssl)
