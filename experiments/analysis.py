"""The numbers of REPRODUCTION.md's summary, computed from the committed results in ``experiments/results``.

A *group* is one variant's final test accuracies over seeds (in %). For a group of ``n`` seeds with
values ``x_i`` the summary prints ``mean ± s`` with the sample standard deviation
``s = sqrt(sum (x_i - mean)^2 / (n - 1))`` (ddof = 1). Where a verdict rests on a difference of two
groups ``a`` and ``b`` it prints ``mean_a - mean_b`` and the two-sided p-value of Welch's t-test
(Welch 1947: ``t = (mean_a - mean_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b)`` with the Welch–Satterthwaite
degrees of freedom; ``scipy.stats.ttest_ind_from_stats`` with ``equal_var=False``), which needs no
equal-variance assumption. The audit standard the verdicts follow: a difference within noise
(p >= 0.05, or no test possible) is *inconclusive*, not *reproduced*.

Results files (``experiments/results/<name>.json``) come in two forms:

* a ``grid.py --json`` file, ``{variant: [one dict per seed with "eval_accuracy" in [0, 1]]}``;
  group ``<name>:<variant>`` is ``100 * eval_accuracy`` over the seeds; ``<name>:<variant>#acc@N``
  the test accuracy (%) at the N-th evaluation of each run's ``curve`` (after epoch N with one
  evaluation per epoch), ``<name>:<variant>#loss@N`` the mean training loss up to that evaluation
  since the previous one (``train_curve``: epoch N's mean train loss);
* a summary file ``{"about": ..., "groups": {group: {"values": [...]}}}`` or, where only summary
  statistics were kept, ``{"mean", "std_ddof0", "n"}`` (the population std the write-up printed,
  converted here to ddof = 1 by ``s = std_ddof0 * sqrt(n / (n - 1))``);
* a ``resume_grid.py --jsonl`` file ``<name>.jsonl``, one finished run per line; group
  ``<name>:<variant>@<key>=<value>,...`` is ``100 * eval_accuracy`` over the runs of ``variant`` whose
  grid point has those values (a sweep still running gives a smaller group, or none: "pending").

Each template ``experiments/results/<block>.md`` (the summary table, ...) is a block of REPRODUCTION.md
with placeholders, rendered by :func:`render`: ``{m:REF}`` -> ``mean ± s``; ``{d:REF_A|REF_B}`` ->
``mean_a - mean_b`` and Welch's p; ``{dcurve:REF_A|REF_B}`` -> the difference of the mean test-accuracy
curves at each evaluation; ``{sweep:NAME|ROW_KEYS[|CHOSEN_KEY]}`` -> a table of the JSONL sweep
``NAME``, one row per point of the comma-separated grid keys ``ROW_KEYS``, one column per variant,
each cell ``mean ± s`` with its seed count and the value of ``CHOSEN_KEY`` its runs used (e.g. the
learning rate chosen on the validation split); ``{linf:N}`` -> the paper's L∞ over-estimate of
sigma at batch ``N`` (:func:`linf_overestimate`). ``python -m experiments.analysis`` prints the
blocks; ``--write`` puts them into REPRODUCTION.md between their markers (a test checks that the
committed file holds exactly this rendering).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from experiments.scripts.records import (
    as_recorded,
    check_no_repeated_runs,
    diverged,
    parse_value,
    read_records,
    result_sets,
    split_values,
)
from jaxnorm.functional.checks import is_real

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
WRITEUP = os.path.join(HERE, "REPRODUCTION.md")


class Group(NamedTuple):
    """A variant's results over seeds: mean, sample std (ddof = 1; NaN for one seed) and seed count, of
    the seeds that did not diverge; ``diverged`` counts those that did (left out of all three)."""

    mean: float
    std: float
    n: int
    diverged: int = 0


def from_values(values: Sequence[float]) -> Group:
    """``Group`` of per-seed values (std with ddof = 1). A non-finite value is a diverged seed: it has no
    accuracy to average, so it is counted in ``diverged`` and left out of the mean and std. Equal values
    give exactly their value and std 0: NumPy's mean and two-pass std leave rounding residues (1.4e-14
    for three 90.1s) that Welch's test would read as spread."""
    if not isinstance(values, Sequence | np.ndarray) or not all(map(is_real, values)):
        raise ValueError(f"values must be a non-empty list of numbers, got {values!r}")
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"values must be a non-empty list of numbers, got {values!r}")
    kept = v[np.isfinite(v)]
    lost = int(v.size - kept.size)
    if kept.size == 0:
        return Group(math.nan, math.nan, 0, lost)
    if kept.size < 2:
        return Group(float(kept[0]), math.nan, 1, lost)
    if np.all(kept == kept[0]):
        return Group(float(kept[0]), 0.0, int(kept.size), lost)
    return Group(float(kept.mean()), float(kept.std(ddof=1)), int(kept.size), lost)


