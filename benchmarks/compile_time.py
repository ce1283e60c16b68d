"""Compile time of networks built from jaxnorm's linen normalization layers against the same networks built
from flax.linen's.

Usage::

    python benchmarks/compile_time.py [--depth 12] [--repeats 5] [--rows 'BatchNorm p=2,LayerNorm']

Every row is a stack of ``depth`` blocks ``Conv(3x3, 32) -> norm -> relu`` on a ``(8, 16, 16, 32)`` float32
input, the norm taken from ``norms.ROWS`` (jaxnorm's module in one network, its flax counterpart in the
other; batch norm in training mode with mutable ``batch_stats``). Two programs per network: *fwd* (the
forward pass) and *grad* (``jax.grad`` of the mean output with respect to the params, what a training step
compiles). Each sample traces, lowers and compiles the program from scratch (a new function object, the
persistent compilation cache off), timed in alternation by ``_timing.time_interleaved``; the table
gives the median seconds of each and the median of the per-repeat ratios ``ours / flax``. Compilation is
single-threaded per program on XLA:CPU, so wall time is the measure.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import flax.linen as fnn
import jax
import jax.numpy as jnp
import norms
from _timing import machine_lines, paired_ratio, time_interleaved

INPUT_SHAPE = (8, 16, 16, 32)
DEPTH = 12
REPEATS = 5


def stack(norm: Callable[[], fnn.Module], depth: int) -> fnn.Module:
    """``depth`` blocks ``Conv -> norm -> relu``."""

    class Stack(fnn.Module):
        @fnn.compact
        def __call__(self, x):
            for _ in range(depth):
                x = fnn.relu(norm()(fnn.Conv(INPUT_SHAPE[-1], (3, 3))(x)))
            return jnp.mean(x)

    return Stack()


def programs(model: fnn.Module, x: jax.Array) -> dict[str, Callable[[], None]]:
    """Name -> a callable that traces, lowers and compiles that program anew."""
    variables = model.init(jax.random.key(0), x)

    def apply(params):
        return model.apply({**variables, "params": params}, x, mutable=["batch_stats"])[0]

    def compiles(make: Callable[[], Callable]) -> Callable[[], None]:
        def run() -> None:
            jax.jit(make()).lower(variables["params"]).compile()

        return run

    # a new function object per sample: nothing is reused from JAX's tracing or compilation caches
    fresh = lambda: lambda p: apply(p)
    return {"fwd": compiles(fresh), "grad": compiles(lambda: jax.grad(fresh()))}


def bench_row(row: norms.Row, depth: int, repeats: int) -> list[str]:
    x = jax.random.normal(jax.random.key(1), INPUT_SHAPE)
    ours = programs(stack(lambda: row.ours(jnp.float32), depth), x)
    flax = programs(stack(lambda: row.flax(jnp.float32), depth), x)
    lines = []
    for kind in ours:
        # one compilation per sample (min_sample_seconds=0), after an untimed warm-up (imports, first use)
        timings = time_interleaved({"ours": ours[kind], "flax": flax[kind]}, repeats=repeats, warmup=1,
                                   min_sample_seconds=0.0)
        ratio = paired_ratio(timings["ours"], timings["flax"])
        lines.append(f"| {row.name} | {kind} | {timings['ours'].median:.2f} | {timings['flax'].median:.2f} "
                     f"| {ratio:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=DEPTH, help=f"blocks per network (default {DEPTH})")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"samples per program (default {REPEATS})")
    parser.add_argument("--rows", type=norms.parse_rows, default=norms.ROWS,
                        help="comma-separated row names of norms.py (default: all)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    jax.config.update("jax_enable_compilation_cache", False)
    programs_line = (f"programs: {args.depth} x (Conv 3x3 -> norm -> relu) on {INPUT_SHAPE} float32; "
                     f"{args.repeats} alternating samples of trace + lower + compile")
    for line in machine_lines([programs_line]):
        print(line)
    print()
    print("| layer | program | ours (s) | flax (s) | ours / flax |")
    print("|---|---|---|---|---|")
    start = time.perf_counter()
    for row in args.rows:
        for line in bench_row(row, args.depth, args.repeats):
            print(line, flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
