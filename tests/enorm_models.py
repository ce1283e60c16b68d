"""Small Flax networks for the ENorm tests (fast on CPU)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Dtype = Any


class MLP(nn.Module):
    """Dense + activation stack (``widths`` hidden layers, ``out`` logits)."""

    widths: Sequence[int] = (6, 7, 5)
    out: int = 3
    act: Callable = nn.relu
    use_bias: bool = True
    final_bn: bool = False
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        for w in self.widths:
            x = self.act(nn.Dense(w, use_bias=self.use_bias, param_dtype=self.dtype)(x))
        x = nn.Dense(self.out, use_bias=self.use_bias, param_dtype=self.dtype)(x)
        if self.final_bn:
            x = nn.BatchNorm(use_running_average=True, param_dtype=self.dtype)(x)
        return x


class CNN(nn.Module):
    """Conv stack with max / average pooling, strides, dilation, leaky ReLU, then flatten + Dense."""

    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        conv = lambda f, **kw: nn.Conv(f, param_dtype=self.dtype, **kw)
        x = nn.relu(conv(4, kernel_size=(3, 3))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.leaky_relu(conv(5, kernel_size=(3, 3), strides=(2, 2), padding="VALID")(x), 0.1)
        x = nn.relu(conv(6, kernel_size=(2, 2), kernel_dilation=(2, 2))(x))
        x = nn.avg_pool(x, (2, 2), strides=(1, 1), padding="SAME")
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(7, param_dtype=self.dtype)(x))
        return nn.Dense(3, param_dtype=self.dtype)(x)


class VGG(nn.Module):
    """VGG-style stack without BN: conv-conv-maxpool blocks, flatten, two dense layers."""

    widths: Sequence[int] = (4, 6)
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        for w in self.widths:
            for _ in range(2):
                x = nn.relu(nn.Conv(w, (3, 3), param_dtype=self.dtype)(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(8, param_dtype=self.dtype)(x))
        return nn.Dense(3, param_dtype=self.dtype)(x)


class ResNetC(nn.Module):
    """ResNet with type-C (learned 1x1 conv) shortcuts and no normalization (paper Sec. 4.3)."""

    stages: Sequence[int] = (4, 6)
    blocks: int = 2
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        conv = lambda f, k, s=1, name=None: nn.Conv(
            f, (k, k), strides=(s, s), param_dtype=self.dtype, name=name
        )
        x = nn.relu(conv(self.stages[0], 3, name="stem")(x))
        for i, width in enumerate(self.stages):
            for b in range(self.blocks):
                stride = 2 if i > 0 and b == 0 else 1
                h = nn.relu(conv(width, 3, stride, name=f"s{i}b{b}_conv1")(x))
                h = conv(width, 3, name=f"s{i}b{b}_conv2")(h)
                x = nn.relu(h + conv(width, 1, stride, name=f"s{i}b{b}_short")(x))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(3, param_dtype=self.dtype, name="head")(x)


class ResNetId(nn.Module):
    """ResNet with identity shortcuts inside a stage and a 1x1 projection between stages."""

    stages: Sequence[int] = (4, 6)
    blocks: int = 2
    bn: bool = False
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        def conv(f, k, s=1, name=None):
            return nn.Conv(f, (k, k), strides=(s, s), use_bias=not self.bn,
                           param_dtype=self.dtype, name=name)

        def norm(h, name):
            if not self.bn:
                return h
            return nn.BatchNorm(use_running_average=not train, param_dtype=self.dtype, name=name)(h)

        x = nn.relu(norm(conv(self.stages[0], 3, name="stem")(x), "stem_bn"))
        for i, width in enumerate(self.stages):
            if i > 0:
                x = nn.relu(norm(conv(width, 1, 2, name=f"proj{i}")(x), f"proj{i}_bn"))
            for b in range(self.blocks):
                h = nn.relu(norm(conv(width, 3, name=f"s{i}b{b}_conv1")(x), f"s{i}b{b}_bn1"))
                h = norm(conv(width, 3, name=f"s{i}b{b}_conv2")(h), f"s{i}b{b}_bn2")
                x = nn.relu(x + h)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(3, param_dtype=self.dtype, name="head")(x)


class Concat(nn.Module):
    """Two convolution branches concatenated along channels, a grouped conv, then a head."""

    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        a = nn.relu(nn.Conv(3, (3, 3), param_dtype=self.dtype)(x))
        b = nn.relu(nn.Conv(5, (1, 1), param_dtype=self.dtype)(x))
        h = jnp.concatenate([a, b], axis=-1)
        h = nn.relu(nn.Conv(4, (3, 3), feature_group_count=2, param_dtype=self.dtype)(h))
        return nn.Dense(2, param_dtype=self.dtype)(jnp.mean(h, axis=(1, 2)))


class LayerNormMLP(nn.Module):
    """Dense -> LayerNorm -> ReLU -> Dense: the LayerNorm cancels the first layer's scaling."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.LayerNorm()(nn.Dense(5)(x)))
        return nn.Dense(2)(x)


