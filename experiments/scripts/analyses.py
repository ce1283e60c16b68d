"""Analyses over the loop's results, for the figures that need more than its records.

A config names one with ``ANALYSIS = "<name>"``; :func:`experiments.scripts.common.run_one` calls
its ``analyze(config, result)`` after every run (``result`` the loop's
:class:`jaxnorm.train.RunResult`; the numbers are stored with the run under ``"analysis"``), and
``grid.py`` prints its ``report(results)`` table and draws its ``figure(results, path)`` over all runs
(``results``: ``{variant: [run record, one per seed]}``, the records of ``run_one``).

Each analysis reads the final params of the run (``result.state.params``) or, for measurements at
initialization, the run's initial params, rebuilt exactly as the loop builds them
(:func:`initial_variables`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.scripts.common import first_seed_label, fmt

Results = Mapping[str, Sequence[Mapping[str, Any]]]


class Analysis(NamedTuple):
    """``analyze(config, result) -> {name: number}`` per run; optional ``report(results) -> str``
    (a Markdown table) and ``figure(results, path)`` over all runs."""

    analyze: Callable[[Any, Any], dict[str, Any]]
    report: Callable[[Results], str] | None = None
    figure: Callable[[Results, str], None] | None = None


# ----------------------------------------------------------------------------------------------
# Shared pieces.


def model_of(config):
    """The run's model (built as :func:`jaxnorm.train.experiment.run` builds it, under jit)."""
    from jaxnorm import data
    from jaxnorm.train.experiment import build_model
    from jaxnorm.train.sharding import DataParallel

    return build_model(config, data.info(config.dataset.name).num_classes, DataParallel("jit"))


def images(dataset: str, split: str, count: int) -> tuple[jax.Array, jax.Array]:
    """The first ``count`` examples of ``split`` in order (no shuffling): a fixed probe batch."""
    from jaxnorm import data

    source = data.load(dataset, f"{split}[:{count}]", batch_size=count, train=False)
    batch = next(iter(source.epoch(0)))
    return jnp.asarray(batch["image"]), jnp.asarray(batch["label"])


def initial_variables(config, model) -> dict[str, Any]:
    """The run's initial variables, as :func:`jaxnorm.train.train` creates them: the same PRNG key
    (``config.seed``) and the same ``config.init_examples`` first images of the first epoch."""
    from jaxnorm.train.experiment import build_data
    from jaxnorm.train.state import create_train_state

    train_data, _ = build_data(config)
    count, parts = int(config.init_examples), []
    for batch in train_data.epoch(0):
        parts.append(batch["image"])
        if sum(len(p) for p in parts) >= count:
            break
    x = np.concatenate(parts)[:count]
    state = create_train_state(model.init, optax.identity(), jax.random.PRNGKey(config.seed), x)
    return {"params": state.params, **state.model_state}


def final_variables(result) -> dict[str, Any]:
    """The run's final variables (params and the other collections)."""
    from jaxnorm.train.params_hooks import model_params

    return {"params": model_params(result.state.params), **result.state.model_state}


