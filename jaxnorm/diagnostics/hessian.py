"""Top Hessian eigenvalue of a loss by power iteration or Lanczos on Hessian-vector products.

Gradient descent on a quadratic with curvature ``lambda_max`` is stable only for
``eta < 2 / lambda_max``; normalization layers change ``lambda_max`` (the loss-landscape view of
batch norm, Santurkar et al., *How does batch normalization help optimization?*, NeurIPS 2018;
Arpit, *Normalization techniques*, slides 001, Sec. 7). ``H v`` is computed without forming ``H``,
as forward-over-reverse differentiation ``jvp(grad(L), (p,), (v,))`` (Pearlmutter 1994).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from jaxnorm.functional.checks import is_int

__all__ = ["HessianEigen", "check_float_params", "hessian_top_eigenvalue", "hvp", "scaled_l2_norm"]

PyTree = Any


class HessianEigen(NamedTuple):
    """``eigenvalue`` (scalar) and a unit-norm ``eigenvector`` with the params' structure."""

    eigenvalue: jax.Array
    eigenvector: PyTree


def hvp(loss_fn: Callable[..., jax.Array], params: PyTree, vector: PyTree, *args, **kwargs) -> PyTree:
    """Hessian-vector product ``(d^2 L / d p^2) v`` of ``L = loss_fn(params, *args, **kwargs)``."""
    grad_fn = jax.grad(lambda p: loss_fn(p, *args, **kwargs))
    return jax.jvp(grad_fn, (params,), (vector,))[1]


