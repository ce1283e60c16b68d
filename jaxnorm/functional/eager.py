"""Eager calls of the statistics compiled once: :func:`compiled_when_concrete`.

The statistics take data-dependent branches (:func:`jax.lax.cond`: the cancellation and constant-group
passes) and per-platform forms (:func:`jax.lax.platform_dependent`), whose branches are closures over
the call's arguments. Called outside any trace, JAX re-traces and re-compiles each of them on every
call (times against flax's eager layers: ``docs/benchmarks.md``, "Eager calls"); under ``jit``,
``grad`` or ``vmap`` they are traced once with the enclosing function. So the functions that hold such
branches run, when no array argument is a tracer, as one cached :func:`jax.jit` computation keyed by
their static arguments, and inside a trace as they are (the traced program is unchanged).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypeVar

import jax

__all__ = ["compiled_when_concrete"]

F = TypeVar("F", bound=Callable)


def compiled_when_concrete(static_argnames: tuple[str, ...]) -> Callable[[F], F]:
    """Decorate ``fn`` to run as ``jax.jit(fn, static_argnames=static_argnames)`` when none of its other
    arguments holds a tracer, and as ``fn`` itself otherwise (or when a static argument is unhashable).

    ``fn``'s arguments must have been validated by its caller: the compiled form sees their shapes and
    dtypes, not their values.
    """

    def decorate(fn: F) -> F:
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
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(values))


def _hashable(values: tuple) -> bool:
    try:
        hash(values)
    except TypeError:
        return False
    return True