def _get(tree: Any, path: Sequence[Any]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _values(runs: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(r["analysis"][key]) for r in runs]


def rms(x) -> float:
    return float(jnp.sqrt(jnp.mean(jnp.square(x))))


# ----------------------------------------------------------------------------------------------
# Liu et al. Fig. 5: input-span projection sparsity (fmnist_isp_sparsity).

ISP_LAYERS = ("dense_1", "dense_2")


def isp_analyze(config, result) -> dict[str, float]:
    """The generalized-Gaussian shape ``beta`` of each hidden kernel of :data:`ISP_LAYERS`, projected
    on the eigenvectors of its input features (ReLU outputs of the previous layer, BN in training
    mode, on the first 2,000 training images) and raw
    (:func:`jaxnorm.diagnostics.input_span_projection`, :func:`fit_generalized_gaussian`)."""
    from jaxnorm.diagnostics import fit_generalized_gaussian, input_span_projection

    model = model_of(config)
    variables = final_variables(result)
    x, _ = images(config.dataset.name, "train", 2000)
    _, inter = model.apply(
        variables, x, train=True, mutable=["batch_stats", "intermediates"], capture_intermediates=True
    )
    inter = inter["intermediates"]
    out = {}
    for layer in ISP_LAYERS:
        features = jax.nn.relu(inter[f"dense_{int(layer[-1]) - 1}_norm"]["__call__"][0])
        kernel = variables["params"][layer]["kernel"]
        projected = input_span_projection(kernel, features).projected
        out[f"{layer} ISP"] = float(fit_generalized_gaussian(projected).beta)
        out[f"{layer} raw"] = float(fit_generalized_gaussian(kernel).beta)
    return out


def isp_report(results: Results) -> str:
    keys = [f"{layer} {kind}" for layer in ISP_LAYERS for kind in ("ISP", "raw")]
    rows = ["| run | test acc (%) | " + " | ".join(f"beta {k}" for k in keys) + " |"]
    rows.append("| --- " * (len(keys) + 2) + "|")
    for name, runs in results.items():
        cells = [fmt([r["eval_accuracy"] for r in runs], 100)] + [fmt(_values(runs, k), 1, 3) for k in keys]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# Salimans & Kingma: weight norm with and without the data-dependent init (fmnist_wn_init).


def wn_init_analyze(config, result) -> dict[str, float]:
    """The RMS of the logits at initialization on the init batch (the run's own init)."""
    model = model_of(config)
    variables = initial_variables(config, model)
    from jaxnorm.train.experiment import build_data

    train_data, _ = build_data(config)
    x = next(iter(train_data.epoch(0)))["image"]
    return {"logit_rms_at_init": rms(model.apply(variables, jnp.asarray(x), train=False))}


def wn_init_report(results: Results) -> str:
    rows = ["| g_init | logit RMS at init | test acc (%) |", "| --- | --- | --- |"]
    for name, runs in results.items():
        rows.append(
            f"| {name} | {fmt(_values(runs, 'logit_rms_at_init'), 1, 3)} | "
            f"{fmt([r['eval_accuracy'] for r in runs], 100)} |"
        )
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# The optimization view: top Hessian eigenvalue and the largest stable SGD step (fmnist_hessian_lr).

HESSIAN_LR = 0.1
"""The learning rate after whose run the top eigenvalue is measured again."""


def top_eigenvalue(model, variables, x, y) -> float:
    """Top eigenvalue of the Hessian of the training-mode cross-entropy in the params on ``(x, y)``
    (30 Lanczos steps; :func:`jaxnorm.diagnostics.hessian_top_eigenvalue`)."""
    from jaxnorm.diagnostics import hessian_top_eigenvalue

    def loss(params, batch_stats, images_, labels):
        v = {"params": params, **({"batch_stats": batch_stats} if batch_stats else {})}
        logits, _ = model.apply(v, images_, train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    stats = variables.get("batch_stats", {})
    eig = hessian_top_eigenvalue(loss, variables["params"], stats, x, y, key=jax.random.key(0), num_iters=30)
    return float(eig.eigenvalue)


def hessian_analyze(config, result) -> dict[str, Any]:
    """First and last training loss, whether the run is stable (every step finite and the last loss
    below the first), and the top Hessian eigenvalue at initialization and, for the run at
    :data:`HESSIAN_LR`, after it, on the first 512 training images."""
    train = [r for r in result.history if r["split"] == "train"]
    losses = [float(r["loss"]) for r in train]
    stable = bool(np.all(np.isfinite(losses)) and losses[-1] < losses[0])
    model = model_of(config)
    x, y = images(config.dataset.name, "train", 512)
    out: dict[str, Any] = {
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "stable": stable,
        "learning_rate": float(config.optimizer.learning_rate),
        "lambda_init": top_eigenvalue(model, initial_variables(config, model), x, y),
    }
    if math.isclose(out["learning_rate"], HESSIAN_LR):
        out["lambda_trained"] = top_eigenvalue(model, final_variables(result), x, y)
    return out


def _by_norm(results: Results) -> dict[str, list[Mapping[str, Any]]]:
    """Each variant's first run's analysis (:func:`first_seed_label`) grouped by the model's norm (the
    variant name's first word), lr ascending."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for name, runs in results.items():
        groups.setdefault(name.split()[0], []).append(runs[0]["analysis"])
    return {k: sorted(v, key=lambda a: a["learning_rate"]) for k, v in groups.items()}


def hessian_report(results: Results) -> str:
    rows = [
        f"| model ({first_seed_label(results)}) | lambda_max at init | 2 / lambda_max "
        "| lambda_max after lr 0.1 | largest stable lr | final loss per lr |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for norm, runs in _by_norm(results).items():
        lam0 = runs[0]["lambda_init"]
        lam1 = next((a["lambda_trained"] for a in runs if "lambda_trained" in a), float("nan"))
        stable = max((a["learning_rate"] for a in runs if a["stable"]), default=0.0)
        per_lr = ", ".join(
            f"{a['learning_rate']:g}: {a['final_loss']:.3f}"
            if a["stable"]
            else f"{a['learning_rate']:g}: div."
            for a in runs
        )
        rows.append(f"| {norm} | {lam0:.3g} | {2 / lam0:.3g} | {lam1:.3g} | {stable:g} | {per_lr} |")
    return "\n".join(rows)


def hessian_figure(results: Results, path: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for norm, runs in _by_norm(results).items():
        lrs = [a["learning_rate"] for a in runs]
        finals = [a["final_loss"] if a["stable"] else float("nan") for a in runs]
        label = f"{norm} (2/lambda_max at init = {2 / runs[0]['lambda_init']:.2g})"
        ax.plot(lrs, finals, marker="o", label=label)
    ax.set(
        xscale="log",
        xlabel="SGD learning rate",
        ylabel="final training loss",
        title=f"3 x 256 MLP, Fashion-MNIST ({first_seed_label(results)}): missing points diverged",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# ENorm-1.2 at depth 16: where c goes (fmnist_enorm_c_depth).


def unit_norms_analyze(config, result) -> dict[str, Any]:
    """Mean per-unit l2 norm (over each unit's incoming weights) of the first and last hidden
    kernels and of the classifier, and the first logged step with a non-finite loss (``None``)."""
    params = final_variables(result)["params"]
    depth = int(config.model.kwargs.depth)

    def mean_norm(name: str) -> float:
        return float(np.mean(np.linalg.norm(np.asarray(params[name]["kernel"], np.float64), axis=0)))

    train = [r for r in result.history if r["split"] == "train"]
    bad = [int(r["step"]) for r in train if not math.isfinite(float(r["loss"]))]  # "nan": a string
    return {
        "first": mean_norm("dense_0"),
        "last": mean_norm(f"dense_{depth - 1}"),
        "head": mean_norm("head"),
        "diverged_at": bad[0] if bad else None,
    }


def unit_norms_report(results: Results) -> str:
    rows = [
        "| variant | test acc (%) | train loss | unit norm first / last hidden / classifier "
        f"({first_seed_label(results)}) | diverged |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, runs in results.items():
        n = runs[0]["analysis"]
        bad = sum(r["analysis"]["diverged_at"] is not None for r in runs)
        rows.append(
            f"| {name} | {fmt([r['eval_accuracy'] for r in runs], 100)} | "
            f"{fmt([r['train_loss'] for r in runs], 1, 3)} | "
            f"{n['first']:.2f} / {n['last']:.2f} / {n['head']:.2f} | {bad} of {len(runs)} |"
        )
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# Implicit ENorm (fmnist_implicit_enorm).


def _unit_sq_norms(params, entry) -> jax.Array:
    """Per-unit squared l2 norm of a spec entry ``(path, axis, ...)``: sum over the other axes."""
    node = _get(params, entry[0])
    axis = entry[1] % node.ndim
    return jnp.sum(node.astype(jnp.float32) ** 2, axis=tuple(a for a in range(node.ndim) if a != axis))


def imbalance(params, spec) -> float:
    """Mean over hidden units of ``|log(||outgoing_j|| / ||incoming_j||)|`` (0 when balanced, the
    fixed point of ENorm-1)."""
    logs = []
    for junction in spec:
        incoming = sum(_unit_sq_norms(params, e) for e in junction.producers if e[0][-1] == "kernel")
        outgoing = sum(_unit_sq_norms(params, e) for e in junction.consumers)
        logs.append(jnp.abs(0.5 * jnp.log(outgoing / incoming)))
    return float(jnp.mean(jnp.concatenate(logs)))


def implicit_analyze(config, result) -> dict[str, float]:
    """How far the log-scales ``u`` moved (mean ``|u|``; 0 without implicit ENorm) and the imbalance
    of the effective weights ``D^-1 W D`` (:func:`imbalance`)."""
    from jaxnorm.enorm import apply_log_scales, chain
    from jaxnorm.train.params_hooks import LOG_SCALES, model_params

    params = result.state.params
    raw = model_params(params)
    spec = chain(raw)
    if LOG_SCALES not in params:
        return {"mean_abs_u": 0.0, "imbalance": imbalance(raw, spec)}
    u = [jnp.asarray(params[LOG_SCALES][f"junction_{j}"]) for j in range(len(spec))]
    return {
        "mean_abs_u": float(np.mean(np.abs(np.concatenate([np.asarray(x) for x in u])))),
        "imbalance": imbalance(apply_log_scales(raw, spec, u), spec),
    }


def implicit_report(results: Results) -> str:
    rows = [
        f"| variant | test acc (%) | mean abs(u) ({first_seed_label(results)}) | imbalance (same seed) |",
        "| --- | --- | --- | --- |",
    ]
    for name, runs in results.items():
        a = runs[0]["analysis"]
        rows.append(
            f"| {name} | {fmt([r['eval_accuracy'] for r in runs], 100)} | "
            f"{a['mean_abs_u']:.3g} | {a['imbalance']:.3g} |"
        )
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# Scaled weight norm vs weight norm with depth, at initialization (fmnist_swn_depth).


def _kernel_grad_norm(tree) -> float:
    """The l2 norm of every ``kernel`` leaf (weight norm's direction ``v``) in a module's subtree."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    leaves = [v for path, v in flat if getattr(path[-1], "key", None) == "kernel"]
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(v)) for v in leaves)))


