"""Fault-tolerant data-parallel training: checkpoints, a rank killed mid-run, and the correct model anyway.

    # the launcher restarts the whole job after a failure; it resumes from the last checkpoint
    aiodist run -n 4 --max-restarts 2 examples/elastic_train.py --ckpt-dir /tmp/ckpt

    # the same, with rank 2 killing itself (SIGKILL) at step 37 of the first attempt
    ELASTIC_KILL=2@37 aiodist run -n 4 --max-restarts 1 examples/elastic_train.py --ckpt-dir /tmp/ckpt

    # no restart: the survivors abort, rendezvous again as 3 ranks in the same processes, and go on
    # (--on-failure continue: the launcher lets them; it reports rank 2's death at the end, exit status 137)
    ELASTIC_KILL=2@37 aiodist run -n 4 --on-failure continue examples/elastic_train.py --ckpt-dir /tmp/ckpt --shrink

    # a rank restarted alone (a process supervisor; the simulator's Restart fault) rejoins: the survivors and
    # the restarted rank meet in the next round of the elastic rendezvous, and go on with whoever came
    python -m sim run -n 4 examples/elastic_train.py --restart 2@sent:150+0.2 -- --ckpt-dir /tmp/ckpt --rejoin

    # deterministic, in the simulator (the kill is a sim.Crash there: see tests/test_elastic_example.py)
    python -m sim run -n 4 examples/elastic_train.py

The model is the logistic regression of ``examples/train_dp.py`` (same data,
steps and learning rate); every rank takes an equal shard and
``all_reduce(grad, AVG)`` gives the full-batch gradient, whatever the number of
ranks (the sample count divides every world size up to 10). Rank 0 writes a
checkpoint (step and weights, written to a temporary file then renamed, so a
crash never leaves half a file) every ``--every`` steps to ``--ckpt-dir`` (or
``$ELASTIC_CKPT_DIR``); every rank starts from the newest one. The launcher
tells a restarted job its restart count (``AIODIST_RESTART_COUNT``).

With ``--shrink`` a failure is survived in place: every survivor gets
``PeerFailureError`` naming the dead rank, calls ``aiodist.abort()``, and joins
a new rendezvous round of the survivors (renumbered 0..n-2, rank 0 hosting the
store again: so the dead rank must not be rank 0 in this mode), reloads the
last checkpoint and continues. (Each survivor decides who died from its own
error: a survivor that was stalled meanwhile may blame another survivor.)

With ``--rejoin`` the ranks agree on who is in through
:class:`aiodist.ElasticRendezvous`, round by round, in the job's store (rank 0
hosts it for the whole job, unless an agent does: ``TORCHELASTIC_USE_AGENT_STORE``;
so rank 0 must live): after a failure every survivor aborts and opens the next
round; a restarted process (``AIODIST_RESTART_COUNT`` > 0) opens it too, since
the round it was in is broken. Whoever joins within the last call (three
seconds: longer than a rank may stall without its peers declaring it failed,
so a live rank that stalls while joining is not left out) makes the new
world: the restarted rank is back, or, if it does not come, the job goes on
without it. Either way the final weights must equal the
single-process reference (rank 0 checks; a mismatch raises). It needs a
supervisor that restarts one process alone (the simulator's ``Restart``): under
``aiodist run --max-restarts`` the whole job restarts, on a new port, so use
``--shrink`` or plain restarts there, or ``--rejoin`` with ``--on-failure
continue`` (the survivors go on without the dead rank).

``main()`` returns a dict: final loss, accuracy, the step it resumed from and
how many times it recovered in place.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import numpy as np

import aiodist
from aiodist.api import abort
from aiodist.errors import PeerFailureError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_dp import (  # noqa: E402  (the same model, data and reference)
    LEARNING_RATE,
    N_SAMPLES,
    STEPS,
    gradient,
    loss_and_accuracy,
    make_data,
    train_single_process,
)

CHECKPOINT = "checkpoint.npz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt-dir", default=os.environ.get("ELASTIC_CKPT_DIR"),
                    help="checkpoint directory (default: $ELASTIC_CKPT_DIR; none: no checkpoints)")
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps (default: 10)")
    ap.add_argument("--shrink", action="store_true", help="survive a failure in place with fewer ranks")
    ap.add_argument("--rejoin", action="store_true",
                    help="survive failures in place: the ranks that are alive (a restarted one included) "
                         "meet again through the elastic rendezvous")
    return ap.parse_args(sys.argv[1:] if argv is None else argv)


def load_checkpoint(ckpt_dir: str | None) -> tuple[int, np.ndarray | None]:
    if not ckpt_dir:
        return 0, None
    path = Path(ckpt_dir) / CHECKPOINT
    if not path.exists():
        return 0, None
    with np.load(path) as data:
        return int(data["step"]), data["w"].copy()


def save_checkpoint(ckpt_dir: str, step: int, w: np.ndarray) -> None:
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{CHECKPOINT}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, step=step, w=w)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / CHECKPOINT)


def kill_plan() -> tuple[int, int] | None:
    """``ELASTIC_KILL=RANK@STEP``: that rank SIGKILLs itself at that step, in the first attempt only."""
    raw = os.environ.get("ELASTIC_KILL")
    if not raw or os.environ.get("AIODIST_RESTART_COUNT", "0") != "0":
        return None
    rank, _, step = raw.partition("@")
    return int(rank), int(step)


async def train(args: argparse.Namespace, x: np.ndarray, y: np.ndarray, original_rank: int) -> tuple[int, np.ndarray]:
    """Train from the newest checkpoint to STEPS on the current default group; returns (resumed_from, w)."""
    rank, world = aiodist.get_rank(), aiodist.get_world_size()
    if N_SAMPLES % world:
        raise ValueError(f"{N_SAMPLES} samples cannot be split into {world} equal shards")
    shard = N_SAMPLES // world
    xs, ys = x[rank * shard : (rank + 1) * shard], y[rank * shard : (rank + 1) * shard]
    start, w = load_checkpoint(args.ckpt_dir)
    if w is None:
        w = np.zeros(x.shape[1])
    plan = kill_plan()
    for step in range(start, STEPS):
        if plan is not None and plan == (original_rank, step):
            print(f"rank {original_rank}: killing myself (SIGKILL) at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        grad = gradient(w, xs, ys)
        await aiodist.all_reduce(grad, op=aiodist.ReduceOp.AVG)
        w -= LEARNING_RATE * grad
        done = step + 1
        if args.ckpt_dir and rank == 0 and (done % args.every == 0 or done == STEPS):
            save_checkpoint(args.ckpt_dir, done, w)
    # Every rank must hold bit-identical weights.
    hi, lo = w.copy(), w.copy()
    await aiodist.all_reduce(hi, op=aiodist.ReduceOp.MAX)
    await aiodist.all_reduce(lo, op=aiodist.ReduceOp.MIN)
    if not np.array_equal(hi, lo):
        raise AssertionError(f"rank {rank}: the ranks' weights differ (max spread {np.max(hi - lo):g})")
    return start, w


async def _job_store(original_rank: int) -> tuple[aiodist.TCPStore, aiodist.StoreServer | None]:
    """The store the whole job meets in (``--rejoin``): rank 0's first process hosts it unless an agent does."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    server = None
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("true", "1")
    if original_rank == 0 and not agent and os.environ.get("AIODIST_RESTART_COUNT", "0") == "0":
        server = await aiodist.StoreServer.start(host=host, port=port)
    return await aiodist.TCPStore.connect(host, port, timeout=60), server


