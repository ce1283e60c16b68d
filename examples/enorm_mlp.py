"""Balance a randomly initialised MLP with ENorm and plot its energy (Stock et al. 2019, Figs. 6, 7, 9).

Panels: (a) the L2 norm of every column (hidden unit's incoming weights) per layer, before and after
balancing (Fig. 6 and its balanced counterpart); (b) the per-layer energy ``||W_k||_2^2`` through
successive cycles, darker = later (Fig. 7); (c) the objective ``sum_k ||W_k||_2^2`` minus its
minimum over cycles (Fig. 9, here on an MLP). The network function is unchanged throughout; the
script checks it.

    python examples/enorm_mlp.py --out enorm_mlp.png
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from jaxnorm.enorm import chain, enorm_balance, objective


class MLP(nn.Module):
    widths: tuple[int, ...]
    out: int = 10

    @nn.compact
    def __call__(self, x):
        for w in self.widths:
            x = nn.relu(nn.Dense(w)(x))
        return nn.Dense(self.out)(x)


def layer_names(params) -> list[str]:
    return [j.producers[0][0][0] for j in chain(params)] + [chain(params)[-1].consumers[0][0][0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="enorm_mlp.png")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args()

    model = MLP(widths=(args.width,) * args.depth)
    x = jax.random.normal(jax.random.key(0), (16, 256))
    params = model.init(jax.random.key(1), x)["params"]
    # an unbalanced (but equivalent-in-kind) start: layer k scaled by 2^(k - depth/2)
    names = layer_names(params)
    params = {n: {"kernel": params[n]["kernel"] * 2.0 ** (k - args.depth / 2),
                  "bias": params[n]["bias"]} for k, n in enumerate(names)}
    spec = chain(params)

    history = [params]
    for _ in range(args.cycles):
        history.append(enorm_balance(history[-1], spec))
    balanced = history[-1]
    outputs = model.apply({"params": params}, x)
    drift = float(jnp.max(jnp.abs(model.apply({"params": balanced}, x) - outputs)))
    scale = float(jnp.max(jnp.abs(outputs)))
    print(f"max |f_balanced - f| = {drift:.2e} (outputs up to {scale:.2e})")
    # ENorm is a reparametrization: the function may move by float32 rounding only
    assert drift <= 1e-5 * max(scale, 1.0), f"the balanced network computes another function ({drift:.3g})"
    energy = np.array([[float(jnp.sum(p[n]["kernel"] ** 2)) for n in names] for p in history])
    total = np.array([float(objective(p, spec)) for p in history])
    minimum = float(objective(enorm_balance(params, spec, cycles=2000), spec))
    print(f"objective: {total[0]:.4g} -> {total[-1]:.4g} (minimum {minimum:.4g})")

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for k, n in enumerate(names):
        before = np.linalg.norm(np.asarray(params[n]["kernel"]), axis=0)
        after = np.linalg.norm(np.asarray(balanced[n]["kernel"]), axis=0)
        axes[0].scatter(np.full(before.shape, k - 0.15), before, s=4, c="tab:red",
                        label="before" if k == 0 else None)
        axes[0].scatter(np.full(after.shape, k + 0.15), after, s=4, c="tab:blue",
                        label="after" if k == 0 else None)
    axes[0].set(yscale="log", xlabel="layer", ylabel="column L2 norm",
                title="(a) per-unit norms before / after ENorm")
    axes[0].legend()
    colors = plt.cm.viridis_r(np.linspace(0.1, 1.0, len(history)))
    for i, row in enumerate(energy):
        axes[1].plot(range(len(names)), row, c=colors[i], lw=1)
    axes[1].set(yscale="log", xlabel="layer", ylabel="||W_k||_2^2",
                title="(b) per-layer energy over cycles (darker = later)")
    axes[2].semilogy(range(len(total)), np.maximum(total - minimum, 1e-12))
    axes[2].set(xlabel="cycle", ylabel="objective - minimum", title="(c) convergence")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
