"""Timing helpers shared by the benchmark scripts: warm-up, interleaved repeats, medians, machine line.

Conventions (see ``docs/benchmarks.md``):

- A *candidate* is a zero-argument callable returning JAX arrays, typically a jitted function with its
  arguments bound. It is compiled and run ``warmup`` times before anything is timed, and every call is
  followed by :func:`jax.block_until_ready`, so the time covers the whole computation.
- The candidates of one comparison are timed in alternation inside each repeat (the order rotating
  from repeat to repeat): a load change on a shared machine hits all of them alike.
- One sample is ``number`` back-to-back calls, ``number`` chosen per candidate so that a sample lasts
  at least ``min_sample_seconds`` (short kernels are not drowned in timer resolution).
- Reported: the median per-call time of each candidate, and ratios between candidates as the median
  of the per-repeat ratios (paired samples, robust to slow drifts of the machine's load).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax

__all__ = ["CLOCKS", "Timing", "machine_lines", "paired_ratio", "parse_row_names", "time_interleaved"]

Candidate = Callable[[], Any]
Clock = Callable[[], float]
CLOCKS: dict[str, Clock] = {"wall": time.perf_counter, "cpu": time.process_time}
"""``wall``: elapsed time. ``cpu``: this process's CPU time (all threads), blind to time spent waiting
for a core on a shared machine; meaningful for a single-threaded computation (pin the process to
one core before JAX's backend starts, ``os.sched_setaffinity``: XLA then runs one thread)."""


class Timing(NamedTuple):
    """Per-call times of one candidate, one entry per repeat.

    Attributes:
      samples: seconds per call in each repeat, in repeat order.
      number: calls per sample.
    """

    samples: tuple[float, ...]
    number: int

    @property
    def median(self) -> float:
        """Median seconds per call."""
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Relative half inter-quartile range, a noise indicator (0.05 means ±5 %)."""
        if len(self.samples) < 4:
            return (max(self.samples) - min(self.samples)) / (2 * self.median)
        q1, _, q3 = statistics.quantiles(self.samples, n=4)
        return (q3 - q1) / (2 * self.median)


def _call(fn: Candidate) -> None:
    jax.block_until_ready(fn())


def _sample(fn: Candidate, number: int, clock: Clock, block_each: bool = True) -> float:
    """Seconds per call over ``number`` calls, each one blocked on (``block_each``) or only the last:
    on an accelerator, blocking each call adds the host's dispatch and wake-up latency to every call,
    which for kernels of a fraction of a millisecond is most of the time measured."""
    start = clock()
    if block_each:
        for _ in range(number):
            _call(fn)
    else:
        for _ in range(number - 1):
            fn()
        _call(fn)
    return (clock() - start) / number


def time_interleaved(
    candidates: Mapping[str, Candidate],
    *,
    repeats: int = 9,
    warmup: int = 2,
    min_sample_seconds: float = 0.02,
    clock: Clock = time.perf_counter,
    block_each: bool = True,
) -> dict[str, Timing]:
    """Time ``candidates`` in alternation and return each one's :class:`Timing`.

    Args:
      candidates: name -> zero-argument callable returning JAX arrays.
      repeats: samples per candidate (the median is taken over these).
      warmup: untimed calls per candidate first (the first one compiles).
      min_sample_seconds: a sample repeats the call until it lasts at least this long.
      clock: the time source, e.g. one of :data:`CLOCKS`.
      block_each: block on every call of a sample (``False``: on the sample's last call only, so
        an accelerator runs the calls back to back; see :func:`_sample`).
    """
    if repeats < 1 or warmup < 1:
        raise ValueError(f"repeats and warmup must be >= 1, got repeats={repeats}, warmup={warmup}")
    names = list(candidates)
    number = {}
    for name in names:
        for _ in range(warmup):
            _call(candidates[name])
        once = _sample(candidates[name], 1, clock)
        number[name] = max(1, math.ceil(min_sample_seconds / max(once, 1e-9)))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_sample(candidates[name], number[name], clock, block_each))
    return {name: Timing(tuple(samples[name]), number[name]) for name in names}


def paired_ratio(numerator: Timing, denominator: Timing) -> float:
    """Median over repeats of ``numerator / denominator`` measured in the same repeat."""
    return statistics.median(a / b for a, b in zip(numerator.samples, denominator.samples, strict=True))


def machine_lines(extra: Sequence[str] = ()) -> list[str]:
    """A few lines naming the machine, the software and the date, for the head of a results table."""
    import flax

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    device = jax.devices()[0]
    lines = [
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        f"machine: {platform.platform()}, {platform.machine()}, {_cpu_model()}, "
        f"{os.cpu_count()} CPUs ({usable} usable)"
        + ("" if load is None else f", load average {load[0]:.1f}"),
        f"software: python {platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}",
        f"device: {device.platform} ({device.device_kind}), {jax.device_count()} device(s)",
        _jaxnorm_line(),
    ]
    return lines + list(extra)


def _jaxnorm_line() -> str:
    """Which jaxnorm is timed: the directory it is imported from and, in a git checkout, its commit
    (``+`` when modified). The scripts import the installed package, and an editable install follows the
    last checkout that ran ``pip install -e .``, not necessarily the one the script lives in."""
    import jaxnorm

    root = os.path.dirname(os.path.dirname(os.path.abspath(jaxnorm.__file__)))
    try:
        commit = subprocess.run(
            ["git", "-C", root, "describe", "--always", "--dirty=+"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "not a git checkout"
    return f"jaxnorm: {root} ({commit})"


def _cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, else :func:`platform.processor`."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def parse_row_names(text: str, known: Sequence[str]) -> tuple[str, ...]:
    """The comma-separated row names of a ``--rows`` argument, each one of ``known`` (an argparse error
    naming the unknown one otherwise)."""
    names = tuple(text.split(","))
    for name in names:
        if name not in known:
            raise argparse.ArgumentTypeError(f"expected row names among {sorted(known)}, got {name!r}")
    return names


def positive_count(
    parser: argparse.ArgumentParser, flag: str, given: int | None, default: int, unit: str = "samples"
) -> int:
    """``given`` (an explicit ``flag``; ``None``: not given) or ``default``, which must be a positive
    number of ``unit``: an argparse error naming ``flag`` otherwise (0 is not read as "the default")."""
    count = default if given is None else given
    if count < 1:
        parser.error(f"{flag} must be a positive number of {unit}, got {count}")
    return count
