"""ENorm cost on a type-C ResNet-18 at CIFAR shape (Stock et al. 2019, Sec. 5 and 6.3).

Prints, all measured in this run (warm-up, ``jax.block_until_ready``, medians):
- one ENorm cycle vs one SGD-momentum training step (anchor) at the given batch (target <= 1%);
- one cycle vs the time the BN variant's BN layers take (forward + backward of those layers alone,
  on activations of the shapes they see; the step difference BN - no norm is printed too);
- the full ``jaxnorm.optim.enorm`` step (SGD + cycle + momentum rescaling) vs the SGD step;
- compile time of the cycle (target <= 20 s) and of the discover trace;
- cycles to reach 1e-6 of the minimum of the objective (float64) for jaxnorm's exact block
  coordinate descent vs the official code's update order (each junction's incoming norms read
  before the previous junction's rescaling was applied), from the same initial params.

    python benchmarks/enorm.py                  # batch 128, width 64 (the paper's network)
    python benchmarks/enorm.py --batch 16 --width 16 --repeats 3     # a quick check
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import machine_lines

import jaxnorm.models
from jaxnorm.enorm import discover, enorm_balance, objective
from jaxnorm.enorm.balance import apply_scale, flatten_params, junction_scale, plan_spec
from jaxnorm.optim import enorm


def median_time(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # warm-up (and compile)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train_step(model, tx, mutable):
    def loss(params, other, x, y):
        out = model.apply({"params": params, **other}, x, train=True,
                          mutable=["batch_stats"] if mutable else False)
        logits, new = out if mutable else (out, {})
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new

    @jax.jit
    def step(params, other, opt_state, x, y):
        grads, new = jax.grad(loss, has_aux=True)(params, other, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new, opt_state

    return step


def bn_layers_step(model, variables, x):
    """Forward + backward of the BN variant's normalization layers alone (train mode), on
    activations of the shapes they see in the network (captured with flax intermediates)."""
    _, state = model.apply(variables, x, train=False,
                           capture_intermediates=lambda m, _: "BatchNorm" in type(m).__name__,
                           mutable=["intermediates"])
    shapes = [leaf.shape for leaf in jax.tree.leaves(state["intermediates"])]
    acts = [jax.random.normal(jax.random.key(i), s) for i, s in enumerate(shapes)]
    gammas = [jnp.ones(s[-1]) for s in shapes]

    def bn(x, gamma):
        mean = jnp.mean(x, axis=(0, 1, 2))
        var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + gamma

    loss = lambda xs, gs: sum(jnp.sum(bn(a, g) * a) for a, g in zip(xs, gs, strict=True))
    return jax.jit(jax.grad(loss, argnums=(0, 1))), (acts, gammas), len(shapes)


def cycles_to_tolerance(params, spec, tol: float, max_cycles: int):
    """(ours, official order) cycles until (objective - min) / min < tol, in float64."""
    with jax.enable_x64(True):
        params = jax.tree.map(lambda v: jnp.asarray(np.asarray(v, np.float64)), params)
        minimum = float(objective(enorm_balance(params, spec, cycles=4 * max_cycles), spec))
        plans = plan_spec(params, spec, "benchmark")
        leaves, treedef, _ = flatten_params(params)

        @jax.jit
        def official_cycle(leaves):
            current, stale = list(leaves), list(leaves)
            for plan in plans:
                mixed = list(current)
                for s in plan.producers:
                    mixed[s.leaf] = stale[s.leaf]
                d = junction_scale(mixed, plan, 2.0, 1.0, False)
                stale = list(current)
                apply_scale(current, plan, d)
            return tuple(current)

        ours_step = jax.jit(lambda p: enorm_balance(p, spec, cycles=1))
        gap = lambda p: (float(objective(p, spec)) - minimum) / minimum
        result = []
        for kind in ("ours", "official"):
            p, cur, count = params, tuple(leaves), 0
            while count < max_cycles and (count == 0 or gap(p) >= tol):
                if kind == "ours":
                    p = ours_step(p)
                else:
                    cur = official_cycle(cur)
                    p = jax.tree_util.tree_unflatten(treedef, list(cur))
                count += 1
            result.append(count if gap(p) < tol else None)
        return tuple(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-cycles", type=int, default=500)
    args = parser.parse_args()

    key = jax.random.key(0)
    x = jax.random.normal(key, (args.batch, 32, 32, 3))
    y = jax.random.randint(key, (args.batch,), 0, 10)
    build = partial(jaxnorm.models.create, "resnet18", num_classes=10, shortcut="C", stem="cifar",
                    width=args.width)
    plain, with_bn = build(norm="none"), build(norm="bn")
    v_plain = jax.jit(partial(plain.init, train=False))(key, x[:2])
    v_bn = jax.jit(partial(with_bn.init, train=False))(key, x[:2])
    params = v_plain["params"]

    start = time.perf_counter()
    spec = discover(lambda v, x: plain.apply(v, x, train=False), v_plain, x[:2])
    discover_s = time.perf_counter() - start
    n_units = sum(len(j.producers) for j in spec)

    cycle = jax.jit(lambda p: enorm_balance(p, spec, cycles=1))
    start = time.perf_counter()
    compiled = cycle.lower(params).compile()
    compile_s = time.perf_counter() - start
    cycle_s = median_time(compiled, params, repeats=args.repeats)

    sgd = optax.sgd(0.1, momentum=0.9)
    step = train_step(plain, sgd, mutable=False)
    sgd_s = median_time(step, params, {}, sgd.init(params), x, y, repeats=args.repeats)

    tx = enorm(optax.sgd(0.1, momentum=0.9), spec)
    enorm_step = train_step(plain, tx, mutable=False)
    enorm_s = median_time(enorm_step, params, {}, tx.init(params), x, y, repeats=args.repeats)

    bn_other = {"batch_stats": v_bn["batch_stats"]}
    bn_step = train_step(with_bn, sgd, mutable=True)
    bn_s = median_time(bn_step, v_bn["params"], bn_other, sgd.init(v_bn["params"]), x, y,
                       repeats=args.repeats)
    bn_fn, bn_args, n_bn = bn_layers_step(with_bn, v_bn, x)
    bn_layers_s = median_time(bn_fn, *bn_args, repeats=args.repeats)

    ours, official = cycles_to_tolerance(params, spec, 1e-6, args.max_cycles)

    n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
    for line in machine_lines([f"timing: medians of {args.repeats} repeats after a warm-up"]):
        print(line)
    print(f"ResNet-18 type C, width {args.width}, batch {args.batch}, 32x32x3, "
          f"{n_params:,} params, {len(spec)} junctions ({n_units} producer entries)")
    print(f"discover trace + analysis     {discover_s:8.3f} s")
    print(f"cycle compile                 {compile_s:8.3f} s   (target <= 20 s)")
    print(f"one ENorm cycle               {cycle_s * 1e3:8.2f} ms")
    print(f"SGD-momentum step (anchor)    {sgd_s * 1e3:8.2f} ms   cycle/step = "
          f"{100 * cycle_s / sgd_s:.2f}%  (target <= 1%)")
    print(f"enorm(sgd) full step          {enorm_s * 1e3:8.2f} ms   overhead vs anchor = "
          f"{100 * (enorm_s - sgd_s) / sgd_s:.2f}%")
    print(f"BN variant step               {bn_s * 1e3:8.2f} ms   (minus the no-norm step: "
          f"{(bn_s - sgd_s) * 1e3:.2f} ms, noisy)")
    print(f"its {n_bn} BN layers fwd+bwd     {bn_layers_s * 1e3:8.2f} ms   cycle / BN layers = "
          f"{cycle_s / bn_layers_s:.4f}  (target < 1)")
    print(f"cycles to 1e-6 of the minimum (float64): jaxnorm exact BCD {ours}, "
          f"official update order {official}")


if __name__ == "__main__":
    main()
