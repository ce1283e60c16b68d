"""What a normalization's forward pass costs at the least on this backend, in copies of its input.

Usage::

    python benchmarks/floor.py [--shapes 128x32x32x64,64x16x16x256] [--dtypes float32,bfloat16]
                               [--clock wall|cpu] [--repeats N]

Issue 2 holds every forward pass to at most 2x a copy of the input (``benchmarks/norms.py``). This
script times, in alternation with that copy (``x + zero``, one read and one write), the parts that any
normalization's forward is made of, written as plainly as XLA takes them:

- ``output``: the output pass alone, ``(x - a) * b + c`` with per-channel ``a, b, c`` computed in
  float32 and cast back to the input's dtype (one read, one write, no statistics);
- ``sum``: one per-channel reduction, ``sum x`` over N, H, W in float32 (one read);
- ``sums``: the two reductions of a batch norm, ``sum x`` and ``sum x^2``;
- ``sums_one_pass``: the same two sums in a single reduction over ``x`` (the pair stacked on a trailing
  axis), the form that would read ``x`` once; XLA:CPU's fast reductions take one plain operand, so this
  is the fastest single-pass form there is (a variadic ``lax.reduce``, a complex sum or a concatenation
  are slower still), and it shows why a batch norm reads ``x`` three times on this backend;
- ``floor``: ``sums`` then ``output`` in one function: a batch norm with nothing but the necessary work,
  the cheapest forward that computes statistics and normalizes with them;
- ``floor_separate``: the same, each of the three passes reading its own alias of ``x`` (an
  optimization barrier), so that XLA widens a low-precision ``x`` inside each pass instead of writing one
  shared float32 widening to memory (jaxnorm's statistics do this; identical to ``floor`` in float32);
- ``floor_l1``: the same for L1 batch norm (Hoffer et al. 2018, Sec. 3): ``sum x``, then
  ``sum |x - mean|`` (a second reduction that needs the mean), then the output pass, each reading its
  own alias of ``x`` as ``floor_separate``. The last column, ``floor_l1/floor_separate``, is the least
  that L1 batch norm can cost against the L2 floor with the same reads (equal to ``floor`` in float32,
  where flax's BatchNorm sits at that floor): it bounds issue 2's "L1 <= 1.15x flax" from below.

If ``output`` or ``floor`` is above 2x the copy, the copy target is out of reach for every normalization
on that backend and dtype, whatever its implementation. ``--clock`` and the malloc settings are those of
``benchmarks/norms.py`` (``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

import jax
import jax.numpy as jnp
from _timing import CLOCKS, machine_lines, paired_ratio, time_interleaved
from norms import DTYPES, MALLOC_REUSE, SHAPES, parse_dtypes, parse_shapes, shape_text

REPEATS = 15
AXES = (0, 1, 2)


def _copy(x, zero):
    return x + zero


def _output(x, shift, scale, bias):
    return ((x.astype(jnp.float32) - shift) * scale + bias).astype(x.dtype)


def _sum(x):
    return jnp.sum(x.astype(jnp.float32), AXES)


def _sums(x):
    values = x.astype(jnp.float32)
    return jnp.sum(values, AXES), jnp.sum(values * values, AXES)


def _sums_one_pass(x):
    values = x.astype(jnp.float32)
    return jnp.sum(jnp.stack([values, values * values], axis=-1), AXES)


def _three_reads(x, separate: bool):
    """``x`` for each of a forward's three passes; ``separate``: three aliases (an optimization barrier),
    so that a low-precision ``x`` is widened inside each pass."""
    reads = (x, x, x)
    return jax.lax.optimization_barrier(reads) if separate and x.dtype != jnp.float32 else reads


def _floor(x, scale, bias, *, separate: bool):
    """Batch norm doing only the necessary work; ``separate``: each pass reads its own alias of ``x``."""
    for_sum, for_squares, for_output = _three_reads(x, separate)
    n = math.prod(x.shape[a] for a in AXES)
    mean = _sum(for_sum) / n
    squares = jnp.sum(jnp.square(for_squares.astype(jnp.float32)), AXES)
    inv = jax.lax.rsqrt(jnp.maximum(squares / n - mean * mean, 0) + 1e-5)
    return _output(for_output, mean, inv * scale, bias)


def _floor_l1(x, scale, bias):
    """L1 batch norm doing only the necessary work, each pass reading its own alias of ``x`` (its
    deviations centred on their own copy of the mean)."""
    for_sum, for_deviations, for_output = _three_reads(x, separate=True)
    n = math.prod(x.shape[a] for a in AXES)
    mean = _sum(for_sum) / n
    # the deviations centre on their own copy of the mean: with the mean shared with the output pass,
    # XLA writes the broadcast mean to memory (jaxnorm's stats._distinct)
    centre = jax.lax.optimization_barrier(mean)
    deviation = jnp.sum(jnp.abs(for_deviations.astype(jnp.float32) - centre), AXES) / n
    inv = 1 / (math.sqrt(math.pi / 2) * deviation + 1e-5)
    return _output(for_output, mean, inv * scale, bias)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                        help="comma-separated NxHxWxC input shapes (default: 128x32x32x64,64x16x16x256)")
    parser.add_argument("--dtypes", type=parse_dtypes, default=DTYPES,
                        help="comma-separated input dtypes (default: float32,bfloat16)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall (default) or cpu: process CPU time, pinned to one core (see norms.py)")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"samples per candidate (default {REPEATS})")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if any(os.environ.get(k) != v for k, v in MALLOC_REUSE.items()):
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv],
                  {**os.environ, **MALLOC_REUSE})
    if args.clock == "cpu":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    timing_kw = {"repeats": args.repeats, "warmup": 2, "min_sample_seconds": 0.01,
                 "clock": CLOCKS[args.clock]}
    for line in machine_lines([f"timing: {args.clock} clock; {args.repeats} interleaved repeats"]):
        print(line)
    print()
    names = ("output", "sum", "sums", "sums_one_pass", "floor", "floor_separate", "floor_l1")
    columns = [f"{n}/copy" for n in names] + ["floor_l1/floor_separate"]
    print("| shape | dtype | copy ms | " + " | ".join(columns) + " | noise |")
    print("|---|---|---|" + "---|" * len(columns) + "---|")
    copy, output, total, totals, totals_one_pass = map(jax.jit, (_copy, _output, _sum, _sums, _sums_one_pass))
    floor = jax.jit(functools.partial(_floor, separate=False))
    floor_separate = jax.jit(functools.partial(_floor, separate=True))
    floor_l1 = jax.jit(_floor_l1)
    for shape in args.shapes:
        for dtype in args.dtypes:
            x = (1.0 + 2.0 * jax.random.normal(jax.random.key(math.prod(shape)), shape)).astype(dtype)
            channel = jnp.linspace(0.5, 1.5, shape[-1], dtype=jnp.float32)
            zero = jnp.zeros((), x.dtype)
            t = time_interleaved({
                "copy": lambda x=x, zero=zero: copy(x, zero),
                "output": lambda x=x, c=channel: output(x, c, c, c),
                "sum": lambda x=x: total(x),
                "sums": lambda x=x: totals(x),
                "sums_one_pass": lambda x=x: totals_one_pass(x),
                "floor": lambda x=x, c=channel: floor(x, c, c),
                "floor_separate": lambda x=x, c=channel: floor_separate(x, c, c),
                "floor_l1": lambda x=x, c=channel: floor_l1(x, c, c),
            }, **timing_kw)
            ratios = " | ".join(f"{paired_ratio(t[n], t['copy']):.2f}" for n in names)
            ratios += f" | {paired_ratio(t['floor_l1'], t['floor_separate']):.2f}"
            noise = max(v.spread for v in t.values())
            copy_ms = t["copy"].median * 1e3
            print(f"| {shape_text(shape)} | {dtype} | {copy_ms:.2f} | {ratios} | ±{noise:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
