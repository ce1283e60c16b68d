"""Eager calls of the statistics compiled once: :func:`compiled_when_concrete`.

The statistics take data-dependent branches (:func:`jax.lax.cond`: the cancellation and constant-group
passes) and per-platform forms (:func:`jax.lax.platform_dependent`), whose branches are closures over
the call's arguments. Evaluated eagerly (no ``jit``: a notebook cell, an eager ``grad``), JAX re-traces
and re-compiles each of them on every call (times against flax's eager layers: ``docs/benchmarks.md``,
"Eager calls"); under ``jit`` or ``vmap`` they are traced once with the enclosing function. So the
functions that hold such branches run as one cached :func:`jax.jit` computation, keyed by their static
arguments, when every array argument has a concrete value (an eager ``grad``'s or ``jvp``'s tracers
carry one: the compiled computation is then differentiated), and as they are inside ``jit``, ``vmap``
or ``make_jaxpr`` (the traced program is unchanged).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypeVar

import jax

try:  # JAX's test of "a tracer with a concrete value" (an eager grad's), not a public name
    from jax._src.core import is_concrete as _is_concrete
except ImportError:  # pragma: no cover - then every tracer is treated as traced

    def _is_concrete(leaf) -> bool:
        return False


__all__ = ["compiled_when_concrete"]

Decorated = TypeVar("Decorated", bound=Callable)


def compiled_when_concrete(static_argnames: tuple[str, ...]) -> Callable[[Decorated], Decorated]:
    """Decorate ``fn`` to run as ``jax.jit(fn, static_argnames=static_argnames)`` when each of its other
    arguments is concrete (or traced by an eager ``grad`` / ``jvp``), and as ``fn`` itself inside a
    trace without concrete values or when a static argument is unhashable.

    ``fn``'s arguments must have been validated by its caller: the compiled form sees their shapes and
    dtypes, not their values.
    """

    def decorate(fn: Decorated) -> Decorated:
        compiled = jax.jit(fn, static_argnames=static_argnames)
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()  # one cache entry however the arguments are spelled
            arguments = bound.arguments
            static = tuple(arguments[name] for name in static_argnames)
            dynamic = [value for name, value in arguments.items() if name not in static_argnames]
            if _holds_tracer(dynamic) or not _hashable(static):
                return fn(*args, **kwargs)
            return compiled(**arguments)

        return call  # type: ignore[return-value]

    return decorate


def _holds_tracer(values: list) -> bool:
    """Whether a leaf is traced without a concrete value (``jit``, ``vmap``, ``make_jaxpr``); the tracers
    of an eager ``grad`` or ``jvp`` carry their concrete primal, and the compiled form is differentiated."""
    return any(
        isinstance(leaf, jax.core.Tracer) and not _is_concrete(leaf) for leaf in jax.tree.leaves(values)
    )


def _hashable(values: tuple) -> bool:
    try:
        hash(values)
    except TypeError:
        return False
    return True