def check_float_params(params: PyTree, caller: str) -> None:
    """``ValueError`` naming ``caller`` and the leaf's path for a params leaf that is not floating point
    (``jax.grad`` would fail on it with a raw dtype error)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise ValueError(
                f"{caller}: params{jax.tree_util.keystr(path)} has dtype {jnp.result_type(leaf)}; every "
                "params leaf must be floating point (close over integer or boolean state in loss_fn instead)"
            )


def hessian_top_eigenvalue(
    loss_fn: Callable[..., jax.Array],
    params: PyTree,
    *args,
    key: jax.Array,
    num_iters: int = 20,
    method: Literal["lanczos", "power"] = "lanczos",
    **kwargs,
) -> HessianEigen:
    """Largest Hessian eigenvalue of ``L = loss_fn(params, *args, **kwargs)`` at ``params``.

    * ``method="lanczos"``: at most ``num_iters`` Lanczos steps from a random start ``q_0``:
      ``w = H q_i``, ``alpha_i = q_i^T w``, ``w`` re-orthogonalised against all of ``q_0 .. q_i``
      (classical Gram-Schmidt, twice), ``beta_i = ||w||``, ``q_{i+1} = w / beta_i``. Returns the
      largest eigenvalue of the tridiagonal ``T_k`` of the ``k`` steps taken (the largest
      *algebraic* eigenvalue, converging from below) and its Ritz vector. The recursion stops
      (breakdown) once ``beta_i <= sqrt(n) eps max_{j <= i} ||H q_j||`` (``n`` parameters, ``eps``
      the machine epsilon of the computation dtype): the Krylov space is then invariant up to
      rounding and ``T_k`` holds all the eigenvalues it can see (exactly the distinct eigenvalues
      of ``H`` present in ``q_0``, e.g. ``k <= batch size`` for a least-squares loss). Continuing
      would orthonormalise rounding noise. Dropping a coupling that small moves the eigenvalues by
      at most that much (Weyl), i.e. below the rounding level of the Hessian-vector products.
    * ``method="power"``: ``v <- H v / ||H v||`` ``num_iters`` times, then the Rayleigh quotient
      ``v^T H v``: the eigenvalue of largest *magnitude* (it can be negative at a saddle). If
      ``lambda`` and ``-lambda`` both have that magnitude it does not converge, and the quotient can
      be anywhere in ``[-lambda, lambda]`` depending on ``key``; use Lanczos there.

    Norms are taken on the vector divided by its largest magnitude, so Hessians with entries near
    the float32 range limits (1e-20 or 1e20) neither underflow nor overflow. Each iteration costs one
    Hessian-vector product (none after a Lanczos breakdown, except under ``vmap``, where both
    branches of the skip run). Jit-able (``num_iters`` and ``method`` static).

    Args:
      loss_fn: scalar loss ``loss_fn(params, *args, **kwargs)``.
      params: point at which the Hessian is taken; a pytree with at least one array element.
      *args, **kwargs: passed on to ``loss_fn`` (e.g. a batch).
      key: PRNG key for the start vector (``jax.random.key`` or a legacy ``PRNGKey``).
      num_iters: Hessian-vector products, a positive int (Python or NumPy).
      method: ``"lanczos"`` or ``"power"``.

    Raises:
      ValueError: ``method``, ``num_iters`` or ``key`` invalid, ``params`` without elements or with a
        leaf that is not floating point (the message names the leaf).
    """
    if method not in ("lanczos", "power"):
        raise ValueError(f"hessian_top_eigenvalue: method must be 'lanczos' or 'power', got {method!r}")
    if not is_int(num_iters) or num_iters < 1:
        raise ValueError(f"hessian_top_eigenvalue: num_iters must be a positive int, got {num_iters!r}")
    num_iters = int(num_iters)
    _check_key(key)
    check_float_params(params, "hessian_top_eigenvalue")
    flat, unravel = ravel_pytree(params)
    if flat.size == 0:
        raise ValueError(
            f"hessian_top_eigenvalue: params must hold at least one array element, got {params!r}"
        )
    if not jnp.issubdtype(flat.dtype, jnp.inexact):
        raise ValueError(f"hessian_top_eigenvalue: params must be floating point, got dtype {flat.dtype}")
    dtype = jnp.promote_types(flat.dtype, jnp.float32)

    def matvec(v):
        product = hvp(loss_fn, params, unravel(v.astype(flat.dtype)), *args, **kwargs)
        return ravel_pytree(product)[0].astype(dtype)

    start = jax.random.normal(key, flat.shape, dtype)
    start = start / scaled_l2_norm(start)
    if method == "power":
        return _power(matvec, start, num_iters, unravel)
    return _lanczos(matvec, start, min(num_iters, flat.size), unravel)


def _check_key(key: object) -> None:
    """A typed PRNG key array (``jax.random.key``) or a legacy ``uint32[2]`` key (``PRNGKey``)."""
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key) and shape == ():
        return
    if dtype == jnp.uint32 and shape == (2,):
        return
    raise ValueError(
        "hessian_top_eigenvalue: key must be a single PRNG key (jax.random.key(seed) or "
        f"jax.random.PRNGKey(seed)), got {key!r}"
    )


def scaled_l2_norm(v: jax.Array) -> jax.Array:
    """``||v||_2`` as ``2^e ||v 2^-e||_2`` with ``2^e`` just above ``max |v|`` (``e`` clamped so that
    ``2^-e`` is a normal number): an exact scaling, so the squares neither overflow nor underflow."""
    bound = -jnp.finfo(v.dtype).minexp - 1
    exponent = jnp.clip(jnp.frexp(jnp.max(jnp.abs(v)))[1], -bound, bound)
    one = jnp.ones((), v.dtype)
    return jnp.sqrt(jnp.sum(jnp.square(v * jnp.ldexp(one, -exponent)))) * jnp.ldexp(one, exponent)


def _power(matvec, start, num_iters, unravel) -> HessianEigen:
    def step(_, v):
        hv = matvec(v)
        norm = scaled_l2_norm(hv)
        return jnp.where(norm > 0, hv / jnp.where(norm > 0, norm, 1.0), v)

    v = jax.lax.fori_loop(0, num_iters, step, start)
    return HessianEigen(jnp.vdot(v, matvec(v)), unravel(v))


def _lanczos(matvec, start, m, unravel) -> HessianEigen:
    """Lanczos with full re-orthogonalisation and a breakdown test; ``m`` steps at most.

    The carry holds ``size``, the number of steps taken (the order ``k`` of ``T_k``); after a
    breakdown the remaining iterations skip the product and leave their rows empty. ``T`` is then
    built divided by ``s = max_j ||H q_j||``, which bounds every ``|alpha_j|`` and ``beta_j`` (so the
    scaled entries lie in [-1, 1] and ``eigh`` sees no extreme values), with rows ``>= k`` decoupled
    (``beta = 0``) and their diagonal set to ``min(alpha_0 .. alpha_{k-1}) / s - 1``: strictly below
    the largest eigenvalue of ``T_k / s`` (which is at least every ``alpha_i / s``), so the top
    eigenpair of the padded matrix is that of ``T_k``, with zero weight on the empty rows.
    """
    n = start.shape[0]
    dtype = start.dtype
    tolerance = math.sqrt(n) * float(jnp.finfo(dtype).eps)
    basis = jnp.zeros((m, n), dtype).at[0].set(start)
    alphas = jnp.zeros((m,), dtype)
    betas = jnp.zeros((m,), dtype)  # betas[i] couples q_i and q_{i+1}
    zero = jnp.zeros((), dtype)

    def step(i, carry):
        basis, alphas, betas, _, scale, _ = carry
        w = matvec(basis[i])
        scale = jnp.maximum(scale, scaled_l2_norm(w))
        alpha = jnp.vdot(basis[i], w)
        # Rows after i are still zero and do not contribute to the projections.
        w = w - basis.T @ (basis @ w)
        w = w - basis.T @ (basis @ w)
        beta = scaled_l2_norm(w)
        broken = beta <= tolerance * scale
        go_on = ~broken & (i + 1 < m)
        next_q = jnp.where(go_on, w / jnp.where(broken, 1.0, beta), 0.0)
        basis = basis.at[jnp.minimum(i + 1, m - 1)].add(jnp.where(i + 1 < m, next_q, 0.0))
        betas = betas.at[i].set(jnp.where(go_on, beta, 0.0))
        return basis, alphas.at[i].set(alpha), betas, (i + 1).astype(jnp.int32), scale, broken

    def skip(i, carry):
        return carry

    def body(i, carry):
        return jax.lax.cond(carry[-1], skip, step, i, carry)

    init = (basis, alphas, betas, jnp.zeros((), jnp.int32), zero, jnp.zeros((), bool))
    basis, alphas, betas, size, scale, _ = jax.lax.fori_loop(0, m, body, init)
    unit = jnp.where(scale > 0, scale, 1.0)
    alphas, betas = alphas / unit, betas / unit
    active = jnp.arange(m) < size
    padding = jnp.min(jnp.where(active, alphas, jnp.inf)) - 1.0
    alphas = jnp.where(active, alphas, padding)
    tridiagonal = jnp.diag(alphas) + jnp.diag(betas[:-1], 1) + jnp.diag(betas[:-1], -1)
    eigenvalues, eigenvectors = jnp.linalg.eigh(tridiagonal)
    vector = basis.T @ eigenvectors[:, -1]
    norm = scaled_l2_norm(vector)
    vector = jnp.where(norm > 0, vector / jnp.where(norm > 0, norm, 1.0), start)
    return HessianEigen(eigenvalues[-1] * unit, unravel(vector))
