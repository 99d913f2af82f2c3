"""Data-parallel training of a logistic regression, checked against one-process training.

    aiodist run -n 4 examples/train_dp.py          # 4 processes over TCP
    python -m sim run -n 4 examples/train_dp.py    # 4 virtual ranks in one process

Every rank generates the same synthetic data set from a fixed seed, takes its
equal-sized shard, and per step computes the mean gradient of the log-loss on
its shard; ``all_reduce(grad, op=AVG)`` turns the shard means into the mean
over the whole data set (the shards are equal-sized), so every rank applies the
full-batch gradient step. At the end the ranks check that they hold identical
weights, and rank 0 checks that they equal (``np.allclose``) the weights of the
same training run in one process without any communication.

``main()`` returns a dict with the final loss and accuracy (what the simulator
reports as the rank's result); a mismatch raises, failing the rank.
"""

from __future__ import annotations

import numpy as np

import aiodist

SEED = 20240611
N_SAMPLES = 5040  # divisible by every world size from 1 to 10
N_FEATURES = 16
STEPS = 100
LEARNING_RATE = 0.5


def make_data(seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """The full data set: features with a bias column, and 0/1 labels from a noisy linear model."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_SAMPLES, N_FEATURES))
    x = np.hstack([x, np.ones((N_SAMPLES, 1))])
    true_w = rng.normal(size=N_FEATURES + 1)
    p = 1.0 / (1.0 + np.exp(-(x @ true_w)))
    y = (rng.random(N_SAMPLES) < p).astype(np.float64)
    return x, y


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mean gradient of the log-loss over the rows of ``x``."""
    return x.T @ (sigmoid(x @ w) - y) / len(y)


def loss_and_accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    p = np.clip(sigmoid(x @ w), 1e-12, 1 - 1e-12)
    loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    accuracy = float(np.mean((p > 0.5) == (y == 1.0)))
    return loss, accuracy


def train_single_process(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The reference: full-batch gradient descent in one process."""
    w = np.zeros(x.shape[1])
    for _ in range(STEPS):
        w -= LEARNING_RATE * gradient(w, x, y)
    return w


async def main() -> dict[str, float]:
    await aiodist.init_process_group()
    try:
        rank, world = aiodist.get_rank(), aiodist.get_world_size()
        if N_SAMPLES % world:
            raise ValueError(f"{N_SAMPLES} samples cannot be split into {world} equal shards")
        x, y = make_data()
        shard = N_SAMPLES // world
        xs, ys = x[rank * shard : (rank + 1) * shard], y[rank * shard : (rank + 1) * shard]

        w = np.zeros(x.shape[1])
        for _ in range(STEPS):
            grad = gradient(w, xs, ys)
            await aiodist.all_reduce(grad, op=aiodist.ReduceOp.AVG)
            w -= LEARNING_RATE * grad

        # Every rank must hold bit-identical weights: the element-wise max and min agree.
        hi, lo = w.copy(), w.copy()
        await aiodist.all_reduce(hi, op=aiodist.ReduceOp.MAX)
        await aiodist.all_reduce(lo, op=aiodist.ReduceOp.MIN)
        if not np.array_equal(hi, lo):
            raise AssertionError(f"rank {rank}: the ranks' weights differ (max spread {np.max(hi - lo):g})")

        loss, accuracy = loss_and_accuracy(w, x, y)
        if rank == 0:
            reference = train_single_process(x, y)
            diff = float(np.max(np.abs(w - reference)))
            if not np.allclose(w, reference):
                raise AssertionError(f"data-parallel weights differ from the single-process ones by {diff:g}")
            print(f"world size {world}, {STEPS} steps: loss {loss:.4f}, accuracy {accuracy:.3f}")
            print(f"OK: weights equal the single-process reference (max abs diff {diff:.2e})")
        return {"loss": loss, "accuracy": accuracy}
    finally:
        await aiodist.destroy_process_group()
