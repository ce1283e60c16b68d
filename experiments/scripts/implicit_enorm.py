"""ENorm Annex C / Fig. 8: implicit ENorm (learned rescalings under a norm penalty) in the FC depth sweep.

Implicit ENorm reparametrizes every weight as ``D_{k-1}^-1 W_k D_k`` with learnable ``D = exp(u)``
and trains ``(W, u)`` jointly on ``CE + lambda * sum_k ||D_{k-1}^-1 W_k D_k||^2``
(``jaxnorm.enorm.apply_log_scales`` / ``implicit_penalty``); the function does not depend on
``u``, which only follows the penalty. Stock et al. (Fig. 8) find it better than the baseline but
below explicit ENorm, more so for deep nets. Setting of ``fmnist_enorm_depth`` (Fashion-MNIST,
``depth`` x 256 ReLU MLP without normalization, Xavier, SGD without momentum, batch 256, lr 0.05
decayed linearly to 0, 3 epochs): the baseline with weight decay 1e-3 on the kernels (penalty
``5e-4 ||W||^2``) against implicit ENorm with the same penalty on the rescaled weights. Compare
with the explicit ENorm rows of ``grid.py fmnist_enorm_depth``.

The penalty's gradient on ``u`` is small (``2 lambda (||incoming_j||^2 - ||outgoing_j||^2)``, about
1e-3 per unit), so with the weights' learning rate ``u`` hardly moves from 0 in 700 steps and
implicit ENorm equals the baseline. Annex C did not tune the two speeds separately ("We did not
investigate learning the weights and the rescaling coefficients at different speeds"); here ``u``
gets its own learning rate, ``factor`` times the weights' (same linear decay), swept over
``--u-lr-factors``. The script also reports how far ``u`` moved (mean ``|u|`` at the end) and the
balance it reached (mean over units of ``|log(||outgoing_j|| / ||incoming_j||)|`` of the effective
weights; 0 = ENorm-1's fixed point).

    python experiments/scripts/implicit_enorm.py [--depths 2 8] [--seeds 0 1 2]
        [--u-lr-factors 1 10 100 1000 10000]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.grid import fmt
from jaxnorm import data, models
from jaxnorm.enorm import apply_log_scales, chain, implicit_penalty, init_log_scales


def unit_sq_norms(params, entry) -> jax.Array:
    """Per-unit squared l2 norm of a spec entry ``(path, axis, ...)``: sum over the other axes."""
    node = params
    for key in entry[0]:
        node = node[key]
    axis = entry[1] % node.ndim
    return jnp.sum(node.astype(jnp.float32) ** 2, axis=tuple(a for a in range(node.ndim) if a != axis))


def imbalance(params, spec) -> float:
    """Mean over hidden units of ``|log(||outgoing_j|| / ||incoming_j||)|`` (0 when balanced)."""
    logs = []
    for junction in spec:
        incoming = sum(unit_sq_norms(params, e) for e in junction.producers if e[0][-1] == "kernel")
        outgoing = sum(unit_sq_norms(params, e) for e in junction.consumers)
        logs.append(jnp.abs(0.5 * jnp.log(outgoing / incoming)))
    return float(jnp.mean(jnp.concatenate(logs)))


def train(model, batches, eval_batches, seed: int, *, implicit: bool, lam: float, lr: float,
          u_lr_factor: float = 1.0) -> tuple[float, float, float]:
    """SGD on ``CE + lam * penalty`` (implicit: on the rescaled weights, ``u`` at ``u_lr_factor``
    times the weights' learning rate); returns (test accuracy, mean ``|u|``, imbalance of the
    effective weights)."""
    params = model.init(jax.random.key(seed), batches[0][0][:2], train=False)["params"]
    spec = chain(params)
    trainable = {"params": params, "log_scales": init_log_scales(params, spec)}
    schedule = optax.linear_schedule(lr, 0.0, len(batches))
    tx = optax.sgd(schedule)
    opt = tx.init(trainable)

    def effective(t):
        return apply_log_scales(t["params"], spec, t["log_scales"]) if implicit else t["params"]

    def loss_fn(t, x, y):
        logits = model.apply({"params": effective(t)}, x, train=True)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        u = t["log_scales"] if implicit else jax.lax.stop_gradient(t["log_scales"])
        return ce + lam * implicit_penalty(t["params"], spec, u)

    @jax.jit
    def step(t, opt, x, y):
        grads = jax.grad(loss_fn)(t, x, y)
        grads = {**grads, "log_scales": jax.tree.map(lambda g: u_lr_factor * g, grads["log_scales"])}
        updates, opt = tx.update(grads, opt, t)
        return optax.apply_updates(t, updates), opt

    @jax.jit
    def correct(t, x, y):
        return jnp.sum(jnp.argmax(model.apply({"params": effective(t)}, x, train=False), -1) == y)

    for x, y in batches:
        trainable, opt = step(trainable, opt, x, y)
    acc = sum(int(correct(trainable, x, y)) for x, y in eval_batches) / sum(len(y) for _, y in eval_batches)
    u_size = float(np.mean(np.abs(np.concatenate(jax.device_get(trainable["log_scales"])))))
    return acc, u_size, imbalance(effective(trainable), spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 8])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--wd", type=float, default=1e-3)
    parser.add_argument("--u-lr-factors", type=float, nargs="*", default=[1, 10, 100, 1000, 10000],
                        help="u's learning rate as multiples of the weights'")
    args = parser.parse_args()

    test = data.load("fashion_mnist", "test", batch_size=1000, train=False)
    eval_batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"])) for b in test.epoch(0)]
    names = ["baseline"] + [f"implicit, u lr x{f:g}" for f in args.u_lr_factors]
    rows = ["| depth | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for depth in args.depths:
        model = models.create("mlp", num_classes=10, norm="none", depth=depth, width=256)
        accs: dict[str, list[float]] = {name: [] for name in names}
        for seed in args.seeds:
            train_data = data.load("fashion_mnist", "train", batch_size=256, train=True, seed=seed)
            batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"]))
                       for e in range(args.epochs) for b in train_data.epoch(e)]
            for name, factor in zip(names, [None, *args.u_lr_factors], strict=True):
                acc, u_size, unbalance = train(model, batches, eval_batches, seed,
                                               implicit=factor is not None, lam=args.wd / 2,
                                               lr=args.lr, u_lr_factor=factor or 1.0)
                accs[name].append(acc)
                print(f"depth {depth} seed {seed} {name}: test acc {100 * acc:.2f}%, mean |u| "
                      f"{u_size:.3f}, imbalance {unbalance:.3f}", flush=True)
        rows.append(f"| {depth} | " + " | ".join(fmt(accs[n], 100) for n in names) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