class Softmax(nn.Module):
    """Dense -> softmax -> Dense."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(jax.nn.softmax(nn.Dense(5)(x)))


class BNMLP(nn.Module):
    """Dense -> BN (normalization, gamma, beta) -> ReLU -> Dense -> ReLU -> Dense."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(5, use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
        x = nn.relu(nn.Dense(4)(x))
        return nn.Dense(2)(x)


def init(model: nn.Module, shape: Sequence[int], seed: int = 0, dtype: Dtype = jnp.float32):
    """``(variables, x)`` for ``model`` on a random input of ``shape``; 1-D params jittered away
    from flax's zero-bias / unit-scale init so that biases matter."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(tuple(shape)), dtype)
    variables = dict(jax.jit(model.init)(jax.random.key(seed), x))
    variables["params"] = jax.tree.map(
        lambda v: v + jnp.asarray(0.1 * rng.standard_normal(v.shape), v.dtype) if v.ndim == 1 else v,
        variables["params"],
    )
    return variables, x


# ---------------------------------------------------------------------------------------------
# NNX twins (flax.nnx) and linen models the bare call must not silently change.


class GeluMLP(nn.Module):
    """Dense -> GELU -> Dense -> tanh -> Dense: no rescaling symmetry at all."""

    @nn.compact
    def __call__(self, x):
        x = nn.gelu(nn.Dense(6)(x))
        x = jnp.tanh(nn.Dense(6)(x))
        return nn.Dense(3)(x)


class SetupMLP(nn.Module):
    """ReLU layers defined in ``setup()`` whose name order (a, b) is not their call order (b, a)."""

    def setup(self):
        self.a = nn.Dense(5)
        self.b = nn.Dense(5)
        self.head = nn.Dense(5)

    def __call__(self, x):
        return self.head(nn.relu(self.a(nn.relu(self.b(x)))))


def nnx_models():
    """``{name: (model, x)}`` of small NNX networks (MLP, CNN, residual block, CNN with BN)."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs, widths=(4, 6, 5, 3)):
            self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs)
                                    for a, b in itertools.pairwise(widths)])

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = nnx.relu(layer(x))
            return self.layers[-1](x)

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(2, 4, (3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(4, 5, (3, 3), strides=(2, 2), rngs=rngs)
            self.linear1 = nnx.Linear(5 * 3 * 3, 6, rngs=rngs)
            self.linear2 = nnx.Linear(6, 3, rngs=rngs)

        def __call__(self, x):
            x = nnx.max_pool(nnx.relu(self.conv1(x)), (2, 2), strides=(2, 2))
            x = nnx.relu(self.conv2(x))
            x = nnx.relu(self.linear1(x.reshape((x.shape[0], -1))))
            return self.linear2(x)

    class Residual(nnx.Module):
        def __init__(self, rngs):
            self.stem = nnx.Conv(3, 4, (3, 3), rngs=rngs)
            self.conv1 = nnx.Conv(4, 4, (3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(4, 4, (3, 3), rngs=rngs)
            self.head = nnx.Linear(4, 3, rngs=rngs)

        def __call__(self, x):
            x = nnx.relu(self.stem(x))
            x = nnx.relu(x + self.conv2(nnx.relu(self.conv1(x))))
            return self.head(x.mean(axis=(1, 2)))

    class BNCNN(nnx.Module):
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(3, 4, (3, 3), use_bias=False, rngs=rngs)
            self.bn1 = nnx.BatchNorm(4, rngs=rngs)
            self.conv2 = nnx.Conv(4, 5, (3, 3), use_bias=False, rngs=rngs)
            self.bn2 = nnx.BatchNorm(5, rngs=rngs)
            self.head = nnx.Linear(5, 3, rngs=rngs)

        def __call__(self, x):
            x = nnx.relu(self.bn1(self.conv1(x)))
            x = nnx.relu(self.bn2(self.conv2(x)))
            return self.head(x.mean(axis=(1, 2)))

    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    out = {"mlp": (MLP(nnx.Rngs(0)), normal(4, 4)), "cnn": (CNN(nnx.Rngs(1)), normal(2, 12, 12, 2)),
           "residual": (Residual(nnx.Rngs(2)), normal(2, 6, 6, 3)),
           "bn_cnn": (BNCNN(nnx.Rngs(3)), normal(4, 6, 6, 3))}
    for model, _ in out.values():  # biases away from zero, so that they matter
        for _path, var in nnx.iter_graph(model):
            if isinstance(var, nnx.Param) and var[...].ndim == 1:
                var[...] = var[...] + 0.1 * normal(*var[...].shape)
    return out


def nnx_apply(model):
    """``(apply, params, rest)``: a pure ``apply(params, x)`` of an NNX model (eval mode) and its
    ``nnx.Param`` state and other state, via ``nnx.split`` / ``nnx.merge``."""
    from flax import nnx

    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def apply(p, x):
        return nnx.merge(graphdef, p, rest)(x)

    return apply, params, rest