def swn_analyze(config, result) -> dict[str, Any]:
    """At the run's initialization, on the first 256 training images: the logit RMS, the RMS of
    every hidden layer's output (MLPs), and ``||grad v_first|| / ||grad v_last||`` of the
    cross-entropy (MLP: first and last hidden layers; ResNet-56: the stem and the last block)."""
    del result  # measured at initialization: the run's own init, rebuilt
    model = model_of(config)
    variables = initial_variables(config, model)
    x, y = images(config.dataset.name, "train", 256)
    if config.model.name == "mlp":
        first, last = "dense_0", f"dense_{int(config.model.kwargs.depth) - 1}"
    else:
        first, last = "stem", "stage2_block8"

    def loss(params):
        logits = model.apply({**variables, "params": params}, x, train=False)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss)(variables["params"])
    logits, inter = model.apply(variables, x, train=False, capture_intermediates=True)
    per_layer = [rms(v["__call__"][0]) for k, v in inter["intermediates"].items() if k.startswith("dense_")]
    return {
        "logit_rms": rms(logits),
        "layer_rms": per_layer,
        "grad_ratio": _kernel_grad_norm(grads[first]) / _kernel_grad_norm(grads[last]),
    }


def swn_report(results: Results) -> str:
    rows = ["| run | logit RMS | ‖∇v first‖ / ‖∇v last‖ |", "| --- | --- | --- |"]
    for name, runs in results.items():
        a = runs[0]["analysis"]
        rows.append(f"| {name} | {a['logit_rms']:.3g} | {a['grad_ratio']:.3g} |")
    return "\n".join(rows)


