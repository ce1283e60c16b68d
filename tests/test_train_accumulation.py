"""Gradient accumulation through the loop: k micro-batches of b equal one batch of k * b."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from jaxnorm.train import ArraySource, train


class Linear(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        return nn.Dense(4)(x.reshape(x.shape[0], -1))


def test_two_micro_batches_equal_one_double_batch():
    rng = np.random.default_rng(0)
    data = {
        "image": rng.normal(size=(256, 3, 3, 2)).astype(np.float32),
        "label": rng.integers(0, 4, 256).astype(np.int32),
    }
    optimizer = {"name": "momentum", "learning_rate": 0.3, "schedule": "linear", "weight_decay": 1e-3}
    common = {"progress": False, "weight_norms": False, "log_every": 1}
    big = train(
        {**common, "num_steps": 6, "optimizer": optimizer},
        model=Linear(),
        train_data=ArraySource(data, 64, seed=1),
    )
    small = train(
        {**common, "num_steps": 12, "optimizer": {**optimizer, "accumulate_steps": 2}},
        model=Linear(),
        train_data=ArraySource(data, 32, seed=1),
    )
    for a, b in zip(jax.tree.leaves(big.state.params), jax.tree.leaves(small.state.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the learning rate follows updates, not micro-steps
    lrs_big = [r["lr"] for r in big.history]
    lrs_small = [r["lr"] for r in small.history]
    assert lrs_small[::2] == pytest.approx(lrs_big) and lrs_small[1::2] == pytest.approx(lrs_big)


def test_accumulating_micro_steps_leave_the_transported_statistics_alone():
    """A rescaling wrapper (here BWN to norm 3) under ``accumulate_steps``: the BN running statistics
    follow the kernels at an update and stay put on the micro-steps that only accumulate (they were
    divided again by the last update's ``s^2`` on every such micro-step: var 12.3 -> 151.7 -> 1868).
    ``bn_momentum`` ~ 1 and lr 1e-9 keep the statistics at the transport's alone."""
    from jaxnorm import models

    rng = np.random.default_rng(0)
    data = {"image": rng.normal(size=(256, 6)).astype(np.float32), "label": rng.integers(0, 3, 256)}

    def variance(num_steps, accumulate, batch):
        model = models.create("mlp", num_classes=3, norm="bn", depth=2, width=8, bn_momentum=0.999999)
        optimizer = {"name": "sgd", "learning_rate": 1e-9, "accumulate_steps": accumulate,
                     "wrappers": ("bwn",), "wrapper_kwargs": {"bwn": {"rho": 3.0}}}
        config = {"num_steps": num_steps, "progress": False, "weight_norms": False, "plots": False,
                  "optimizer": optimizer}
        source = ArraySource({**data, "label": data["label"].astype(np.int32)}, batch, shuffle=False)
        stats = train(config, model=model, train_data=source).state.model_state["batch_stats"]
        layers = jax.tree.leaves(stats, is_leaf=lambda s: "var" in s)
        return np.concatenate([np.asarray(s["var"]) for s in layers])

    one_update = variance(1, 1, 64)
    assert not np.allclose(one_update, 1.0)  # the transport moved them
    for num_steps, accumulate in ((4, 2), (6, 2), (6, 3)):
        np.testing.assert_allclose(variance(num_steps, accumulate, 32), one_update, rtol=1e-4,
                                   err_msg=f"{num_steps} micro-steps, accumulate_steps={accumulate}")


@pytest.mark.parametrize(
    ("num_steps", "optimizer", "message"),
    [
        (3, {"accumulate_steps": 4}, r"3 steps are not a multiple of config.optimizer.accumulate_steps=4"),
        (9, {"accumulate_steps": 2}, r"the last 1 micro-steps would be accumulated and never applied"),
        (8, {"accumulate_steps": 2, "warmup_steps": 6},
         r"warmup_steps=6 must be in \[0, 4\) \(the run has 4 updates of 2 micro-steps\)"),
        (8, {"accumulate_steps": 0}, r"accumulate_steps must be an int >= 1, got 0"),
        (8, {"accumulate_steps": True}, r"accumulate_steps must be an int >= 1, got True"),
    ],
)
def test_accumulation_that_cannot_apply_its_micro_steps_is_refused(num_steps, optimizer, message):
    """Before the first step, naming the key: a run shorter than one update trained nothing (reported
    finished), a remainder of micro-steps was silently dropped, warmup was checked against micro-steps
    although the schedule counts updates (the error came from the optimizer, in other words)."""
    data = {"image": np.zeros((64, 3, 3, 2), np.float32), "label": np.zeros(64, np.int32)}
    config = {"num_steps": num_steps, "progress": False, "optimizer": {"name": "sgd", **optimizer}}
    with pytest.raises(ValueError, match=message):
        train(config, model=Linear(), train_data=ArraySource(data, 16))
