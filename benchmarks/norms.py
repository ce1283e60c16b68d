"""Speed of jaxnorm's linen normalization layers against flax.linen's and against a copy of the input.

Usage::

    python benchmarks/norms.py [--quick] [--shapes 128x32x32x64,64x16x16x256] [--dtypes float32,bfloat16]
                               [--clock wall|cpu] [--malloc reuse|default] [--repeats N]

For every shape, dtype and layer, three jitted candidates are timed in alternation (``_timing.py``):
the jaxnorm module, its flax.linen equivalent, and a copy of the input (``x + zero`` with ``zero`` a
runtime scalar, so XLA cannot elide it: one read and one write of ``x``, the memory-bandwidth floor).
Three passes: *fwd* (``module.apply``; batch norm in training mode, returning the new ``batch_stats``),
*fwd+bwd* (``jax.grad`` of ``sum(y * cotangent)`` with respect to the params and ``x``, plus the new
``batch_stats``), and *fwd+bwd x*, the same gradient with respect to ``x`` alone (what a layer that is
not the last differentiates when its params are frozen, and a different program for XLA). Modules are
built with ``dtype`` equal to the input's, so bf16 in gives bf16 out
(statistics in float32 in both libraries). Ratios are medians of per-repeat ratios; the targets of
issue 2 are checked and marked PASS / FAIL. The output is a Markdown table. ``--clock cpu`` and
``--malloc`` are explained in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable

import flax.linen as fnn
import jax
import jax.numpy as jnp
from _timing import (
    CLOCKS,
    Timing,
    machine_lines,
    paired_ratio,
    parse_row_names,
    positive_count,
    time_interleaved,
)

import jaxnorm.nn as jnn

SHAPES = ((128, 32, 32, 64), (64, 16, 16, 256))
DTYPES = ("float32", "bfloat16")
REPEATS = 15
QUICK_SHAPE, QUICK_DTYPE, QUICK_REPEATS = (64, 16, 16, 256), "float32", 5
FORWARD_COPY_TARGET = 2.0
"""Every forward pass must take at most this many times a copy of its input."""

MALLOC_REUSE = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}
"""glibc settings under which freed buffers are reused rather than handed back to the kernel. With glibc's
defaults, a buffer over 32 MiB (a float32 128x32x32x64 tensor is 32.5 MiB), or one allocated by an XLA
worker thread in its own arena, is fresh memory on every call, and its page faults cost several times
the normalization itself (a copy of that tensor: about 15 ms against 2.4 ms with reuse, on the 2-core
benchmark machine), which hides the differences between implementations."""

ModuleFactory = Callable[[jnp.dtype], fnn.Module]


@dataclasses.dataclass(frozen=True)
class Row:
    """One comparison: a jaxnorm module, its flax counterpart and the targets on ``ours / flax``.

    Attributes:
      name: label in the table.
      ours: dtype -> jaxnorm.nn module.
      flax: dtype -> flax.linen module.
      batch_stats: whether the module keeps running statistics (training mode, mutable ``batch_stats``).
      forward_target: upper bound on the forward ``ours / flax`` ratio, or None.
      train_target: upper bound on the forward+backward ``ours / flax`` ratio, or None.
    """

    name: str
    ours: ModuleFactory
    flax: ModuleFactory
    batch_stats: bool = False
    forward_target: float | None = None
    train_target: float | None = None


def _bn(**kw) -> ModuleFactory:
    return lambda dtype: jnn.BatchNorm(use_running_average=False, dtype=dtype, **kw)


def _flax_bn(dtype) -> fnn.Module:
    return fnn.BatchNorm(use_running_average=False, dtype=dtype)


ROWS = (
    Row("BatchNorm p=2", _bn(), _flax_bn, True, 1.0, 1.0),
    Row("BatchNorm p=1", _bn(p=1), _flax_bn, True, 1.15, 1.15),
    Row("BatchNorm p=inf", _bn(p="inf"), _flax_bn, True, 1.15, 1.15),
    Row("BatchNorm p=inf topk=10", _bn(p="inf", topk=10), _flax_bn, True),
    Row("GroupNorm G=32", lambda d: jnn.GroupNorm(num_groups=32, dtype=d),
        lambda d: fnn.GroupNorm(num_groups=32, dtype=d), False, 0.4, 0.6),
    Row("LayerNorm", lambda d: jnn.LayerNorm(dtype=d), lambda d: fnn.LayerNorm(dtype=d), False, 1.0, 1.0),
    Row("LayerNorm axes", lambda d: jnn.LayerNorm(reduction_axes=(1, 2, 3), dtype=d),
        lambda d: fnn.LayerNorm(reduction_axes=(1, 2, 3), dtype=d), False, 1.10, 1.10),
    Row("InstanceNorm", lambda d: jnn.InstanceNorm(dtype=d), lambda d: fnn.InstanceNorm(dtype=d), False,
        1.10, 1.10),
    Row("RMSNorm", lambda d: jnn.RMSNorm(dtype=d), lambda d: fnn.RMSNorm(dtype=d), False, 1.10, 1.10),
)


@dataclasses.dataclass(frozen=True)
class Result:
    """Timings of one row, shape, dtype and pass, and the verdict on its targets."""

    shape: tuple[int, ...]
    dtype: str
    row: str
    kind: str
    ours: Timing
    flax: Timing
    copy: Timing
    vs_flax: float
    vs_copy: float
    flax_vs_copy: float
    flax_target: float | None
    copy_target: float | None

    @property
    def failures(self) -> list[str]:
        """The targets this result misses, as text."""
        missed = []
        if self.flax_target is not None and self.vs_flax > self.flax_target:
            missed.append(f"{self.vs_flax:.2f}x flax > {self.flax_target:g}x")
        if self.copy_target is not None and self.vs_copy > self.copy_target:
            missed.append(f"{self.vs_copy:.2f}x copy > {self.copy_target:g}x")
        return missed

    @property
    def verdict(self) -> str:
        if self.flax_target is None and self.copy_target is None:
            return "—"
        return "FAIL" if self.failures else "PASS"


def passes(module: fnn.Module, batch_stats: bool) -> tuple[Callable, Callable, Callable]:
    """Jitted ``forward(variables, x)``, ``train(variables, x, cotangent)`` (gradient with respect to the
    params and ``x``) and ``input_gradient(variables, x, cotangent)`` (with respect to ``x`` alone) of
    ``module``."""
    mutable = ["batch_stats"] if batch_stats else False

    def forward(variables, x):
        return module.apply(variables, x, mutable=mutable)

    def loss(params, x, state, cotangent):
        out = module.apply({"params": params, **state}, x, mutable=mutable)
        y, updates = out if batch_stats else (out, {})
        return jnp.sum(y * cotangent, dtype=jnp.float32), updates

    grad = jax.grad(loss, argnums=(0, 1), has_aux=True)
    grad_x = jax.grad(loss, argnums=1, has_aux=True)

    def train(variables, x, cotangent):
        state = {k: v for k, v in variables.items() if k != "params"}
        return grad(variables["params"], x, state, cotangent)

    def input_gradient(variables, x, cotangent):
        state = {k: v for k, v in variables.items() if k != "params"}
        return grad_x(variables["params"], x, state, cotangent)

    return jax.jit(forward), jax.jit(train), jax.jit(input_gradient)


def _copy(x, zero):
    return x + zero


def bench_row(row: Row, x: jnp.ndarray, cotangent: jnp.ndarray, timing_kw: dict) -> list[Result]:
    """Time forward and forward+backward of ``row`` on ``x`` against flax and the copy."""
    copy = jax.jit(_copy)
    zero = jnp.zeros((), x.dtype)
    candidates = {}
    for side, factory in (("ours", row.ours), ("flax", row.flax)):
        module = factory(x.dtype)
        variables = module.init(jax.random.key(0), x)
        forward, train, input_gradient = passes(module, row.batch_stats)
        candidates[side] = (
            lambda f=forward, v=variables: f(v, x),
            lambda f=train, v=variables: f(v, x, cotangent),
            lambda f=input_gradient, v=variables: f(v, x, cotangent),
        )
    results = []
    kinds = (
        ("fwd", row.forward_target, FORWARD_COPY_TARGET),
        ("fwd+bwd", row.train_target, None),
        ("fwd+bwd x", row.train_target, None),
    )
    for index, (kind, flax_target, copy_target) in enumerate(kinds):
        t = time_interleaved(
            {"ours": candidates["ours"][index], "flax": candidates["flax"][index],
             "copy": lambda: copy(x, zero)},
            **timing_kw,
        )
        results.append(Result(
            tuple(x.shape), jnp.dtype(x.dtype).name, row.name, kind, t["ours"], t["flax"], t["copy"],
            paired_ratio(t["ours"], t["flax"]), paired_ratio(t["ours"], t["copy"]),
            paired_ratio(t["flax"], t["copy"]), flax_target, copy_target,
        ))
    return results


def _target_text(result: Result) -> str:
    parts = []
    if result.flax_target is not None:
        parts.append(f"≤{result.flax_target:g}x flax")
    if result.copy_target is not None:
        parts.append(f"≤{result.copy_target:g}x copy")
    return ", ".join(parts) or "—"


HEADER = ("| shape | dtype | layer | pass | ours ms | flax ms | copy ms | ours/flax | ours/copy | flax/copy "
          "| noise | target | verdict |")


def format_row(r: Result) -> str:
    """One Markdown table line; ``noise`` is the largest relative half-IQR of the three candidates."""
    noise = max(r.ours.spread, r.flax.spread, r.copy.spread)
    return (
        f"| {shape_text(r.shape)} | {r.dtype} | {r.row} | {r.kind} "
        f"| {r.ours.median * 1e3:.2f} | {r.flax.median * 1e3:.2f} | {r.copy.median * 1e3:.2f} "
        f"| {r.vs_flax:.2f} | {r.vs_copy:.2f} | {r.flax_vs_copy:.2f} | ±{noise:.0%} | {_target_text(r)} "
        f"| {r.verdict} |"
    )


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def parse_shapes(text: str) -> tuple[tuple[int, ...], ...]:
    try:
        shapes = tuple(tuple(int(d) for d in s.split("x")) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated NxHxWxC shapes like 128x32x32x64, got {text!r}"
        ) from None
    for shape in shapes:
        if len(shape) != 4 or min(shape) < 1 or shape[-1] % 32:
            raise argparse.ArgumentTypeError(
                f"each shape must be 4 positive sizes NxHxWxC with C divisible by 32 "
                f"(GroupNorm uses 32 groups), got {shape}"
            )
    return shapes


def parse_dtypes(text: str) -> tuple[str, ...]:
    dtypes = tuple(text.split(","))
    for d in dtypes:
        if d not in ("float32", "bfloat16", "float16"):
            raise argparse.ArgumentTypeError(f"expected float32, bfloat16 or float16, got {d!r}")
    return dtypes


def parse_rows(text: str) -> tuple[Row, ...]:
    by_name = {row.name: row for row in ROWS}
    return tuple(by_name[name] for name in parse_row_names(text, list(by_name)))


def bench_inputs(shape: tuple[int, ...], dtype) -> tuple[jax.Array, jax.Array]:
    """The input (mean 1, std 2) and the cotangent every layer is timed on, seeded by the shape."""
    kx, kc = jax.random.split(jax.random.key(math.prod(shape)))
    x = (1.0 + 2.0 * jax.random.normal(kx, shape)).astype(dtype)
    return x, jax.random.normal(kc, shape).astype(dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run under a minute: {shape_text(QUICK_SHAPE)} {QUICK_DTYPE} only "
                             f"(unless --shapes / --dtypes say otherwise), {QUICK_REPEATS} repeats")
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help="comma-separated NxHxWxC input shapes (default: 128x32x32x64,64x16x16x256)")
    parser.add_argument("--dtypes", type=parse_dtypes, default=None,
                        help="comma-separated input dtypes (default: float32,bfloat16)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall: elapsed time (default). cpu: process CPU time, the process pinned to one "
                             "core so XLA runs one thread; stable on a machine shared with other jobs")
    parser.add_argument("--malloc", choices=("reuse", "default"), default="reuse",
                        help="reuse (default): re-run this script under the glibc settings of MALLOC_REUSE "
                             "(MALLOC_ARENA_MAX=1, large mmap and trim thresholds) so large buffers are "
                             "reused: kernel time, not page faults. default: glibc's settings")
    parser.add_argument("--sync", choices=("call", "sample"), default=None,
                        help="call: block on every call (the default on CPU); sample: block on a sample's "
                             "last call only, so a GPU / TPU runs the calls back to back and the host's "
                             "per-call dispatch latency is not timed (the default there)")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"samples per candidate (default: {QUICK_REPEATS} with --quick, else {REPEATS})")
    parser.add_argument("--rows", type=parse_rows, default=ROWS,
                        help="comma-separated row names to run, exact (default: all): "
                             + ", ".join(repr(r.name) for r in ROWS))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.malloc == "reuse" and any(os.environ.get(k) != v for k, v in MALLOC_REUSE.items()):
        # glibc reads these at process start: run this script again under them
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv],
                  {**os.environ, **MALLOC_REUSE})
    shapes = args.shapes or ((QUICK_SHAPE,) if args.quick else SHAPES)
    dtypes = args.dtypes or ((QUICK_DTYPE,) if args.quick else DTYPES)
    repeats = positive_count(parser, "--repeats", args.repeats, QUICK_REPEATS if args.quick else REPEATS)
    if args.clock == "cpu":  # before the backend starts (first computation): XLA then runs one thread
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sync = args.sync or ("call" if jax.default_backend() == "cpu" else "sample")
    timing_kw = {"repeats": repeats, "warmup": 1 if args.quick else 2, "min_sample_seconds": 0.01,
                 "clock": CLOCKS[args.clock], "block_each": sync == "call"}
    clock = "wall time" if args.clock == "wall" else "process CPU time, pinned to one core (one XLA thread)"
    clock += "; blocked on every call" if sync == "call" else "; blocked once per sample"
    malloc = ", ".join(f"{k}={os.environ[k]}" for k in MALLOC_REUSE if k in os.environ) or "glibc defaults"
    for line in machine_lines([f"timing: {clock}; {repeats} interleaved repeats (ours, flax, copy), "
                               f"samples of >= {timing_kw['min_sample_seconds'] * 1e3:g} ms",
                               f"malloc: {malloc}"]):
        print(line)
    print()
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    start = time.perf_counter()
    results = []
    for shape in shapes:
        for dtype in dtypes:
            x, cotangent = bench_inputs(shape, dtype)
            for row in args.rows:
                for result in bench_row(row, x, cotangent, timing_kw):
                    results.append(result)
                    print(format_row(result), flush=True)
    failed = [r for r in results if r.failures]
    checked = [r for r in results if r.verdict != "—"]
    print()
    print(f"{len(checked) - len(failed)}/{len(checked)} checked lines PASS "
          f"({time.perf_counter() - start:.0f} s)")
    for r in failed:
        print(f"FAIL {shape_text(r.shape)} {r.dtype} {r.row} {r.kind}: {'; '.join(r.failures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