def accuracy(run: dict, where: str) -> float:
    """A finished run's ``eval_accuracy`` (a fraction in [0, 1]) in %, NaN for a run that diverged
    (:func:`~experiments.scripts.records.diverged`); ``ValueError`` naming ``where``
    for a missing, non-numeric or out-of-range one (a value already in % would average to 4540 %)
    and for a preempted run (its accuracy is not the final one)."""
    value = run.get("eval_accuracy") if isinstance(run, dict) else None
    if isinstance(run, dict) and diverged(run) and not run.get("preempted"):
        return math.nan
    if not is_real(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}: eval_accuracy must be a fraction in [0, 1], got {value!r}")
    if run.get("preempted"):
        raise ValueError(
            f"{where}: the run of seed {run.get('seed')} was preempted; its accuracy is not final"
        )
    return 100.0 * value


def from_population_std(mean: float, std_ddof0: float, n: int) -> Group:
    """``Group`` from a mean and a population std (ddof = 0) over ``n`` seeds: ``s = std0 sqrt(n/(n-1))``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"n must be an int >= 2 to convert a population std, got {n!r}")
    if not is_real(std_ddof0) or not math.isfinite(std_ddof0) or std_ddof0 < 0:
        raise ValueError(f"std_ddof0 must be a finite number >= 0, got {std_ddof0!r}")
    if not is_real(mean) or not math.isfinite(mean):
        raise ValueError(f"mean must be a finite number, got {mean!r}")
    return Group(float(mean), float(std_ddof0) * math.sqrt(n / (n - 1)), n)


@functools.cache
def load_results(name: str) -> dict | list:
    """The results file ``experiments/results/<name>.json`` (a dict), or ``<name>.jsonl`` (a list of runs)."""
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    if os.path.isfile(path + "l"):
        return read_records(path + "l")
    raise ValueError(f"no results file {path}[l] (results: {', '.join(sorted(available()))})")


def available() -> list[str]:
    """The results files' names."""
    return [f.rsplit(".", 1)[0] for f in os.listdir(RESULTS_DIR) if f.endswith((".json", ".jsonl"))]


def parse_point(text: str) -> dict[str, object]:
    """``"depth=2,lr=0.1"`` -> ``{"depth": 2, "lr": 0.1}`` (values as Python literals where they parse)."""
    point: dict[str, object] = {}
    for item in filter(None, split_values(text)):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"a grid point looks like 'key=value,...', got {text!r}")
        point[key] = parse_value(value)
    return point


def sweep_runs(name: str, variant: str, point: dict[str, object]) -> list[dict]:
    """The finished runs of ``variant`` in the JSONL sweep ``name`` whose grid holds ``point``."""
    runs = load_results(name)
    if not isinstance(runs, list):
        raise ValueError(f"results {name!r} are no resume_grid.py JSONL sweep")
    keys = {k for r in runs for k in r["grid"]}
    unknown = sorted(set(point) - keys) if runs else []
    if unknown:  # every run of a sweep has the same grid keys: a misspelt one would read as pending
        raise ValueError(f"sweep {name!r} has no grid key {unknown}; its keys: {sorted(keys)}")
    at_point = lambda r: all(as_recorded(r["grid"].get(k)) == as_recorded(v) for k, v in point.items())
    chosen = [r for r in runs if r["variant"] == variant and at_point(r)]
    pooled = sorted(k for k in keys - set(point) if len({repr(r["grid"].get(k)) for r in chosen}) > 1)
    if pooled:
        raise ValueError(
            f"{name}:{variant} would pool runs of different {pooled}; name the grid point "
            f"('{variant}@{pooled[0]}=...')"
        )
    if len({tuple(sorted(result_sets(r.get("sets", ())).items())) for r in chosen}) > 1:
        raise ValueError(
            f"{name}:{variant}@{point} would pool runs of different --set values; keep one sweep setting "
            "per results file, or make the setting a grid key"
        )
    configs = sorted({str(r.get("config", "")) for r in chosen})
    if len(configs) > 1:
        raise ValueError(
            f"{name}:{variant}@{point} would pool runs of the configs {configs}; keep one config per "
            "results file"
        )
    check_no_repeated_runs(chosen, f"{name}:{variant}@{point}")
    return chosen


