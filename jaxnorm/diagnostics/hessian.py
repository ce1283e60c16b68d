"""Top Hessian eigenvalue of a loss by power iteration or Lanczos on Hessian-vector products.

Gradient descent on a quadratic with curvature ``lambda_max`` is stable only for
``eta < 2 / lambda_max``; normalization layers change ``lambda_max`` (the loss-landscape view of
batch norm, Santurkar et al., *How does batch normalization help optimization?*, NeurIPS 2018;
Arpit, *Normalization techniques*, slides 001, Sec. 7). ``H v`` is computed without forming ``H``,
as forward-over-reverse differentiation ``jvp(grad(L), (p,), (v,))`` (Pearlmutter 1994).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

__all__ = ["HessianEigen", "hessian_top_eigenvalue", "hvp"]

PyTree = Any


class HessianEigen(NamedTuple):
    """``eigenvalue`` (scalar) and a unit-norm ``eigenvector`` with the params' structure."""

    eigenvalue: jax.Array
    eigenvector: PyTree


def hvp(loss_fn: Callable[..., jax.Array], params: PyTree, vector: PyTree, *args, **kwargs) -> PyTree:
    """Hessian-vector product ``(d^2 L / d p^2) v`` of ``L = loss_fn(params, *args, **kwargs)``."""
    grad_fn = jax.grad(lambda p: loss_fn(p, *args, **kwargs))
    return jax.jvp(grad_fn, (params,), (vector,))[1]


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

    * ``method="lanczos"``: ``num_iters`` Lanczos steps from a random start with full
      re-orthogonalisation; returns the largest eigenvalue of the tridiagonal matrix ``T_m`` (the
      largest *algebraic* eigenvalue, converging from below; exact once ``num_iters`` reaches the
      number of distinct eigenvalues).
    * ``method="power"``: ``v <- H v / ||H v||`` ``num_iters`` times, then the Rayleigh quotient
      ``v^T H v``: the eigenvalue of largest *magnitude* (it can be negative at a saddle).

    Each iteration costs one Hessian-vector product. Jit-able (``num_iters`` and ``method`` static).

    Args:
      loss_fn: scalar loss ``loss_fn(params, *args, **kwargs)``.
      params: point at which the Hessian is taken.
      *args, **kwargs: passed on to ``loss_fn`` (e.g. a batch).
      key: PRNG key for the start vector.
      num_iters: Hessian-vector products.
      method: ``"lanczos"`` or ``"power"``.
    """
    if method not in ("lanczos", "power"):
        raise ValueError(f"hessian_top_eigenvalue: method must be 'lanczos' or 'power', got {method!r}")
    if not isinstance(num_iters, int) or num_iters < 1:
        raise ValueError(f"hessian_top_eigenvalue: num_iters must be a positive int, got {num_iters!r}")
    flat, unravel = ravel_pytree(params)
    dtype = jnp.promote_types(flat.dtype, jnp.float32)

    def matvec(v):
        product = hvp(loss_fn, params, unravel(v.astype(flat.dtype)), *args, **kwargs)
        return ravel_pytree(product)[0].astype(dtype)

    start = jax.random.normal(key, flat.shape, dtype)
    start = start / jnp.linalg.norm(start)
    if method == "power":
        return _power(matvec, start, num_iters, unravel)
    return _lanczos(matvec, start, min(num_iters, flat.size), unravel)


def _power(matvec, start, num_iters, unravel) -> HessianEigen:
    def step(_, v):
        hv = matvec(v)
        norm = jnp.linalg.norm(hv)
        return jnp.where(norm > 0, hv / jnp.where(norm > 0, norm, 1.0), v)

    v = jax.lax.fori_loop(0, num_iters, step, start)
    return HessianEigen(jnp.vdot(v, matvec(v)), unravel(v))


def _lanczos(matvec, start, m, unravel) -> HessianEigen:
    n = start.shape[0]
    basis = jnp.zeros((m, n), start.dtype).at[0].set(start)
    alphas = jnp.zeros((m,), start.dtype)
    betas = jnp.zeros((m,), start.dtype)  # betas[i] couples q_i and q_{i+1}

    def step(i, carry):
        basis, alphas, betas = carry
        w = matvec(basis[i])
        alpha = jnp.vdot(basis[i], w)
        # Full re-orthogonalisation against the stored vectors (twice, for stability); rows after
        # i are still zero and do not contribute.
        w = w - basis.T @ (basis @ w)
        w = w - basis.T @ (basis @ w)
        beta = jnp.linalg.norm(w)
        # beta ~ 0: the Krylov space is invariant and exact; the remaining rows stay zero.
        go_on = (beta > 1e-10 * jnp.abs(alpha) + 1e-30) & (i + 1 < m)
        next_q = jnp.where(go_on, w / jnp.where(beta > 0, beta, 1.0), 0.0)
        basis = basis.at[jnp.minimum(i + 1, m - 1)].add(jnp.where(i + 1 < m, next_q, 0.0))
        return basis, alphas.at[i].set(alpha), betas.at[i].set(jnp.where(go_on, beta, 0.0))

    basis, alphas, betas = jax.lax.fori_loop(0, m, step, (basis, alphas, betas))
    # Rows after a breakdown are zero; give them alpha_0 = q_0^T H q_0, which lies inside the
    # spectrum of the active block, so they never become the top eigenvalue.
    active = jnp.any(basis != 0, axis=1)
    alphas = jnp.where(active, alphas, alphas[0])
    tridiagonal = jnp.diag(alphas) + jnp.diag(betas[:-1], 1) + jnp.diag(betas[:-1], -1)
    eigenvalues, eigenvectors = jnp.linalg.eigh(tridiagonal)
    vector = basis.T @ eigenvectors[:, -1]
    norm = jnp.linalg.norm(vector)
    vector = jnp.where(norm > 0, vector / jnp.where(norm > 0, norm, 1.0), start)
    return HessianEigen(eigenvalues[-1], unravel(vector))
