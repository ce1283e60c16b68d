"""The loop's hooks for the experiments that used to need their own step (issue 17).

* ``implicit_enorm`` (Stock et al. 2019, Annex C): log-scales ``u`` trained with the weights under
  ``lambda sum_k ||D_{k-1}^-1 W_k D_k||^2``. Oracle: the first SGD step moves ``u_j`` by
  ``-lr * lr_factor * 2 lambda (||in_j||^2 - ||out_j||^2)`` (the penalty's gradient at ``u = 0``,
  float64 NumPy on the initial kernels); the network's function never depends on ``u``.
* the ``enorm`` wrapper's per-junction ``c`` (``{"hidden": c_h, "last": c_l | None}``) and ``start``.
* every bad value is refused before training with an error naming its key.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxnorm import models
from jaxnorm.train import ArraySource, train
from jaxnorm.train.config_checks import check_hooks
from jaxnorm.train.params_hooks import LOG_SCALES, model_params


def _data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int32)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    x[np.arange(n), y] += 1.5
    return {"image": x, "label": y}


def _model(depth=2):
    return models.create("mlp", num_classes=3, norm="none", depth=depth, width=8)


def _source():
    return ArraySource(_data(), 64, seed=1)


def _kernels(params):
    names = [k for k in params if k.startswith("dense_")] + ["head"]
    return [np.asarray(params[k]["kernel"], np.float64) for k in names]


def _run(config, model=None, **kwargs):
    base = {"progress": False, "plots": False, "log_every": 1}
    return train({**base, **config}, model=model or _model(), train_data=_source(), **kwargs)


def test_implicit_enorm_first_step_moves_u_by_the_penalty_gradient():
    lam, lr, factor = 0.01, 0.05, 100.0
    sgd = {"name": "sgd", "learning_rate": lr}
    start = _run({"num_steps": 1, "optimizer": {"name": "sgd", "learning_rate": 0.0}})
    kernels = _kernels(start.state.params)
    result = _run({"num_steps": 1, "optimizer": sgd, "implicit_enorm": {"weight": lam, "lr_factor": factor}})
    u = result.state.params[LOG_SCALES]
    assert sorted(u) == ["junction_0", "junction_1"]
    for j in range(2):
        incoming = np.sum(kernels[j] ** 2, axis=0)
        outgoing = np.sum(kernels[j + 1] ** 2, axis=1)
        expected = -lr * factor * 2 * lam * (incoming - outgoing)
        np.testing.assert_allclose(np.asarray(u[f"junction_{j}"]), expected, rtol=1e-4, atol=1e-8)
    record = next(r for r in result.history if r["split"] == "train")
    penalty = lam * sum(np.sum(k**2) for k in kernels)  # at u = 0: lambda sum_k ||W_k||^2
    np.testing.assert_allclose(record["penalty"], penalty, rtol=1e-5)
    assert record["loss"] < 2.0  # the cross-entropy alone (ln 3 ~ 1.1 at init), not CE + penalty


def test_implicit_enorm_balances_and_leaves_the_function_alone():
    """With a large lr_factor u drives the effective weights to ENorm-1's balance; evaluation with
    the effective params equals the raw params' function."""
    from jaxnorm.enorm import apply_log_scales, chain

    config = {
        "num_steps": 40,
        "optimizer": {"name": "sgd", "learning_rate": 0.05},
        "implicit_enorm": {"weight": 0.01, "lr_factor": 300.0},
    }
    eval_src = ArraySource(_data(64, 2), 64, shuffle=False, drop_remainder=False)
    result = _run(config, eval_data=eval_src)
    params = result.state.params
    raw = model_params(params)
    spec = chain(raw)
    u = [params[LOG_SCALES][f"junction_{j}"] for j in range(len(spec))]
    effective = apply_log_scales(raw, spec, u)

    def imbalance(p):
        k = _kernels(p)
        return np.mean(
            [
                np.abs(np.log(np.linalg.norm(k[j + 1], axis=1) / np.linalg.norm(k[j], axis=0)))
                for j in range(2)
            ]
        )

    assert imbalance(effective) < 0.1 < imbalance(raw)
    x = _data(64, 2)["image"]
    model = _model()
    np.testing.assert_allclose(
        model.apply({"params": effective}, x, train=False),
        model.apply({"params": raw}, x, train=False),
        rtol=2e-4,
        atol=1e-5,
    )
    evals = [r for r in result.history if r["split"] == "eval"]
    assert evals and np.isfinite(evals[-1]["loss"])


