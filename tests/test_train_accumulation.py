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