def swn_figure(results: Results, path: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for norm in ("wn", "swn"):
        rows = sorted(
            (int(name.split("depth ")[1]), runs[0]["analysis"])
            for name, runs in results.items()
            if name.startswith(f"MLP {norm} ")
        )
        if not rows:
            continue
        depths = [d for d, _ in rows]
        axes[0].semilogy(depths, [a["logit_rms"] for _, a in rows], marker="o", label=norm)
        axes[1].semilogy(depths, [a["grad_ratio"] for _, a in rows], marker="o", label=norm)
        deepest = rows[-1][1]["layer_rms"]
        axes[2].semilogy(range(len(deepest)), deepest, marker=".", label=f"{norm}, depth {depths[-1]}")
    axes[0].set(xlabel="hidden layers", ylabel="logit RMS", title="forward: output scale at init")
    axes[1].set(
        xlabel="hidden layers",
        ylabel="||grad v_first|| / ||grad v_last||",
        title="backward: first / last layer gradient",
    )
    axes[2].set(xlabel="layer", ylabel="activation RMS", title="forward: per-layer activation RMS")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


ANALYSES: dict[str, Analysis] = {
    "isp_sparsity": Analysis(isp_analyze, isp_report),
    "wn_init": Analysis(wn_init_analyze, wn_init_report),
    "hessian_lr": Analysis(hessian_analyze, hessian_report, hessian_figure),
    "unit_norms": Analysis(unit_norms_analyze, unit_norms_report),
    "implicit_enorm": Analysis(implicit_analyze, implicit_report),
    "swn_depth": Analysis(swn_analyze, swn_report, swn_figure),
}
"""The analyses configs name in ``ANALYSIS``."""


def get_analysis(name: str) -> Analysis:
    """The analysis ``name``; ``ValueError`` naming ``ANALYSIS`` and the choices otherwise."""
    if name not in ANALYSES:
        raise ValueError(f"ANALYSIS must be one of {sorted(ANALYSES)}, got {name!r}")
    return ANALYSES[name]