def test_enorm_c_mapping_balances_hidden_junctions_and_skips_the_last():
    config = {
        "num_steps": 1,
        "optimizer": {
            "name": "sgd",
            "learning_rate": 0.0,
            "wrappers": ("enorm",),
            "wrapper_kwargs": {
                "enorm": {"c": {"hidden": 1.5, "last": None}, "cycles": 300, "max_scale": None}
            },
        },
    }
    start = _kernels(_run({"num_steps": 1, "optimizer": {"name": "sgd", "learning_rate": 0.0}}).state.params)
    k = _kernels(_run(config).state.params)
    np.testing.assert_allclose(np.linalg.norm(k[1], axis=1), 1.5 * np.linalg.norm(k[0], axis=0), rtol=1e-3)
    np.testing.assert_array_equal(k[2], start[2])  # the classifier's junction is not balanced
    config["optimizer"]["wrapper_kwargs"]["enorm"]["c"] = {"hidden": 1.5, "last": 1.0}
    k = _kernels(_run(config).state.params)
    np.testing.assert_allclose(np.linalg.norm(k[1], axis=1), 1.5 * np.linalg.norm(k[0], axis=0), rtol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(k[2], axis=1), np.linalg.norm(k[1], axis=0), rtol=1e-3)


def test_enorm_start_delays_balancing():
    enorm = {"c": 1.0, "cycles": 50, "max_scale": None, "start": 2}
    optimizer = {
        "name": "sgd",
        "learning_rate": 0.0,
        "wrappers": ("enorm",),
        "wrapper_kwargs": {"enorm": enorm},
    }
    start = _kernels(_run({"num_steps": 1, "optimizer": {"name": "sgd", "learning_rate": 0.0}}).state.params)
    two = _kernels(_run({"num_steps": 2, "optimizer": optimizer}).state.params)
    for a, b in zip(two, start, strict=True):
        np.testing.assert_array_equal(a, b)
    three = _kernels(_run({"num_steps": 3, "optimizer": optimizer}).state.params)
    assert not np.allclose(three[0], start[0])
    np.testing.assert_allclose(np.linalg.norm(three[1], axis=1), np.linalg.norm(three[0], axis=0), rtol=1e-3)