def group(ref: str) -> Group:
    """The group ``"<results file>:<group>"`` (see the module docstring)."""
    name, sep, key = ref.partition(":")
    if not sep or not key:
        raise ValueError(f"a group reference looks like '<results file>:<group>', got {ref!r}")
    results = load_results(name)
    if isinstance(results, list):
        variant, _, point = key.partition("@")
        return runs_group(sweep_runs(name, variant, parse_point(point)), ref)
    if "groups" in results:
        entries = results["groups"]
        if key not in entries:
            raise ValueError(f"results {name!r} have no group {key!r}")
        entry = entries[key]
        if "values" in entry:
            return from_values(entry["values"])
        missing = [field for field in ("mean", "std_ddof0", "n") if field not in entry]
        if missing:
            raise ValueError(
                f"{ref!r}: a summary group holds 'values' or 'mean', 'std_ddof0', 'n'; no {missing}"
            )
        return from_population_std(entry["mean"], entry["std_ddof0"], entry["n"])
    key, _, field = key.partition("#")
    if key not in results:
        raise ValueError(f"results {name!r} have no variant {key!r}; variants: {', '.join(results)}")
    if not field:
        return from_values([accuracy(run, ref) for run in results[key]])
    return from_values([run_field(run, field, ref) for run in results[key]])


def runs_group(runs: Sequence[dict], where: str) -> Group:
    """The ``Group`` of finished runs' test accuracies in % (none yet: n = 0, "pending")."""
    if not runs:
        return Group(math.nan, math.nan, 0)
    return from_values([accuracy(run, where) for run in runs])


_FIELD = re.compile(r"^(acc|loss)@([1-9][0-9]*)$")


def run_field(run: dict, field: str, ref: str) -> float:
    """``acc@N``: the test accuracy (%) at the run's N-th evaluation; ``loss@N``: its mean training
    loss over the steps up to that evaluation since the previous one (see the module docstring)."""
    match = _FIELD.match(field)
    if not match:
        raise ValueError(f"{ref!r}: a field after '#' is 'acc@N' or 'loss@N' (N >= 1), got {field!r}")
    kind, n = match.group(1), int(match.group(2))
    points = run.get("curve" if kind == "acc" else "train_curve")
    if points is None or len(points) < n:
        raise ValueError(f"{ref!r}: the run has {0 if points is None else len(points)} evaluations, not {n}")
    value = float(points[n - 1][1])
    if kind == "acc":
        # a NaN model's accuracy was recorded as the share of class 0: the loss up to then decides
        losses = run.get("train_curve") or ()
        lost = len(losses) >= n and not math.isfinite(float(losses[n - 1][1]))
        return math.nan if lost else 100.0 * value
    return value


def welch(a: Group, b: Group) -> tuple[float, float]:
    """``(mean_a - mean_b, two-sided p)`` of Welch's t-test; p is NaN when it is undefined (a group
    of one seed, or both groups without spread)."""
    from scipy import stats

    if a.diverged or b.diverged:
        raise ValueError(
            f"a difference of groups with diverged seeds ({a.diverged} and {b.diverged}) would compare the"
            " seeds that survived; state the divergence instead"
        )
    diff = a.mean - b.mean
    if min(a.n, b.n) < 2 or (a.std == 0 and b.std == 0):
        return diff, math.nan
    result = stats.ttest_ind_from_stats(a.mean, a.std, a.n, b.mean, b.std, b.n, equal_var=False)
    return diff, float(result.pvalue)


def linf_overestimate(n: int) -> float:
    """How much the paper's L∞ estimate over-estimates sigma on Gaussian data of ``n`` samples:
    ``C(n) * E[max_i |Z_i|]`` (``jaxnorm.functional.calibration``; 1 means calibrated)."""
    from jaxnorm.functional import expected_topk_abs_normal, linf_constant

    if not is_real(n) or n != int(n) or n < 1:
        raise ValueError(f"the batch size of {{linf:N}} must be an integer >= 1, got {n!r}")
    count = np.float64(n)  # float64 constants under x64, float32 otherwise: same to 1e-4
    return float(linf_constant(count) * expected_topk_abs_normal(count))


