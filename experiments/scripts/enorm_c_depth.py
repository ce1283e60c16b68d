"""ENorm-1.2 at depth 16 (Stock et al. Sec. 3.7, Fig. 4): which placement of c lets the deep FC net train.

In the ``fmnist_enorm_depth`` sweep, ENorm-1.2 (one cycle after every SGD step, every junction
balanced with ``d_j = sqrt(R_j / (c L_j))``) does not train at depth 16 (NaN / chance) while
ENorm-1 does. At the fixed point ``||outgoing_j|| = c ||incoming_j||`` at each of the 16
junctions, so the energy grows by ``c`` per layer towards the classifier. The authors' code
(facebookresearch/enorm, ``ENorm._step_fc``) uses the same ``d_j`` but never balances the last
junction (the units read by the classifier), so the classifier keeps its own scale. This script
compares, in the depth sweep's setting (``depth`` x 256 ReLU MLP without normalization, Xavier,
SGD without momentum, batch 256, weight decay 1e-3 on the kernels, lr 0.05 decayed linearly to 0,
3 epochs of Fashion-MNIST), in a script-level loop (plain SGD has no state to rescale):

- ``enorm-1.2, every junction``: the library's ``jaxnorm.optim.enorm(c=1.2)`` rule (the failure);
- ``enorm-1.2, last junction skipped``: the authors' code;
- ``enorm-1.2 hidden, c=1 last``: c only between hidden layers, the classifier's junction at c = 1;
- ``enorm-1.2 from step N``: balancing starts after ``--start`` plain SGD steps;
- ``enorm-1, every junction``: the reference that trains.

``--c`` changes c in the first four (e.g. 1.1 ~ sqrt(1.2): the per-junction ratio that the
weighted objective of Sec. 3.7, Eq. 12, gives if its weights are ``c^(q-k)`` rather than
``c^(p (q-k))``), ``--lr`` the learning rate.

    python experiments/scripts/enorm_c_depth.py [--depth 16] [--seeds 0 1] [--start 100] [--c 1.2]
        [--lr 0.05] [--only "enorm-1.2, every junction"]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.grid import fmt
from jaxnorm import data, models
from jaxnorm.enorm import chain, enorm_balance
from jaxnorm.train.optimizers import weight_decay_mask


class Balancing(NamedTuple):
    """One ENorm variant: c on the hidden junctions, c on the classifier's junction (``None``:
    not balanced), and the first step after which balancing runs."""

    c_hidden: float
    c_last: float | None
    start: int = 0


def variants(start: int, c: float = 1.2) -> dict[str, Balancing]:
    """The compared placements of c (see the module docstring)."""
    return {
        f"enorm-{c:g}, every junction": Balancing(c, c),
        f"enorm-{c:g}, last junction skipped": Balancing(c, None),
        f"enorm-{c:g} hidden, c=1 last": Balancing(c, 1.0),
        f"enorm-{c:g} from step {start}": Balancing(c, c, start),
        "enorm-1, every junction": Balancing(1.0, 1.0),
    }


def unit_norms(params, spec) -> dict[str, float]:
    """Mean per-unit l2 norm (over each unit's incoming weights) of the first and last hidden
    kernels and of the classifier."""
    first, last = spec[0].producers[0][0], spec[-1].producers[0][0]
    head = spec[-1].consumers[0][0]

    def mean_norm(path, axis):
        node = params
        for key in path:
            node = node[key]
        return float(jnp.mean(jnp.linalg.norm(node, axis=axis)))

    return {"first": mean_norm(first, 0), "last": mean_norm(last, 0), "head": mean_norm(head, 0)}


def train(model, batches, eval_batches, seed: int, how: Balancing, *, lr: float, wd: float):
    """SGD (+ ENorm per ``how``); returns (test accuracy, last train loss, unit norms, first
    step with a non-finite loss or ``None``)."""
    params = model.init(jax.random.key(seed), batches[0][0][:2], train=False)["params"]
    spec = chain(params)
    hidden, last = tuple(spec[:-1]), tuple(spec[-1:])
    tx = optax.chain(optax.add_decayed_weights(wd, weight_decay_mask("kernels")),
                     optax.sgd(optax.linear_schedule(lr, 0.0, len(batches))))
    opt = tx.init(params)

    def loss_fn(p, x, y):
        logits = model.apply({"params": p}, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, opt, x, y, balance):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, opt = tx.update(grads, opt, p)
        p = optax.apply_updates(p, updates)

        def balanced(q):
            q = enorm_balance(q, hidden, c=how.c_hidden)
            return q if how.c_last is None else enorm_balance(q, last, c=how.c_last)

        return jax.lax.cond(balance, balanced, lambda q: q, p), opt, loss

    @jax.jit
    def correct(p, x, y):
        return jnp.sum(jnp.argmax(model.apply({"params": p}, x, train=False), -1) == y)

    diverged, losses = None, []
    for i, (x, y) in enumerate(batches):
        params, opt, loss = step(params, opt, x, y, jnp.asarray(i >= how.start))
        losses.append(loss)
        if (i + 1) % 50 == 0 or i + 1 == len(batches):
            window = np.asarray(jax.device_get(losses[-50:]))
            if diverged is None and not np.all(np.isfinite(window)):
                diverged = i + 1 - 50 + int(np.argmin(np.isfinite(window)))
    acc = sum(int(correct(params, x, y)) for x, y in eval_batches) / sum(len(y) for _, y in eval_batches)
    return acc, float(np.mean(jax.device_get(losses[-50:]))), unit_norms(params, spec), diverged


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--wd", type=float, default=1e-3)
    parser.add_argument("--start", type=int, default=100, help="first balanced step (delayed variant)")
    parser.add_argument("--c", type=float, default=1.2, help="the asymmetry c of the compared variants")
    parser.add_argument("--only", nargs="*", help="run only these variants")
    args = parser.parse_args(argv)

    test = data.load("fashion_mnist", "test", batch_size=1000, train=False)
    eval_batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"])) for b in test.epoch(0)]
    model = models.create("mlp", num_classes=10, norm="none", depth=args.depth, width=256)
    chosen = {k: v for k, v in variants(args.start, args.c).items() if not args.only or k in args.only}
    results: dict[str, list] = {name: [] for name in chosen}
    for seed in args.seeds:
        train_data = data.load("fashion_mnist", "train", batch_size=256, train=True, seed=seed)
        batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"]))
                   for e in range(args.epochs) for b in train_data.epoch(e)]
        for name, how in chosen.items():
            out = train(model, batches, eval_batches, seed, how, lr=args.lr, wd=args.wd)
            results[name].append(out)
            acc, loss, norms, diverged = out
            print(f"depth {args.depth} seed {seed} {name}: test acc {100 * acc:.2f}%, train loss "
                  f"{loss:.3f}, unit norms first / last / head {norms['first']:.2f} / "
                  f"{norms['last']:.2f} / {norms['head']:.2f}"
                  + (f", non-finite loss from step {diverged}" if diverged is not None else ""),
                  flush=True)
    print(f"| variant (depth {args.depth}) | test acc (%) | train loss | unit norm first / last "
          "hidden / classifier (seed 0) | diverged |")
    print("| --- | --- | --- | --- | --- |")
    for name, outs in results.items():
        n = outs[0][2]
        bad = sum(o[3] is not None for o in outs)
        print(f"| {name} | {fmt([o[0] for o in outs], 100)} | {fmt([o[1] for o in outs], 1, 3)} | "
              f"{n['first']:.2f} / {n['last']:.2f} / {n['head']:.2f} | {bad} of {len(outs)} |")


if __name__ == "__main__":
    main()
