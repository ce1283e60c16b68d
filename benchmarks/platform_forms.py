"""What each CPU-only form of the functional core buys on CPU: every layer of ``norms.py`` timed with the
form as selected in ``jaxnorm/functional/platform.py`` and with that one form replaced by its plain form.

Usage::

    python benchmarks/platform_forms.py [--quick] [--shapes 128x32x32x64,64x16x16x256]
                                        [--dtypes float32,bfloat16] [--rows 'LayerNorm,BatchNorm p=1']
                                        [--clock wall|cpu] [--malloc reuse|default] [--repeats N]

A *form* is one module's use of a :mod:`jaxnorm.functional.platform` function (``distinct``,
``separate_reads``): the modules of ``jaxnorm.functional`` that import one are found at run time, so the
list follows the code. The plain form is the identity (``distinct(s) = s``, ``separate_reads(x, n) =
(x,) * n``), what every other platform runs. For every shape, dtype, layer and pass (*fwd*, *fwd+bwd*,
*fwd+bwd x*, as in ``norms.py``) the program is traced once as selected, each form's function wrapped by a
recorder so that the forms the trace calls are known, and once per called form with that module's name
patched to the plain form before ``jit`` + ``lower`` + ``compile``; a form whose patched lowering is the
same text as the selected one (``separate_reads`` of float32 input) does not change that program and is
not timed. The programs that differ are timed in alternation in the same run (``_timing.py``), and
the table gives ``gain = plain / selected`` (median of per-repeat ratios; 1.10 means the form saves
10 %). The summary gives each form's best and worst gain and the verdict of issue 14: a form stays only
where it buys at least ``KEEP_GAIN`` on CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import norms
from _timing import CLOCKS, machine_lines, paired_ratio, positive_count, time_interleaved

import jaxnorm.functional  # noqa: F401  (loads every module of the functional core)
from jaxnorm.functional import platform

KEEP_GAIN = 1.10
"""A CPU-only form stays where it makes some pass at least this much faster (issue 14)."""

PLAIN = {
    "distinct": lambda stat, tag=0: stat,
    "separate_reads": lambda x, num: (x,) * num,
}
"""The plain form of each platform function: what it is on every platform but CPU."""


@dataclasses.dataclass(frozen=True)
class Form:
    """One module's use of one platform function."""

    module: str
    function: str

    @property
    def name(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.function}"


def find_forms() -> tuple[Form, ...]:
    """Every module of ``jaxnorm.functional`` that imports a platform function, as imported now."""
    forms = []
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("jaxnorm.functional.") or module is platform:
            continue
        for function in PLAIN:
            if getattr(module, function, None) is getattr(platform, function):
                forms.append(Form(module_name, function))
    return tuple(forms)


PASSES = ("fwd", "fwd+bwd", "fwd+bwd x")


def _lowered(row: norms.Row, x: jnp.ndarray, cotangent: jnp.ndarray, kinds: tuple[str, ...]) -> dict:
    """``{pass: (jax.stages.Lowered, args)}`` of ``row``'s jaxnorm module for each pass in ``kinds``,
    traced afresh (caches cleared) under the current choice of every form."""
    jax.clear_caches()
    module = row.ours(x.dtype)
    variables = module.init(jax.random.key(0), x)
    forward, train, input_gradient = norms.passes(module, row.batch_stats)
    every = {
        "fwd": (forward, (variables, x)),
        "fwd+bwd": (train, (variables, x, cotangent)),
        "fwd+bwd x": (input_gradient, (variables, x, cotangent)),
    }
    return {kind: (every[kind][0].lower(*every[kind][1]), every[kind][1]) for kind in kinds}


def _reach(forms: tuple[Form, ...], row: norms.Row, x: jnp.ndarray, cotangent: jnp.ndarray) -> tuple:
    """The selected lowerings of ``row`` and, per pass, the forms its trace calls (each form's function
    wrapped by a recorder while that pass is traced): only those can change that program."""
    called: set[Form] = set()
    originals = {form: getattr(sys.modules[form.module], form.function) for form in forms}

    def recorder(form: Form) -> Callable:
        def record(*args, **kwargs):
            called.add(form)
            return originals[form](*args, **kwargs)

        return record

    lowered, reach = {}, {}
    try:
        for form in forms:
            setattr(sys.modules[form.module], form.function, recorder(form))
        for kind in PASSES:
            called.clear()
            lowered.update(_lowered(row, x, cotangent, (kind,)))
            reach[kind] = tuple(form for form in forms if form in called)
    finally:
        for form, original in originals.items():
            setattr(sys.modules[form.module], form.function, original)
    return lowered, reach


def _lowered_plain(form: Form, row: norms.Row, x, cotangent, kinds: tuple[str, ...]) -> dict:
    """:func:`_lowered` with ``form`` replaced by its plain form."""
    module = sys.modules[form.module]
    selected = getattr(module, form.function)
    setattr(module, form.function, PLAIN[form.function])
    try:
        return _lowered(row, x, cotangent, kinds)
    finally:
        setattr(module, form.function, selected)


def _candidate(lowered: tuple) -> Callable:
    compiled, args = lowered[0].compile(), lowered[1]
    return lambda: compiled(*args)


@dataclasses.dataclass(frozen=True)
class Gain:
    shape: tuple[int, ...]
    dtype: str
    row: str
    kind: str
    form: str
    selected_ms: float
    plain_ms: float
    gain: float
    noise: float


