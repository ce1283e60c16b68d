"""Eager calls (no ``jit``, as in a notebook): jaxnorm's linen layers against flax's, per call.

Usage::

    python benchmarks/eager.py [--shape 64x8] [--image 2x8x8x16] [--repeats N] [--clock wall|cpu]

Each layer's ``apply`` (with ``mutable=["batch_stats"]`` for batch norm; pass ``fwd``) and its gradient
w.r.t. the params and the input (``jax.grad`` of ``sum(y * cotangent)``; pass ``fwd+bwd``) are called
outside any ``jit`` on a small input, after warm-up calls that compile, and timed in alternation with the
flax layer of the same kind (the anchor, L2 for jaxnorm's L1 / L∞ rows). The statistics'
data-dependent branches are compiled once per shape and options (``jaxnorm.functional.eager``);
without that, every eager call re-traced and re-compiled them. Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os

import flax.linen as fnn
import jax
import jax.numpy as jnp
from _timing import CLOCKS, machine_lines, paired_ratio, parse_row_names, positive_count, time_interleaved
from norms import shape_text

import jaxnorm.nn as jn


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split("x"))


def _eager_apply(module, x):
    variables = module.init(jax.random.key(0), x)
    return lambda: module.apply(variables, x, mutable=["batch_stats"])[0]


def _eager_grad(module, x):
    """The gradient of ``sum(y * cotangent)`` w.r.t. the params and ``x``, without ``jit``."""
    variables = module.init(jax.random.key(0), x)
    cotangent = jax.random.normal(jax.random.key(3), x.shape)

    def loss(params, x):
        y, _ = module.apply({**variables, "params": params}, x, mutable=["batch_stats"])
        return jnp.sum(y * cotangent)

    grad = jax.grad(loss, argnums=(0, 1))
    return lambda: grad(variables["params"], x)


PASSES = {"fwd": _eager_apply, "fwd+bwd": _eager_grad}


def rows(vector, image):
    """(name, jaxnorm layer, flax anchor, input)."""
    bn = dict(use_running_average=False)
    return [
        ("BatchNorm", jn.BatchNorm(**bn), fnn.BatchNorm(**bn), vector),
        ("BatchNorm p=1", jn.BatchNorm(p=1, **bn), fnn.BatchNorm(**bn), vector),
        ("BatchNorm p=inf", jn.BatchNorm(p="inf", **bn), fnn.BatchNorm(**bn), vector),
        ("LayerNorm", jn.LayerNorm(), fnn.LayerNorm(), image),
        ("GroupNorm", jn.GroupNorm(num_groups=4), fnn.GroupNorm(num_groups=4), image),
        ("InstanceNorm", jn.InstanceNorm(), fnn.InstanceNorm(), image),
        ("RMSNorm", jn.RMSNorm(), fnn.RMSNorm(), image),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="64x8", help="batch-norm input, e.g. 64x8")
    parser.add_argument("--image", default="2x8x8x16", help="per-example norms' input (NHWC)")
    parser.add_argument("--repeats", type=int, default=None, help="samples per row (default 7)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    known = [name for name, *_ in rows(None, None)]
    parser.add_argument("--rows", type=lambda text: parse_row_names(text, known), default=tuple(known),
                        help="comma-separated row names to run, exact (default: all)")
    args = parser.parse_args()
    args.repeats = positive_count(parser, "--repeats", args.repeats, 7)
    if args.clock == "cpu":  # before the backend starts (first computation): XLA then runs one thread
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    vector = jax.random.normal(jax.random.key(1), _shape(args.shape)) * 3 + 1
    image = jax.random.normal(jax.random.key(2), _shape(args.image))
    print("\n".join(machine_lines([f"eager calls, clock {args.clock}, repeats {args.repeats}"])))
    print("\n| layer | input | pass | jaxnorm ms | flax ms | jaxnorm/flax |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, ours, anchor, x in (row for row in rows(vector, image) if row[0] in args.rows):
        for pass_name, candidate in PASSES.items():
            timings = time_interleaved(
                {"ours": candidate(ours, x), "flax": candidate(anchor, x)},
                repeats=args.repeats,
                clock=CLOCKS[args.clock],
            )
            ms = {k: 1e3 * t.median for k, t in timings.items()}
            ratio = paired_ratio(timings["ours"], timings["flax"])
            print(
                f"| {name} | {shape_text(x.shape)} | {pass_name} | {ms['ours']:.2f} | {ms['flax']:.2f} "
                f"| {ratio:.2f} |"
            )


if __name__ == "__main__":
    main()
