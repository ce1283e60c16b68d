"""The cost of the careful (shifted-data) pass and of its constant-group check on CPU.

Usage::

    taskset -c 0 python benchmarks/careful_pass.py

Times, jitted, in process CPU time (median of 15 calls), float32 (128, 32, 32, 64): BatchNorm on ordinary
data (one pass: the anchor), with ``use_fast_variance=False`` (the careful pass on every call), with one
constant channel (the careful pass and the constant-group check, ``moments.shifted_pass``), and
last-axis LayerNorm with a mask (the careful pass on every call); each also as a ratio to the anchor.
Results in ``docs/benchmarks.md`` ("Constant groups recognized").
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm.functional as F


def median_ms(fn, x, repeats: int = 15) -> float:
    for _ in range(3):
        fn(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn(x).block_until_ready()
        times.append(time.process_time() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    x = jax.random.normal(jax.random.key(0), (128, 32, 32, 64))
    mask = jnp.ones(x.shape, bool).at[..., 3].set(False)
    cases = {
        "BatchNorm, ordinary data (anchor)": (lambda a: F.batch_norm(a), x),
        "BatchNorm, use_fast_variance=False": (lambda a: F.batch_norm(a, use_fast_variance=False), x),
        "BatchNorm, one constant channel": (lambda a: F.batch_norm(a), x.at[..., 0].set(12345.678)),
        "LayerNorm last axis, masked": (lambda a: F.layer_norm(a, mask=mask), x),
    }
    anchor = None
    print("| case | ms | / anchor |\n|---|---|---|")
    for name, (fn, data) in cases.items():
        ms = median_ms(jax.jit(fn), data)
        anchor = anchor or ms
        print(f"| {name} | {ms:.2f} | {ms / anchor:.2f} |")


if __name__ == "__main__":
    main()
