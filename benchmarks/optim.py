"""Step overhead of weight-norm control (WRS, BWN projection, norm schedule) on ResNet-18 params.

Usage::

    python benchmarks/optim.py [--quick] [--batch-size 100] [--tau 20] [--clock wall|cpu] [--repeats N]

Candidates, each one jitted function timed in alternation with the others (``_timing.py``):

* optimizer only, ``tau`` consecutive updates in one ``lax.fori_loop`` on ResNet-18's params
  (CIFAR stem, 11.2 M parameters, 62 leaves) with a fixed gradient, so that one of them rescales:
  ``sgd`` (momentum 0.9, the anchor), ``chain(sgd, weight_rescaling(tau))``,
  ``chain(sgd, bwn_projection())`` and ``chain(sgd, norm_schedule(1.0))``; reported per update;
* one training step of the same network with ``sgd`` (forward, backward through batch norm in
  training mode, update) on a CIFAR-sized batch.

The overhead of a transformation is the extra optimizer time per update (median of the paired
per-repeat differences) divided by the training step's time: what it adds to a training step, the
quantity the target of issue 4 (<= 2 %) is about. The optimizer-only ratio to ``sgd`` is printed as
well: the projection reads and writes every kernel, so on its own it costs a multiple of the SGD
update, which is itself a small part of a step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import optax
from _timing import CLOCKS, machine_lines, paired_ratio, time_interleaved

from jaxnorm.models import create
from jaxnorm.optim import bwn_projection, norm_schedule, weight_rescaling

OVERHEAD_TARGET = 0.02
"""Extra time per training step allowed for WRS and the BWN projection (issue 4)."""
REPEATS, QUICK_REPEATS = 9, 3


def _resnet18(batch_size: int):
    model = create("resnet18", num_classes=10)
    x = jax.random.normal(jax.random.key(0), (batch_size, 32, 32, 3))
    y = jax.random.randint(jax.random.key(1), (batch_size,), 0, 10)
    variables = jax.jit(lambda k: model.init(k, x, train=False))(jax.random.key(2))
    return model, variables, x, y


def _optimizer_candidate(tx: optax.GradientTransformation, params, grads, tau: int):
    """``tau`` updates of ``tx`` in one jitted loop; returns the final params and state."""

    @jax.jit
    def run(params, state):
        def body(_, carry):
            p, s = carry
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        return jax.lax.fori_loop(0, tau, body, (params, state))

    state = tx.init(params)
    return lambda: run(params, state)


def _train_step_candidate(model, variables, x, y):
    tx = optax.sgd(0.1, momentum=0.9)
    state = tx.init(variables["params"])

    @jax.jit
    def step(params, batch_stats, state):
        def loss(p):
            logits, updates = model.apply(
                {"params": p, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
            )
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates

        grads, new_stats = jax.grad(loss, has_aux=True)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), new_stats, state

    return lambda: step(variables["params"], variables["batch_stats"], state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REPEATS} repeats, batch 8")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="training-step batch (default 100, the WRS paper's)"
    )
    parser.add_argument("--tau", type=int, default=20, help="WRS interval and updates per sample")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall: elapsed time (default). cpu: process CPU time, pinned to one core (one XLA thread)",
    )
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    batch_size = args.batch_size or (8 if args.quick else 100)
    if args.clock == "cpu":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    model, variables, x, y = _resnet18(batch_size)
    params = variables["params"]
    grads = jax.tree.map(lambda p: 1e-3 * jax.random.normal(jax.random.key(p.size), p.shape, p.dtype), params)
    sgd = optax.sgd(0.1, momentum=0.9)
    transforms = {
        "sgd": sgd,
        f"sgd + weight_rescaling({args.tau})": optax.chain(sgd, weight_rescaling(args.tau)),
        "sgd + bwn_projection()": optax.chain(sgd, bwn_projection()),
        "sgd + norm_schedule(1.0)": optax.chain(sgd, norm_schedule(1.0)),
    }
    candidates = {name: _optimizer_candidate(tx, params, grads, args.tau) for name, tx in transforms.items()}
    candidates["train step (sgd)"] = _train_step_candidate(model, variables, x, y)

    n_params = sum(p.size for p in jax.tree.leaves(params))
    clock = "wall time" if args.clock == "wall" else "process CPU time, pinned to one core"
    for line in machine_lines(
        [
            f"timing: {clock}; {repeats} interleaved repeats; ResNet-18 (CIFAR stem), {n_params / 1e6:.1f} M "
            f"params, {len(jax.tree.leaves(params))} leaves; train step batch {batch_size}x32x32x3; "
            f"optimizer samples = {args.tau} updates in one fori_loop"
        ]
    ):
        print(line)
    start = time.perf_counter()
    timings = time_interleaved(candidates, repeats=repeats, warmup=2, clock=CLOCKS[args.clock])
    train = timings.pop("train step (sgd)")
    anchor = timings["sgd"]
    print()
    print(f"train step (sgd): {train.median * 1e3:.2f} ms (spread ±{train.spread:.0%})")
    print()
    print("| optimizer | ms / update | vs sgd (optimizer only) | added to a train step | target | verdict |")
    print("|---|---|---|---|---|---|")
    failed = []
    for name, timing in timings.items():
        per_update = timing.median / args.tau
        ratio = paired_ratio(timing, anchor)
        extra = statistics.median(
            (a - b) / args.tau / t
            for a, b, t in zip(timing.samples, anchor.samples, train.samples, strict=True)
        )
        checked = name != "sgd" and "norm_schedule" not in name
        verdict = "—" if not checked else ("PASS" if extra <= OVERHEAD_TARGET else "FAIL")
        if verdict == "FAIL":
            failed.append(name)
        target = f"<= {OVERHEAD_TARGET:.0%}" if checked else "—"
        print(
            f"| {name} | {per_update * 1e3:.3f} | {ratio:.2f}x | {extra:+.2%} | {target} | {verdict} |",
            flush=True,
        )
    print()
    print(f"{len(failed)} FAIL ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
