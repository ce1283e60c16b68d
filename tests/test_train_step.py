"""Train / eval steps against float64 NumPy oracles; mixed precision and loss scaling."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm.train import (
    LossScale,
    adjust_loss_scale,
    create_train_state,
    initial_loss_scale,
    make_eval_step,
    make_train_step,
)


class Linear(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        return nn.Dense(3, param_dtype=x.dtype)(x.reshape(x.shape[0], -1))


class BNNet(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        x = nn.Dense(8)(x.reshape(x.shape[0], -1))
        x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)
        return nn.Dense(3)(nn.relu(x))


def _softmax_xent_grad(w, b, x, y):
    """float64 NumPy: mean cross-entropy of softmax(x w + b) and its gradients."""
    logits = x @ w + b
    logits = logits - logits.max(1, keepdims=True)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y]).mean()
    d = p.copy()
    d[np.arange(n), y] -= 1
    d /= n
    return loss, x.T @ d, d.sum(0)


def test_sgd_step_matches_numpy_oracle(x64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 5))
    y = rng.integers(0, 3, 16).astype(np.int32)
    model, tx = Linear(), optax.sgd(0.3)
    state = create_train_state(model.init, tx, jax.random.PRNGKey(0), jnp.asarray(x))
    w = np.asarray(state.params["Dense_0"]["kernel"])
    b = np.asarray(state.params["Dense_0"]["bias"])
    step = jax.jit(make_train_step(model.apply, tx, schedule=optax.constant_schedule(0.3), grad_norm=True))
    new, metrics = step(state, {"image": jnp.asarray(x), "label": jnp.asarray(y)})
    loss, gw, gb = _softmax_xent_grad(w, b, x, y)
    np.testing.assert_allclose(new.params["Dense_0"]["kernel"], w - 0.3 * gw, rtol=1e-12)
    np.testing.assert_allclose(new.params["Dense_0"]["bias"], b - 0.3 * gb, rtol=1e-12)
    assert float(metrics["loss"]) == pytest.approx(loss, rel=1e-12)
    assert float(metrics["grad_norm"]) == pytest.approx(np.sqrt((gw**2).sum() + (gb**2).sum()))
    assert float(metrics["lr"]) == pytest.approx(0.3)
    assert int(new.step) == 1


def test_padding_copies_are_out_of_the_loss_its_gradient_and_the_metrics(x64):
    """A partial last batch filled with masked copies (``ArraySource(drop_remainder=False)``): the step
    is the SGD step on the real examples alone (float64 oracle), and so are its loss and accuracy; it
    was the plain mean over the copies too (loss 1.2178 for 1.2172 in the hunt's repro)."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(5, 5)), rng.integers(0, 3, 5).astype(np.int32)
    padded_x = np.concatenate([x, np.repeat(x[:1], 11, 0)])
    padded_y = np.concatenate([y, np.repeat(y[:1], 11)])
    mask = (np.arange(16) < 5).astype(np.float32)
    model, tx = Linear(), optax.sgd(0.3)
    state = create_train_state(model.init, tx, jax.random.PRNGKey(0), jnp.asarray(x))
    w, b = (np.asarray(state.params["Dense_0"][k]) for k in ("kernel", "bias"))
    batch = {"image": jnp.asarray(padded_x), "label": jnp.asarray(padded_y), "mask": jnp.asarray(mask)}
    new, metrics = jax.jit(make_train_step(model.apply, tx))(state, batch)
    loss, gw, gb = _softmax_xent_grad(w, b, x, y)
    np.testing.assert_allclose(new.params["Dense_0"]["kernel"], w - 0.3 * gw, rtol=1e-12)
    np.testing.assert_allclose(new.params["Dense_0"]["bias"], b - 0.3 * gb, rtol=1e-12)
    assert float(metrics["loss"]) == pytest.approx(loss, rel=1e-12)
    correct = np.argmax(x @ w + b, 1) == y
    assert float(metrics["accuracy"]) == pytest.approx(correct.mean(), rel=1e-7)  # float32


def test_padding_copies_across_more_devices_than_real_examples(x64):
    """Under pmap each device divides its sum by the devices' mean count: 3 real examples over 8 devices
    (a partial last batch) must still give the SGD step on those 3, not on their sum over 8 (the mean
    count 3/8 was rounded up to 1: loss and gradient divided by the devices). ``vmap`` with an
    ``axis_name`` stands for the devices."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(3, 5)), rng.integers(0, 3, 3).astype(np.int32)
    padded_x = np.concatenate([x, np.repeat(x[:1], 13, 0)]).reshape(8, 2, 5)
    padded_y = np.concatenate([y, np.repeat(y[:1], 13)]).reshape(8, 2)
    mask = (np.arange(16) < 3).astype(np.float32).reshape(8, 2)
    model, tx = Linear(), optax.sgd(0.3)
    state = create_train_state(model.init, tx, jax.random.PRNGKey(0), jnp.asarray(x))
    w, b = (np.asarray(state.params["Dense_0"][k]) for k in ("kernel", "bias"))
    batch = {"image": jnp.asarray(padded_x), "label": jnp.asarray(padded_y), "mask": jnp.asarray(mask)}
    step = make_train_step(model.apply, tx, axis_name="devices")
    new, metrics = jax.jit(jax.vmap(step, in_axes=(None, 0), axis_name="devices"))(state, batch)
    loss, gw, gb = _softmax_xent_grad(w, b, x, y)
    np.testing.assert_allclose(new.params["Dense_0"]["kernel"][0], w - 0.3 * gw, rtol=1e-12)
    np.testing.assert_allclose(new.params["Dense_0"]["bias"][0], b - 0.3 * gb, rtol=1e-12)
    assert float(metrics["loss"][0]) == pytest.approx(loss, rel=1e-12)


def _bn_setup():
    rng = np.random.default_rng(1)
    x = rng.normal(2.0, 3.0, size=(32, 4)).astype(np.float32)
    y = rng.integers(0, 3, 32).astype(np.int32)
    model, tx = BNNet(), optax.sgd(0.1)
    state = create_train_state(model.init, tx, jax.random.PRNGKey(0), jnp.asarray(x[:1]))
    return model, tx, state, {"image": jnp.asarray(x), "label": jnp.asarray(y)}


def test_train_step_updates_running_statistics():
    model, tx, state, batch = _bn_setup()
    new, _ = jax.jit(make_train_step(model.apply, tx))(state, batch)
    hidden = batch["image"] @ state.params["Dense_0"]["kernel"] + state.params["Dense_0"]["bias"]
    # momentum 0.5: running = 0.5 * init + 0.5 * batch statistic
    np.testing.assert_allclose(
        new.model_state["batch_stats"]["BatchNorm_0"]["mean"], 0.5 * hidden.mean(0), rtol=1e-4
    )


def test_eval_uses_running_statistics_and_ignores_padding():
    model, tx, state, batch = _bn_setup()
    state, _ = jax.jit(make_train_step(model.apply, tx))(state, batch)
    eval_step = jax.jit(make_eval_step(model.apply))
    full = eval_step(state, batch)
    # the same first 20 examples, padded with garbage to 32 and masked
    padded = {
        "image": batch["image"].at[20:].set(1e3),
        "label": batch["label"],
        "mask": (jnp.arange(32) < 20).astype(jnp.float32),
    }
    part = eval_step(state, padded)
    head = eval_step(state, {k: v[:20] for k, v in batch.items()})
    assert float(part["count"]) == 20.0
    np.testing.assert_allclose(part["loss_sum"], head["loss_sum"], rtol=1e-5)
    assert float(part["correct"]) == float(head["correct"])
    # running statistics, not batch statistics: per-example logits do not depend on the batch
    logits = model.apply(state.variables, batch["image"], train=False)
    logits_one = model.apply(state.variables, batch["image"][:1], train=False)
    np.testing.assert_allclose(logits[:1], logits_one, rtol=1e-5)
    assert float(full["count"]) == 32.0


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_mixed_precision_keeps_float32_master_state(precision):
    model, tx, state, batch = _bn_setup()
    state = state._replace(loss_scale=initial_loss_scale(precision))
    step = jax.jit(make_train_step(model.apply, tx, precision=precision))
    new, metrics = step(state, batch)
    for leaf in jax.tree.leaves((new.params, new.model_state)):
        assert leaf.dtype == jnp.float32
    _, ref_metrics = jax.jit(make_train_step(model.apply, tx))(state, batch)
    assert float(metrics["loss"]) == pytest.approx(float(ref_metrics["loss"]), rel=0.05)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(new.params))


def test_float16_overflow_skips_the_update_and_halves_the_scale():
    model, tx, state, batch = _bn_setup()
    state = state._replace(loss_scale=LossScale(jnp.float32(2.0**60), jnp.int32(5)))
    new, _ = jax.jit(make_train_step(model.apply, tx, precision="float16"))(state, batch)
    assert float(new.loss_scale.scale) == 2.0**59
    assert int(new.loss_scale.good_steps) == 0
    chex_equal = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), new.params, state.params)
    assert all(jax.tree.leaves(chex_equal))
    assert int(new.step) == 1


def _optimizer_update_count(opt_state, accumulate):
    """The update count that the learning-rate schedule inside ``opt_state`` reads (optax's own)."""
    if accumulate > 1:
        return int(opt_state.gradient_step)
    return int(opt_state[-1].count)  # sgd(schedule) = chain(trace, scale_by_learning_rate)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_recorded_lr_is_the_rate_of_the_update_after_float16_skips(accumulate):
    """A step skipped for overflow keeps the optimizer state, so the schedule's count stays; the
    recorded ``lr`` used to be the schedule at the loop's step, ahead by one per skip."""
    model, _, state, batch = _bn_setup()
    schedule = optax.linear_schedule(1.0, 0.1, 12)
    tx = optax.sgd(schedule, momentum=0.9)
    if accumulate > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=accumulate).gradient_transformation()
    state = create_train_state(model.init, tx, jax.random.PRNGKey(0), batch["image"])
    state = state._replace(loss_scale=initial_loss_scale("float16", init_scale=2.0**22))
    step = jax.jit(
        make_train_step(model.apply, tx, schedule=schedule, precision="float16", accumulate_steps=accumulate)
    )
    recorded, used, scales = [], [], []
    for _ in range(12):
        used.append(float(schedule(_optimizer_update_count(state.opt_state, accumulate))))
        scales.append(float(state.loss_scale.scale))
        state, metrics = step(state, batch)
        recorded.append(float(metrics["lr"]))
    skips = sum(a > b for a, b in zip(scales, [*scales[1:], float(state.loss_scale.scale)], strict=True))
    assert skips >= 2, "the test needs overflows"
    np.testing.assert_allclose(recorded, used, rtol=1e-6)
    assert int(state.loss_scale.skipped) == int(metrics["skipped_steps"]) == skips


def test_loss_scale_grows_after_a_period_of_finite_steps():
    state = LossScale(jnp.float32(8.0), jnp.int32(0))
    for _ in range(3):
        state = adjust_loss_scale(state, jnp.array(True), period=4)
    assert float(state.scale) == 8.0 and int(state.good_steps) == 3
    state = adjust_loss_scale(state, jnp.array(True), period=4)
    assert float(state.scale) == 16.0 and int(state.good_steps) == 0
    state = adjust_loss_scale(LossScale(jnp.float32(1.0), jnp.int32(2)), jnp.array(False))
    assert float(state.scale) == 1.0  # never below 1


def test_bad_precision_is_rejected():
    with pytest.raises(ValueError, match="precision must be one of"):
        make_train_step(Linear().apply, optax.sgd(0.1), precision="float8")


class SlowAverage(nn.Module):
    """A running average with momentum 0.999 of a batch mean near 1.01: each step moves it by about
    1e-5, far below bfloat16's resolution near 1 (2**-7), so only a float32 update registers."""

    @nn.compact
    def __call__(self, x, train):
        x = x.reshape(x.shape[0], -1)
        avg = self.variable("batch_stats", "avg", lambda: jnp.ones((), jnp.float32))
        if train:
            avg.value = 0.999 * avg.value + 0.001 * 1.01
        return nn.Dense(3)(x) * avg.value


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_running_statistics_update_in_float32_under_low_precision(precision):
    """Issue 16.4: the step used to cast batch_stats to the compute dtype, so running averages
    were computed in bf16 / f16 (eval accuracy lost with BN momentum 0.99)."""
    model = SlowAverage()
    x = jnp.ones((4, 2), jnp.float32)
    tx = optax.sgd(0.0)
    state = create_train_state(model.init, tx, jax.random.PRNGKey(0), x)
    state = state._replace(loss_scale=initial_loss_scale(precision))
    step = jax.jit(make_train_step(model.apply, tx, precision=precision))
    new, _ = step(state, {"image": x, "label": jnp.zeros((4,), jnp.int32)})
    assert new.model_state["batch_stats"]["avg"].dtype == jnp.float32
    assert float(new.model_state["batch_stats"]["avg"]) == pytest.approx(1.00001, abs=1e-6)


class NoBiasBNNet(nn.Module):
    """A kernel feeding a BatchNorm directly: its rescaling is exact for BN's running statistics."""

    @nn.compact
    def __call__(self, x, train):
        x = nn.Dense(8, use_bias=False, kernel_init=nn.initializers.normal(5.0))(x.reshape(x.shape[0], -1))
        x = nn.BatchNorm(use_running_average=not train, momentum=0.5, epsilon=1e-9)(x)
        return nn.Dense(3)(nn.relu(x))


def test_rescaling_steps_carry_the_running_statistics_along():
    """WRS divides the hidden kernel by s ~ 10 at the first update (lr 0, so nothing else moves): with
    the loop's transport the eval-mode logits are those of the unrescaled network; without it they jump."""
    from jaxnorm import optim
    from jaxnorm.train.setup import batch_stats_transport

    rng = np.random.default_rng(2)
    batch = {"image": jnp.asarray(rng.normal(1.0, 2.0, (32, 4)), jnp.float32),
             "label": jnp.asarray(rng.integers(0, 3, 32), jnp.int32)}
    model = NoBiasBNNet()
    init = lambda tx: create_train_state(model.init, tx, jax.random.PRNGKey(0), batch["image"][:1])
    def hidden_only(params):
        return {name: jax.tree.map(lambda _, n=name: n == "Dense_0", v) for name, v in params.items()}

    wrs = optax.chain(optax.sgd(0.0), optim.weight_rescaling(1, mask=hidden_only))
    state = init(wrs)
    transport = batch_stats_transport({}, model=model, images=batch["image"], opt_state=state.opt_state)
    assert transport is not None
    assert batch_stats_transport({"transport_batch_stats": False}, model=model, images=batch["image"],
                                 opt_state=state.opt_state) is None
    plain_state = init(optax.sgd(0.0))
    assert batch_stats_transport({}, model=model, images=batch["image"],
                                 opt_state=plain_state.opt_state) is None  # nothing rescales

    def eval_logits(s):
        return model.apply({"params": s.params, **s.model_state}, batch["image"], train=False)

    reference, _ = make_train_step(model.apply, optax.sgd(0.0))(plain_state, batch)
    carried, _ = make_train_step(model.apply, wrs, stats_transport=transport)(state, batch)
    stale, _ = make_train_step(model.apply, wrs)(state, batch)
    norms = jnp.linalg.norm(carried.params["Dense_0"]["kernel"], axis=0)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)  # WRS did rescale, by about 10
    assert float(jnp.linalg.norm(state.params["Dense_0"]["kernel"], axis=0).min()) > 3
    np.testing.assert_allclose(eval_logits(carried), eval_logits(reference), rtol=1e-4, atol=1e-4)
    assert float(jnp.abs(eval_logits(stale) - eval_logits(reference)).max()) > 0.1


def test_correct_predictions_is_nan_only_where_the_largest_logit_is_undefined():
    """NaN logits (argmax picks class 0) and a tie at +inf have no prediction; -inf logits (log-
    probabilities) and one +inf do: a float16 run whose logits held -inf scored NaN at finite loss."""
    from jaxnorm.train import correct_predictions

    inf, nan = jnp.inf, jnp.nan
    logits = jnp.array(
        [[nan, 1.0, 0.0], [-inf, 0.0, -inf], [inf, 0.0, inf], [0.0, inf, 1.0], [2.0, 1.0, 0.0]]
    )
    got = correct_predictions(logits, jnp.array([0, 1, 0, 1, 1]))
    np.testing.assert_array_equal(got, [nan, 1.0, nan, 1.0, 0.0])
