"""Fault-tolerant data-parallel training: checkpoints, a rank killed mid-run, and the correct model anyway.

    # the launcher restarts the whole job after a failure; it resumes from the last checkpoint
    aiodist run -n 4 --max-restarts 2 examples/elastic_train.py --ckpt-dir /tmp/ckpt

    # the same, with rank 2 killing itself (SIGKILL) at step 37 of the first attempt
    ELASTIC_KILL=2@37 aiodist run -n 4 --max-restarts 1 examples/elastic_train.py --ckpt-dir /tmp/ckpt

    # no restart: the survivors abort, rendezvous again as 3 ranks in the same processes, and go on
    # (--on-failure continue: the launcher lets them; it reports rank 2's death at the end, exit status 137)
    ELASTIC_KILL=2@37 aiodist run -n 4 --on-failure continue examples/elastic_train.py --ckpt-dir /tmp/ckpt --shrink

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
last checkpoint and continues. Either way the final weights must equal the
single-process reference (rank 0 checks; a mismatch raises).

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


async def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    x, y = make_data()
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
        rank = aiodist.get_rank()
        loss, accuracy = loss_and_accuracy(w, x, y)
        if rank == 0:
            reference = train_single_process(x, y)
            diff = float(np.max(np.abs(w - reference)))
            if not np.allclose(w, reference):
                raise AssertionError(f"elastic weights differ from the single-process ones by {diff:g}")
            restarts = os.environ.get("AIODIST_RESTART_COUNT", "0")
            print(f"world size {aiodist.get_world_size()}, resumed at step {resumed}, restart {restarts}, "
                  f"{recoveries} in-place recoveries: loss {loss:.4f}, accuracy {accuracy:.3f}")
            print(f"OK: weights equal the single-process reference (max abs diff {diff:.2e})")
        return {"loss": loss, "accuracy": accuracy, "resumed": float(resumed), "recoveries": float(recoveries)}
    finally:
        if aiodist.is_initialized():
            await aiodist.destroy_process_group()


if __name__ == "__main__":
    aiodist.run(main())