async def _next_world(rdzv: aiodist.ElasticRendezvous, store: aiodist.TCPStore) -> aiodist.ElasticRound:
    """Join the next round of the rendezvous and make its world this rank's default group."""
    rnd = await rdzv.next_round()
    await aiodist.init_process_group(rank=rnd.rank, world_size=rnd.world_size, timeout=60,
                                     store=aiodist.PrefixStore(f"job/round{rnd.round}", store))
    return rnd


async def main_rejoin(args: argparse.Namespace, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """``--rejoin``: rounds of the elastic rendezvous decide the world, after every failure (see the module doc)."""
    original_rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    store, server = await _job_store(original_rank)
    rdzv = aiodist.ElasticRendezvous(store, str(original_rank), min_nodes=1, max_nodes=world, last_call=3.0,
                                     prefix="job/elastic/")
    if os.environ.get("AIODIST_RESTART_COUNT", "0") != "0":
        state = await rdzv.state()  # this process is new: the round its predecessor was in is broken
        if state["status"] == "frozen" and str(original_rank) in state["participants"]:
            await rdzv.open_next_round(after=state["round"])
    recoveries = 0
    try:
        rnd = await _next_world(rdzv, store)
        while True:
            try:
                resumed, w = await train(args, x, y, original_rank)
                break
            except PeerFailureError as e:
                recoveries += 1
                print(f"rank {original_rank}: round {rnd.round} broke ({e.how}); meeting again", flush=True)
                await abort()
                await rdzv.open_next_round(after=rnd.round)
                rnd = await _next_world(rdzv, store)
                print(f"rank {original_rank}: round {rnd.round}: rank {rnd.rank} of {rnd.world_size}", flush=True)
        result = await _report(w, x, y, resumed, recoveries)
        await aiodist.destroy_process_group()
        # The job's store lives on rank 0's first process: it waits for the others to be done with it.
        if int(await store.add(f"job/left/{rnd.round}", 1)) == rnd.world_size:
            await store.set(f"job/all_left/{rnd.round}", "1")
        if server is not None:
            await store.wait([f"job/all_left/{rnd.round}"], timeout=60)
        return result
    finally:
        if aiodist.is_initialized():
            await aiodist.abort()
        await store.close()
        if server is not None:
            await server.close()


async def _report(w: np.ndarray, x: np.ndarray, y: np.ndarray, resumed: int, recoveries: int) -> dict[str, float]:
    """Rank 0 checks the weights against the single-process reference; every rank returns its numbers."""
    loss, accuracy = loss_and_accuracy(w, x, y)
    if aiodist.get_rank() == 0:
        reference = train_single_process(x, y)
        diff = float(np.max(np.abs(w - reference)))
        if not np.allclose(w, reference):
            raise AssertionError(f"elastic weights differ from the single-process ones by {diff:g}")
        restarts = os.environ.get("AIODIST_RESTART_COUNT", "0")
        print(f"world size {aiodist.get_world_size()}, resumed at step {resumed}, restart {restarts}, "
              f"{recoveries} in-place recoveries: loss {loss:.4f}, accuracy {accuracy:.3f}")
        print(f"OK: weights equal the single-process reference (max abs diff {diff:.2e})")
    return {"loss": loss, "accuracy": accuracy, "resumed": float(resumed), "recoveries": float(recoveries)}


async def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    x, y = make_data()
    if args.rejoin:
        return await main_rejoin(args, x, y)
    await aiodist.init_process_group(timeout=60)
    original_rank, world = aiodist.get_rank(), aiodist.get_world_size()
    members = list(range(world))  # original ranks of the current group, in its rank order
    recoveries = 0
    try:
        while True:
            try:
                resumed, w = await train(args, x, y, original_rank)
                break
            except PeerFailureError as e:
                if not args.shrink or e.global_rank is None or e.global_rank == 0:
                    raise  # the launcher restarts the job (--max-restarts) or reports it
                dead = members[e.global_rank]
                members.remove(dead)
                recoveries += 1
                print(f"rank {original_rank}: rank {dead} failed ({e.how}); going on with {len(members)} ranks",
                      flush=True)
                await abort()
                await aiodist.init_process_group(rank=members.index(original_rank), world_size=len(members),
                                                 timeout=60)
        return await _report(w, x, y, resumed, recoveries)
    finally:
        if aiodist.is_initialized():
            await aiodist.destroy_process_group()


if __name__ == "__main__":
    aiodist.run(main())