HEADER = "| shape | dtype | layer | pass | form | selected ms | plain ms | gain (plain/selected) | noise |"


def format_gain(g: Gain) -> str:
    return (
        f"| {norms.shape_text(g.shape)} | {g.dtype} | {g.row} | {g.kind} | {g.form} | {g.selected_ms:.2f} "
        f"| {g.plain_ms:.2f} | {g.gain:.2f} | ±{g.noise:.0%} |"
    )


def bench_row(
    row: norms.Row, forms: tuple[Form, ...], x: jnp.ndarray, cotangent: jnp.ndarray, timing_kw: dict
) -> list[Gain]:
    """Time ``row`` as selected against each form that changes its program replaced by its plain form."""
    selected, reach = _reach(forms, row, x, cotangent)
    plain = {}
    for form in forms:
        kinds = tuple(kind for kind in PASSES if form in reach[kind])
        if kinds:
            for kind, lowered in _lowered_plain(form, row, x, cotangent, kinds).items():
                if lowered[0].as_text() != selected[kind][0].as_text():
                    plain[form, kind] = lowered
    gains = []
    for kind in PASSES:
        changed = [form for form in forms if (form, kind) in plain]
        if not changed:
            continue
        candidates = {"selected": _candidate(selected[kind])}
        candidates.update({form.name: _candidate(plain[form, kind]) for form in changed})
        t = time_interleaved(candidates, **timing_kw)
        for form in changed:
            gains.append(
                Gain(
                    tuple(x.shape),
                    jnp.dtype(x.dtype).name,
                    row.name,
                    kind,
                    form.name,
                    t["selected"].median * 1e3,
                    t[form.name].median * 1e3,
                    paired_ratio(t[form.name], t["selected"]),
                    max(t["selected"].spread, t[form.name].spread),
                )
            )
    return gains


def summary_lines(forms: tuple[Form, ...], gains: list[Gain]) -> list[str]:
    """Per form: where it reaches, its best and worst gain, and KEEP / DROP against ``KEEP_GAIN``."""
    lines = ["| form | programs reached | best gain | worst gain | verdict |", "|---|---|---|---|---|"]
    for form in forms:
        mine = [g for g in gains if g.form == form.name]
        if not mine:
            lines.append(f"| {form.name} | 0 | — | — | DROP (changes no program timed in this run) |")
            continue
        best = max(mine, key=lambda g: g.gain)
        worst = min(mine, key=lambda g: g.gain)
        where = lambda g: f"{g.gain:.2f} ({g.row} {g.kind} {norms.shape_text(g.shape)} {g.dtype})"
        verdict = "KEEP" if best.gain >= KEEP_GAIN else "DROP"
        lines.append(f"| {form.name} | {len(mine)} | {where(best)} | {where(worst)} | {verdict} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{norms.shape_text(norms.QUICK_SHAPE)} only (unless --shapes / --dtypes say "
        f"otherwise), float32 and bfloat16, {norms.QUICK_REPEATS} repeats",
    )
    parser.add_argument(
        "--shapes",
        type=norms.parse_shapes,
        default=None,
        help="comma-separated NxHxWxC input shapes (default: norms.py's)",
    )
    parser.add_argument(
        "--dtypes",
        type=norms.parse_dtypes,
        default=None,
        help="comma-separated input dtypes (default: float32,bfloat16)",
    )
    parser.add_argument(
        "--rows",
        type=norms.parse_rows,
        default=norms.ROWS,
        help="comma-separated norms.py row names (default: all)",
    )
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="as in norms.py (cpu: process CPU time, pinned to one core)",
    )
    parser.add_argument(
        "--malloc",
        choices=("reuse", "default"),
        default="reuse",
        help="as in norms.py (reuse: re-run under norms.MALLOC_REUSE)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"samples per candidate (default: {norms.QUICK_REPEATS} with --quick, else {norms.REPEATS})",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.malloc == "reuse" and any(os.environ.get(k) != v for k, v in norms.MALLOC_REUSE.items()):
        os.execve(
            sys.executable,
            [sys.executable, os.path.abspath(__file__), *argv],
            {**os.environ, **norms.MALLOC_REUSE},
        )
    shapes = args.shapes or ((norms.QUICK_SHAPE,) if args.quick else norms.SHAPES)
    dtypes = args.dtypes or norms.DTYPES
    default_repeats = norms.QUICK_REPEATS if args.quick else norms.REPEATS
    repeats = positive_count(parser, "--repeats", args.repeats, default_repeats)
    if args.clock == "cpu":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    timing_kw = {
        "repeats": repeats,
        "warmup": 1 if args.quick else 2,
        "min_sample_seconds": 0.01,
        "clock": CLOCKS[args.clock],
    }
    forms = find_forms()
    clock = "wall time" if args.clock == "wall" else "process CPU time, pinned to one core (one XLA thread)"
    for line in machine_lines(
        [
            f"timing: {clock}; {repeats} interleaved repeats (selected, each plain form)",
            "forms: " + ", ".join(form.name for form in forms),
        ]
    ):
        print(line)
    print()
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    start = time.perf_counter()
    gains = []
    for shape in shapes:
        for dtype in dtypes:
            x, cotangent = norms.bench_inputs(shape, dtype)
            for row in args.rows:
                for gain in bench_row(row, forms, x, cotangent, timing_kw):
                    gains.append(gain)
                    print(format_gain(gain), flush=True)
    print()
    for line in summary_lines(forms, gains):
        print(line)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