def digits(g: Group) -> int:
    """Decimals to print: 2 for accuracies in %, 3 for the smaller GGD shapes."""
    return 3 if abs(g.mean) < 10 else 2


def fmt_group(g: Group) -> str:
    """``mean ± s`` (``mean`` alone for one seed; "pending" for none yet), followed by ``(k of N
    diverged)`` where seeds diverged (``diverged`` / ``all N diverged`` where every one did)."""
    if g.n == 0:
        return {0: "pending", 1: "diverged"}.get(g.diverged, f"all {g.diverged} diverged")
    d = digits(g)
    text = f"{g.mean:.{d}f}" if g.n < 2 else f"{g.mean:.{d}f} ± {g.std:.{d}f}"
    return text + (f" ({g.diverged} of {g.n + g.diverged} diverged)" if g.diverged else "")


def fmt_p(p: float) -> str:
    """A p-value for the table (``p n/a`` where the test is undefined): two decimals, three below 0.01
    and where two would print 0.05, so that the text never puts p on the wrong side of the 0.05 the
    verdicts use."""
    if math.isnan(p):
        return "p n/a"
    if p < 0.001:
        return "p < 0.001"
    text = f"{p:.3f}" if p < 0.01 or f"{p:.2f}" == "0.05" else f"{p:.2f}"  # 0.0485 and 0.0528: not "0.05"
    return "p < 0.05" if p < 0.05 <= float(text) else f"p = {text}"


def fmt_difference(ref_a: str, ref_b: str) -> str:
    """``+0.40, p = 0.03 (n 3/3)``: ``a - b``, Welch's p and the seed counts."""
    a, b = group(ref_a), group(ref_b)
    if a.diverged or b.diverged:  # no difference over the seeds that survived: say so
        return f"n/a (diverged: {a.diverged} of {a.n + a.diverged} / {b.diverged} of {b.n + b.diverged})"
    if min(a.n, b.n) == 0:
        return f"pending (n {a.n}/{b.n})"
    diff, p = welch(a, b)
    return f"{diff:+.{max(digits(a), digits(b))}f}, {fmt_p(p)} (n {a.n}/{b.n})"


def curve(ref: str) -> list[tuple[int, float]]:
    """``[(step, mean test accuracy in %)]`` over the seeds of a ``grid.py --json`` variant ``ref``."""
    name, _, key = ref.partition(":")
    runs = load_results(name).get(key)
    if not runs or "curve" not in runs[0]:
        raise ValueError(f"{ref!r} is no grid.py variant with evaluation curves")
    steps = [step for step, _ in runs[0]["curve"]]
    for run in runs:  # averaging by position would pair evaluations of different steps
        if [step for step, _ in run.get("curve", ())] != steps:
            raise ValueError(
                f"{ref!r}: the seeds were evaluated at different steps; a mean curve needs the same"
            )
    acc = np.array([[a for _, a in run["curve"]] for run in runs]) * 100.0
    return list(zip(steps, acc.mean(axis=0).tolist(), strict=True))


def fmt_curve_difference(ref_a: str, ref_b: str) -> str:
    """``step 468: -11.7, step 936: -13.1, ...``: the mean curves' difference ``a - b`` per evaluation."""
    a, b = curve(ref_a), curve(ref_b)
    if [s for s, _ in a] != [s for s, _ in b]:
        raise ValueError(f"{ref_a!r} and {ref_b!r} were evaluated at different steps")
    return ", ".join(f"step {s}: {x - y:+.1f}" for (s, x), (_, y) in zip(a, b, strict=True))


