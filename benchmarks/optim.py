"""Step overhead of weight-norm control (WRS, BWN, sphere/radial projections, AdamP/SGDP, AdamWN), ResNet-18.

Usage::

    python benchmarks/optim.py [--quick] [--batch-size 100] [--tau 20] [--clock wall|cpu] [--repeats N]

Candidates, each one jitted function timed in alternation with the others (``_timing.py``):

* optimizer only, ``tau`` consecutive updates in one ``lax.fori_loop`` on ResNet-18's params
  (CIFAR stem, 11.2 M parameters, 62 leaves) with a fixed gradient, so that one of them rescales,
  each against the plain optax optimizer it extends (its *anchor*), timed in the same run:

  - anchor ``sgd`` (``optax.sgd(0.1, momentum=0.9)``): ``chain(sgd, weight_rescaling(tau))``,
    ``chain(sgd, bwn_projection())``, ``chain(sgd, norm_schedule(1.0))`` (issue 4);
    ``chain(sgd, sphere_projection())``, ``radial_projection(sgd)`` (AdamP's projection around
    momentum SGD, cosine test) and ``sgdp(0.1, momentum=0.9)`` (issue 18);
  - anchor ``adamw`` (``optax.adamw(1e-3, weight_decay=0.05)``): ``adamp(1e-3, weight_decay=0.05)``
    and ``adamwn(1e-3, target=1.0, weight_decay=0.05)`` (issue 18);

  reported per update;
* one training step of the same network with each anchor (forward, backward through batch norm in
  training mode, update) on a CIFAR-sized batch.

The overhead of a transformation is the extra optimizer time per update over its anchor (median of
the paired per-repeat differences) divided by the anchor's training step time: what it adds to a
training step. Targets: issue 4, WRS and the BWN projection <= 2 %; issue 18, the scale-invariance
transforms <= 5 % on CPU. The optimizer-only ratio to the anchor is printed as well: a projection
reads and writes every kernel, so on its own it costs a multiple of the SGD update, which is itself a
small part of a step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import optax
from _timing import CLOCKS, machine_lines, paired_ratio, positive_count, time_interleaved

from jaxnorm.models import create
from jaxnorm.optim import (
    adamp,
    adamwn,
    bwn_projection,
    norm_schedule,
    radial_projection,
    sgdp,
    sphere_projection,
    weight_rescaling,
)

OVERHEAD_TARGET = 0.02
"""Extra time per training step allowed for WRS and the BWN projection (issue 4)."""
SCALE_INVARIANCE_TARGET = 0.05
"""Extra time per training step allowed for the scale-invariance transforms on CPU (issue 18)."""
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
    def run(params, state, grads):
        def body(_, carry):
            p, s = carry
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        return jax.lax.fori_loop(0, tau, body, (params, state))

    # grads an argument, not a closed-over constant: XLA would fold the gradient-only parts of a
    # transform (AdamP's cosine test reads the gradient norms) at compile time.
    state = tx.init(params)
    return lambda: run(params, state, grads)


def _train_step_candidate(model, variables, x, y, tx: optax.GradientTransformation):
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
    repeats = positive_count(parser, "--repeats", args.repeats, QUICK_REPEATS if args.quick else REPEATS)
    batch_size = args.batch_size or (8 if args.quick else 100)
    if args.clock == "cpu":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    model, variables, x, y = _resnet18(batch_size)
    params = variables["params"]
    grads = jax.tree.map(lambda p: 1e-3 * jax.random.normal(jax.random.key(p.size), p.shape, p.dtype), params)
    sgd = optax.sgd(0.1, momentum=0.9)
    adamw = optax.adamw(1e-3, weight_decay=0.05)
    anchors = {"sgd": sgd, "adamw": adamw}
    # name: (transformation, anchor, target or None)
    rows = {
        "sgd": (sgd, "sgd", None),
        f"sgd + weight_rescaling({args.tau})": (
            optax.chain(sgd, weight_rescaling(args.tau)),
            "sgd",
            OVERHEAD_TARGET,
        ),
        "sgd + bwn_projection()": (optax.chain(sgd, bwn_projection()), "sgd", OVERHEAD_TARGET),
        "sgd + norm_schedule(1.0)": (optax.chain(sgd, norm_schedule(1.0)), "sgd", None),
        "sgd + sphere_projection()": (optax.chain(sgd, sphere_projection()), "sgd", SCALE_INVARIANCE_TARGET),
        "radial_projection(sgd)": (radial_projection(sgd), "sgd", SCALE_INVARIANCE_TARGET),
        "sgdp(momentum 0.9)": (sgdp(0.1, momentum=0.9), "sgd", SCALE_INVARIANCE_TARGET),
        "adamw": (adamw, "adamw", None),
        "adamp": (adamp(1e-3, weight_decay=0.05), "adamw", SCALE_INVARIANCE_TARGET),
        "adamwn(target 1.0)": (adamwn(1e-3, 1.0, weight_decay=0.05), "adamw", SCALE_INVARIANCE_TARGET),
    }
    candidates = {
        name: _optimizer_candidate(tx, params, grads, args.tau) for name, (tx, _, _) in rows.items()
    }
    for name, tx in anchors.items():
        candidates[f"train step ({name})"] = _train_step_candidate(model, variables, x, y, tx)

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
    trains = {name: timings.pop(f"train step ({name})") for name in anchors}
    print()
    for name, train in trains.items():
        print(f"train step ({name}): {train.median * 1e3:.2f} ms (spread ±{train.spread:.0%})")
    print()
    print(
        "| optimizer | anchor | ms / update | vs anchor (optimizer only) | added to a train step "
        "| target | verdict |"
    )
    print("|---|---|---|---|---|---|---|")
    failed = []
    for name, timing in timings.items():
        _, anchor_name, target = rows[name]
        anchor, train = timings[anchor_name], trains[anchor_name]
        per_update = timing.median / args.tau
        ratio = paired_ratio(timing, anchor)
        extra = statistics.median(
            (a - b) / args.tau / t
            for a, b, t in zip(timing.samples, anchor.samples, train.samples, strict=True)
        )
        verdict = "—" if target is None else ("PASS" if extra <= target else "FAIL")
        if verdict == "FAIL":
            failed.append(name)
        shown = "—" if target is None else f"<= {target:.0%}"
        anchor_cell = "(anchor)" if name == anchor_name else anchor_name
        print(
            f"| {name} | {anchor_cell} | {per_update * 1e3:.3f} | {ratio:.2f}x | {extra:+.2%} | {shown} "
            f"| {verdict} |",
            flush=True,
        )
    print()
    print(f"{len(failed)} FAIL ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