def _config(**top):
    from jaxnorm.train.experiment import experiment_defaults

    config = experiment_defaults()
    config.update(top)
    return config


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"implicit_enorm": {"weight": -1.0}}, r"config.implicit_enorm.weight must be a finite number >= 0"),
        ({"implicit_enorm": {"weight": 1e-3, "lr_factor": 0.0}}, r"config.implicit_enorm.lr_factor must be"),
        ({"implicit_enorm": {"weight": 1e-3, "speed": 2.0}}, r"config.implicit_enorm has no key 'speed'"),
        (
            {"implicit_enorm": {"weight": 1e-3}, "optimizer": {"wrappers": ("wrs",)}},
            r"config.implicit_enorm.weight > 0 with config.optimizer.wrappers",
        ),
        (
            {
                "implicit_enorm": {"weight": 1e-3},
                "optimizer": {"weight_decay": 1e-3, "weight_decay_mask": "all"},
            },
            r"weight_decay_mask='all'",
        ),
        ({"init_examples": 0}, r"config.init_examples must be an int in \[1, 60000\]"),
        (
            {"optimizer": {"wrappers": ("enorm",), "wrapper_kwargs": {"enorm": {"c": {"hidden": 0.0}}}}},
            r"optimizer.wrapper_kwargs.enorm.c.hidden: c must be > 0",
        ),
        (
            {"optimizer": {"wrappers": ("enorm",), "wrapper_kwargs": {"enorm": {"c": {"middle": 1.2}}}}},
            r"a mapping c takes the keys \('hidden', 'last'\)",
        ),
        (
            {"optimizer": {"wrappers": ("enorm",), "wrapper_kwargs": {"enorm": {"c": (1.2, -1.0)}}}},
            r"enorm.c: c\[1\]",
        ),
        (
            {"optimizer": {"wrappers": ("enorm",), "wrapper_kwargs": {"enorm": {"start": -1}}}},
            r"config.optimizer.wrapper_kwargs.enorm.start must be an int >= 0",
        ),
    ],
)
def test_bad_hook_values_fail_before_training_naming_the_key(top, message):
    config = _config()
    for key, value in top.items():
        if isinstance(value, dict) and key in config:
            with config.unlocked():
                config[key].update(value)
        else:
            with config.unlocked():
                config[key] = value
    with pytest.raises(ValueError, match=message):
        check_hooks(config)


def test_a_per_junction_c_of_the_wrong_length_fails_at_init():
    optimizer = {
        "name": "sgd",
        "learning_rate": 0.1,
        "wrappers": ("enorm",),
        "wrapper_kwargs": {"enorm": {"c": (1.2, 1.2, 1.0)}},
    }
    with pytest.raises(ValueError, match="c has 3 values for the 2 junctions"):
        _run({"num_steps": 1, "optimizer": optimizer})


def test_a_diverging_run_reports_a_nan_loss_instead_of_crashing():
    """The records hold a non-finite loss as the string "nan"; the run's summary is NaN (the
    largest-stable-learning-rate experiment runs into divergence on purpose)."""
    result = _run({"num_steps": 6, "optimizer": {"name": "sgd", "learning_rate": 1e30}})
    losses = [r["loss"] for r in result.history if r["split"] == "train"]
    assert "nan" in losses or "inf" in losses
    assert np.isnan(result.summary["train_loss"])


def _teleport_run(norm, wrap):
    """Six loop steps of SGD momentum on a 2 x 8 MLP: lr 0.1 for updates 1-3, then 0 (so the last
    update moves the params by the teleport alone); ``wrap``: teleport on update 6 only."""
    optimizer = {
        "name": "momentum",
        "learning_rate": 0.1,
        "momentum": 0.9,
        "schedule": "step",
        "boundaries": (0.5,),
        "decay_factor": 0.0,
    }
    if wrap:
        teleport = {"every": 6, "until": 6, "steps": 10, "step_size": 1.0}
        optimizer |= {"wrappers": ("teleportation",), "wrapper_kwargs": {"teleportation": teleport}}
    model = models.create("mlp", num_classes=3, norm=norm, depth=2, width=8)
    return model, _run({"num_steps": 6, "optimizer": optimizer}, model=model)