def sweep_table(name: str, row_keys: str, chosen_key: str = "") -> str:
    """A Markdown table of the JSONL sweep ``name``: a row per point of the grid keys ``row_keys``
    (comma-separated), a column per variant (in the order the sweep ran them), cells ``mean ± s (n)``,
    with the value of ``chosen_key`` the cell's runs used where it is given."""
    runs = load_results(name)
    if not isinstance(runs, list) or not runs:
        return "(pending: no finished run yet)"
    keys = row_keys.split(",")
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    # One row per recorded point: 1 and 1.0 are two points (the runs select by the recorded value).
    points = {
        tuple(as_recorded(r["grid"][k]) for k in keys): tuple(r["grid"][k] for k in keys)
        for r in runs
        if all(k in r["grid"] for k in keys)
    }
    rows = [points[k] for k in sorted(points, key=lambda k: tuple(map(_sort_key, points[k])))]
    header = " | ".join(k.rsplit(".", 1)[-1] for k in keys)
    lines = [f"| {header} | " + " | ".join(variants) + " |", "| --- " * (len(keys) + len(variants)) + "|"]
    for row in rows:
        point = dict(zip(keys, row, strict=True))
        cells = []
        for variant in variants:
            selected = sweep_runs(name, variant, point)
            g = runs_group(selected, f"{name}:{variant}@{point}")
            chosen = sorted({repr(r["grid"].get(chosen_key)) for r in selected})
            at = f", {chosen_key.rsplit('.', 1)[-1]} {'/'.join(chosen)}" if chosen_key and chosen else ""
            cells.append(f"{fmt_group(g)} (n {g.n + g.diverged}{at})")  # n: every run, diverged or not
        lines.append("| " + " | ".join(map(str, row)) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _sort_key(value: object) -> tuple:
    """Numbers in numeric order first, then anything else by its text (None, strings, lists)."""
    return (0, float(value), "") if is_real(value) else (1, 0.0, repr(value))


_PLACEHOLDER = re.compile(r"\{(m|d|dcurve|linf|sweep):([^{}]+)\}")


def _pair(arg: str) -> list[str]:
    refs = arg.replace("\\|", "|").split("|")  # "\|" in a Markdown table cell
    if len(refs) != 2:
        raise ValueError(f"a difference takes two group references 'A|B', got {arg!r}")
    return refs


def render(template: str) -> str:
    """``template`` with every placeholder replaced (see the module docstring)."""

    def substitute(match: re.Match) -> str:
        kind, arg = match.groups()
        if kind == "m":
            return fmt_group(group(arg))
        if kind == "d":
            return fmt_difference(*_pair(arg))
        if kind == "dcurve":
            return fmt_curve_difference(*_pair(arg))
        if kind == "sweep":
            parts = arg.split("|")
            if len(parts) not in (2, 3):
                raise ValueError(f"a sweep table takes 'NAME|ROW_KEYS[|CHOSEN_KEY]', got {arg!r}")
            return sweep_table(*parts)
        return f"{linf_overestimate(parse_value(arg)):.2f}"

    return _PLACEHOLDER.sub(substitute, template)


def markers(block: str) -> tuple[str, str]:
    """The comments around block ``block`` (rendered from ``experiments/results/<block>.md``)."""
    return (f"<!-- {block}: rendered by python -m experiments.analysis --write -->", f"<!-- {block}: end -->")


def blocks() -> list[str]:
    """The rendered blocks: one per template ``experiments/results/*.md``."""
    return sorted(f[:-3] for f in os.listdir(RESULTS_DIR) if f.endswith(".md"))


def rendered(block: str) -> str:
    """Block ``block`` rendered from its template."""
    with open(os.path.join(RESULTS_DIR, f"{block}.md")) as f:
        return render(f.read()).strip()


def committed(block: str, path: str = WRITEUP) -> str:
    """Block ``block`` as REPRODUCTION.md holds it."""
    with open(path) as f:
        text = f.read()
    begin, end = markers(block)
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no block {block!r} (markers {begin!r} ... {end!r})")
    return text[text.index(begin) + len(begin) : text.index(end)].strip()


def write_blocks(path: str = WRITEUP) -> None:
    """Replace every block of ``path`` with its rendering."""
    with open(path) as f:
        text = f.read()
    for block in blocks():
        committed(block, path)  # checks the markers are there
        begin, end = markers(block)
        start, stop = text.index(begin) + len(begin), text.index(end)
        text = text[:start] + "\n" + rendered(block) + "\n" + text[stop:]
    with open(path, "w") as f:
        f.write(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update REPRODUCTION.md's rendered blocks")
    args = parser.parse_args(argv)
    if args.write:
        write_blocks()
    else:
        print("\n\n".join(rendered(block) for block in blocks()))


if __name__ == "__main__":
    main()