@pytest.mark.parametrize("norm", ["none", "bn"])
def test_teleportation_wrapper_keeps_the_function_right_after_a_teleport(norm):
    """The teleported params (update 6, after three trained updates) compute the plain run's function
    in training mode (batch statistics) and in inference mode, while the teleport did move them and
    raised ||grad L||^2. On the BN net the junctions are BN gamma / beta -> the next kernel: the
    kernels feeding a BN (an inference-mode-only symmetry) are not moved."""
    model, plain = _teleport_run(norm, wrap=False)
    _, moved = _teleport_run(norm, wrap=True)
    p, q = plain.state.params, moved.state.params
    state = moved.state.opt_state
    scales = np.concatenate([np.asarray(s) for s in state.junction_scales])
    assert len(state.junction_scales) == 2 and np.max(np.abs(np.log(scales))) > 0.05
    before, after = np.asarray(state.objective)
    assert after > before > 0
    x = _data(64, 3)["image"]
    variables = lambda params, run: {"params": params, **run.state.model_state}
    for train_mode in (False, True):
        kwargs = {"mutable": ["batch_stats"]} if train_mode and norm == "bn" else {}
        out = [
            model.apply(variables(params, run), x, train=train_mode, **kwargs)
            for params, run in ((p, plain), (q, moved))
        ]
        if kwargs:
            out = [o[0] for o in out]
        np.testing.assert_allclose(out[1], out[0], rtol=1e-4, atol=1e-5)
    if norm == "bn":  # the kernel feeding BN stays; the next kernel's rows follow gamma (and beta)
        np.testing.assert_array_equal(q["dense_0"]["kernel"], p["dense_0"]["kernel"])
        s = np.asarray(q["dense_0_norm"]["scale"]) / np.asarray(p["dense_0_norm"]["scale"])
        np.testing.assert_allclose(
            q["dense_0_norm"]["bias"], s * np.asarray(p["dense_0_norm"]["bias"]), rtol=1e-5
        )
        np.testing.assert_allclose(q["dense_1"]["kernel"], p["dense_1"]["kernel"] / s[:, None], rtol=1e-5)
        assert np.max(np.abs(np.log(s))) > 0.05
    else:
        assert not np.allclose(q["dense_0"]["kernel"], p["dense_0"]["kernel"])


@pytest.mark.parametrize(
    ("teleport", "message"),
    [
        ({}, r"wrapper_kwargs\.teleportation\.every is required"),
        ({"every": 0}, r"wrapper_kwargs\.teleportation\.every must be an int >= 1"),
        ({"every": 2.0}, r"wrapper_kwargs\.teleportation\.every must be an int >= 1"),
        ({"every": 10, "until": 5}, r"wrapper_kwargs\.teleportation\.until must be None or an int >= every"),
        ({"every": 1, "steps": -1}, r"wrapper_kwargs\.teleportation\.steps must be an int >= 0"),
        ({"every": 1, "step_size": 0.0}, r"wrapper_kwargs\.teleportation\.step_size must be a finite"),
        ({"every": 1, "step_size": float("nan")}, r"wrapper_kwargs\.teleportation\.step_size must be"),
        ({"every": 1, "objective": "sharpness"}, r"wrapper_kwargs\.teleportation\.objective must be one of"),
        ({"every": 1, "objective": len}, r"teleportation\.objective .*passes no batch"),
        ({"every": 1, "max_scale": 1.0}, r"wrapper_kwargs\.teleportation\.max_scale must be None or"),
        ({"every": 1, "power_of_two": 1}, r"wrapper_kwargs\.teleportation\.power_of_two must be"),
        ({"every": 1, "evry": 2}, r"wrapper_kwargs\.teleportation has no key 'evry'"),
    ],
)
def test_bad_teleportation_kwargs_fail_at_config_validation(teleport, message):
    from jaxnorm.train.optimizers import make_optimizer

    optimizer = {"name": "sgd", "wrappers": ("teleportation",), "wrapper_kwargs": {"teleportation": teleport}}
    with pytest.raises(ValueError, match=message):
        check_hooks({"optimizer": optimizer})
    with pytest.raises(ValueError, match=message):
        make_optimizer(optimizer, 10, checking=True)
    late = {**optimizer, "wrappers": ("teleportation", "wrs")}
    with pytest.raises(ValueError, match=r"'teleportation' must be the last wrapper"):
        check_hooks({"optimizer": {**late, "wrapper_kwargs": {"teleportation": {"every": 1}}}})


def test_teleportation_on_a_model_without_symmetries_fails_before_training():
    from jaxnorm.train.setup import teleportation_spec

    model = models.create("mlp", num_classes=3, norm="mp", depth=2, width=8)
    with pytest.raises(ValueError, match=r"'teleportation': .*finds no rescaling symmetry"):
        teleportation_spec(model, _data(8)["image"])
