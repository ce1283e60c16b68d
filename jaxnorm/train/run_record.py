"""What a run directory holds and whether a restart may continue it.

``<workdir>/run.json`` records what the run is: the resolved config, its length in steps and the
number of steps its learning-rate schedule was built for, and one entry per session (start time,
jaxnorm version and git commit, jax / jaxlib / flax / optax / orbax versions, the devices and the
process count). ``<workdir>/summary.json`` holds the final (or, after a preemption, partial)
summary with its timings.

On start, :func:`plan_run` compares the new config with the recorded one, and the run's identity
(:func:`run_identity`: the model passed to :func:`jaxnorm.train.train`, as its ``repr``, and the size and
fingerprint of the training and eval data), which the config does not hold when the model is built in
Python. A workdir without checkpoints holds nothing to continue: the outputs of an earlier run there
are discarded. The config key ``on_existing`` says what may happen to a workdir that already holds a
run (checkpoints):

* ``"resume"`` (default): continue it if it is the same experiment; otherwise stop with an error that
  names the differing keys.
* ``"extend"``: as ``resume``, and the run may also be longer than recorded (``num_steps`` /
  ``num_epochs`` raised). The learning-rate schedule stays the one the run was started with: past its
  original length it holds its end value (all schedules of :mod:`jaxnorm.train.optimizers` do), so an
  extension never jumps back up the schedule.
* ``"restart"``: discard the run (checkpoints, metrics, TensorBoard, summary) and start again.
* ``"error"``: any existing run is an error.

Keys that change how a run is executed or reported but not what it computes (:data:`EXECUTION_KEYS`)
may differ between sessions.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax

ON_EXISTING = ("resume", "extend", "restart", "error")
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
LOCK_FILE = ".lock"
# Config keys (dotted prefixes) that may change between sessions of one run.
EXECUTION_KEYS = (
    "on_existing",
    "progress",
    "plots",
    "tensorboard",
    "log_every",
    "log_grad_norm",
    "log_angular_update",
    "checkpoint_every",
    "max_to_keep",
    "workdir",
    "description",
    "distributed",
    "sweep",
    "quick",
    "quick_steps",
    "quick_examples",
    "dataset.data_dir",
    # the run's length is compared as total_steps (on_existing="extend")
    "num_steps",
    "num_epochs",
)
# Keys added to the loop's defaults after runs were recorded without them: a recorded run that lacks
# one ran with the behaviour of this value, so absent and this value compare equal.
ADDED_DEFAULTS: dict[str, Any] = {
    # BN running statistics follow the kernels rescaling wrappers divide (added 2026-11-24). Runs
    # recorded before computed without it; resuming them continues with it.
    "optimizer.transport_batch_stats": True,
    "init_examples": 1,  # model.init's examples of the first batch (added 2026-11-24)
    "implicit_enorm.weight": 0.0,  # the implicit-ENorm params hook, off (added with issue 17)
    "implicit_enorm.lr_factor": 1.0,
    "optimizer.grad_clip_norm": 0.0,  # listed in the defaults (so the command line takes it) 2026-12-02
}
# What a restart discards.
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "tensorboard", SUMMARY_FILE, "recorded_norms.npz")


class RunPlan(NamedTuple):
    """What :func:`plan_run` decided.

    Attributes:
      action: ``"new"`` (nothing to continue), ``"resume"``, ``"extend"`` or ``"restart"``.
      schedule_steps: the run length the learning-rate schedule is built for (the original length
        after an extension).
      record: the run record to write (the new session appended).
      recorded_steps: the run's length before this session (``None`` for a new run).
    """

    action: str
    schedule_steps: int
    record: dict[str, Any]
    recorded_steps: int | None


class WorkdirLock:
    """An exclusive lock on ``<workdir>/.lock`` (``fcntl.flock``) that one session of a run holds from
    before it reads the run record to its end. A second session started on the same workdir (a
    requeued job while the first still runs) raises ``ValueError`` naming the holder instead of
    training beside it (both appended every step to one metrics.jsonl, and a new run's start discards
    the outputs the other writes). The operating system releases the lock when the holder exits, even
    killed, so no stale lock outlives it. Taken by the primary process only (``workdir=None``: none)."""

    def __init__(self, workdir: str | None):
        self.workdir, self._fd = workdir, None

    def acquire(self) -> None:
        if self.workdir is None:
            return
        os.makedirs(self.workdir, exist_ok=True)
        fd = os.open(os.path.join(self.workdir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ValueError(
                f"{self.workdir} is in use by another session of this run ({holder}); wait for it to end, "
                "or use another workdir"
            ) from None
        except OSError as error:  # a filesystem without flock (NFS without lockd, Lustre noflock)
            os.close(fd)
            print(f"warning: {self.workdir} cannot be locked ({error}); a second session is not stopped")
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {now()}".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def now() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def config_dict(config: Any) -> dict[str, Any]:
    """``config`` (ConfigDict or mapping) as plain JSON values: tuples become lists, sets sorted lists,
    other objects their ``repr`` without memory addresses (``<function f at 0x7f...>``: another in
    every process and session, so a config holding an initializer differed from itself)."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    return json.loads(json.dumps(config, default=_stable_repr, sort_keys=True))


def _stable_repr(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        plain = (v if isinstance(v, str | int | float) else _stable_repr(v) for v in value)
        return sorted(plain, key=repr)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _is_execution_key(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in EXECUTION_KEYS)


def experiment_digest(config: Mapping[str, Any], identity: Mapping[str, Any] | None, total_steps: int) -> str:
    """A digest (BLAKE2b, 16 hex digits) of what a run computes: the config without its
    :data:`EXECUTION_KEYS`, the :func:`run_identity` and the run's length; the processes of a
    multi-process run compare it (:func:`jaxnorm.train.run_checks.check_one_experiment`)."""
    computed = {k: v for k, v in _flatten(config_dict(config)).items() if not _is_execution_key(k)}
    what = {"config": computed, "identity": identity, "total_steps": int(total_steps)}
    text = json.dumps(what, sort_keys=True, default=_stable_repr)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old value, new value)}`` for every key that changes what the run computes
    (absent values are ``None``)."""
    a, b = _flatten(config_dict(old)), _flatten(config_dict(new))
    for flat in (a, b):
        for key, value in ADDED_DEFAULTS.items():
            flat.setdefault(key, value)
    return {
        k: (a.get(k), b.get(k))
        for k in sorted(set(a) | set(b))
        if not _is_execution_key(k) and a.get(k) != b.get(k)
    }


def run_identity(model: Any, train_data: Any, eval_data: Any = None) -> dict[str, Any]:
    """What a run trains and evaluates that its config may not say, as plain JSON values (what
    ``run.json`` stores and :func:`identity_differences` compares): the model, as its ``repr`` (a linen
    module's attributes, nested modules included; memory addresses of functions left out, whitespace
    collapsed); the training data's number of examples, global batch size and ``fingerprint`` (a digest
    of its examples, :attr:`jaxnorm.data.ArraySource.fingerprint`), and the eval data's number of
    examples and fingerprint (not its batch size: the evaluation is exact at any; ``None`` without eval
    data), each where the source says it."""
    description = _stable_repr(model)
    identity = {
        "model": " ".join(description.split()),
        "train_data": _source_identity(train_data, ("num_examples", "global_batch_size")),
    }
    # None, not absent, without eval data: a run evaluated on one set and resumed without any (then
    # with another) would otherwise pass; an absent key is a run recorded before eval data was
    identity["eval_data"] = None if eval_data is None else _source_identity(eval_data, ("num_examples",))
    return identity


def _source_identity(source: Any, sizes: tuple[str, ...]) -> dict[str, Any]:
    identity: dict[str, Any] = {}
    for key in sizes:
        value = getattr(source, key, None)
        if value is not None:
            identity[key] = int(value)
    fingerprint = getattr(source, "fingerprint", None)
    if isinstance(fingerprint, str):
        identity["fingerprint"] = fingerprint
    return identity


_DATA = ("train_data", "eval_data")


def identity_differences(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> dict[str, tuple]:
    """``{key: (old, new)}`` of two :func:`run_identity` values (none where either is unknown: a run
    recorded before identities were, or a check without a model; of the data, what both know: a
    wrapper of a source may not say its number of examples, a run recorded before fingerprints or
    before eval data was recorded has none); eval data on one side and none (``None``) on the other
    differ."""
    if not old or not new:
        return {}
    differences = {}
    if old.get("model") != new.get("model"):
        differences["model"] = (old.get("model"), new.get("model"))
    for data in _DATA:
        if data in old and data in new and (old[data] is None) != (new[data] is None):
            differences[data] = (old[data], new[data])
            continue
        old_data, new_data = old.get(data) or {}, new.get(data) or {}
        common = sorted(set(old_data) & set(new_data))
        if any(old_data[k] != new_data[k] for k in common):
            differences[data] = ({k: old_data[k] for k in common}, {k: new_data[k] for k in common})
    return differences


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions, git commit, devices and process count of this session."""
    return {
        "jaxnorm_version": _version("jaxnorm"),
        "git_commit": _git_commit(),
        "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")},
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "process_count": jax.process_count(),
    }


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` if there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def write_json(path: str, obj: Mapping[str, Any]) -> None:
    """Writes ``obj`` atomically (a temporary file renamed over ``path``)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=repr)
    os.replace(tmp, path)


def has_checkpoint(workdir: str) -> bool:
    """Whether ``workdir/checkpoints`` holds any step directory."""
    directory = os.path.join(workdir, "checkpoints")
    return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))


def _way_out(workdir: str) -> str:
    return (
        f"use another workdir, or set on_existing='restart' (--config.on_existing=restart) to discard "
        f"the run in {workdir}"
    )


def _describe(differences: Mapping[str, tuple[Any, Any]], limit: int = 8) -> str:
    items = [f"{k}: {old!r} -> {new!r}" for k, (old, new) in differences.items()]
    more = f"; and {len(items) - limit} more" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def check_workdir(workdir: str, config: Any, identity: Mapping[str, Any] | None = None) -> None:
    """The checks of :func:`plan_run` that need no run length: raises ``ValueError`` if ``workdir``
    holds a run that ``config`` (and ``identity``, :func:`run_identity`) may not continue (another
    experiment, no record, or ``on_existing='error'``). An experiment runner calls it for every run of
    a sweep before any trains."""
    on_existing = config.get("on_existing", "resume")
    if on_existing not in ON_EXISTING:
        raise ValueError(f"config.on_existing must be one of {ON_EXISTING}, got {on_existing!r}")
    if on_existing == "restart" or not has_checkpoint(workdir):
        return
    if on_existing == "error":
        raise ValueError(f"{workdir} already holds a run (config.on_existing='error'); " + _way_out(workdir))
    old = read_json(os.path.join(workdir, RUN_FILE))
    if old is None:
        raise ValueError(
            f"{workdir} holds checkpoints but no readable {RUN_FILE} (written by an older jaxnorm or "
            f"another program), so it cannot be told whether it is this experiment; " + _way_out(workdir)
        )
    differences = config_differences(old.get("config", {}), config)
    differences.update(identity_differences(old.get("identity"), identity))
    if differences:
        raise ValueError(
            f"{workdir} holds a different experiment ({_describe(differences)}); " + _way_out(workdir)
        )


def plan_run(
    workdir: str, config: Any, total_steps: int, identity: Mapping[str, Any] | None = None
) -> RunPlan:
    """Decides, from ``workdir``'s run record and ``config.on_existing``, whether this session
    starts a new run, resumes or extends the recorded one, or restarts it; raises ``ValueError``
    (naming the differing keys and the way out) when the workdir holds another experiment (another
    config, or another model or training data: ``identity``, :func:`run_identity`)."""
    check_workdir(workdir, config, identity)
    on_existing = config.get("on_existing", "resume")
    old = read_json(os.path.join(workdir, RUN_FILE))
    session = {"started": now(), **environment()}
    new_record = {
        "config": config_dict(config),
        **({} if identity is None else {"identity": dict(identity)}),
        "total_steps": total_steps,
        "schedule_steps": total_steps,
        "sessions": [session],
    }
    if not has_checkpoint(workdir):
        return RunPlan("new", total_steps, new_record, None)
    if on_existing == "restart":
        return RunPlan("restart", total_steps, new_record, None)
    recorded_steps = int(old["total_steps"])
    schedule_steps = int(old.get("schedule_steps", recorded_steps))
    record = {**old, "config": config_dict(config), "sessions": [*old.get("sessions", []), session]}
    if identity is not None:
        record["identity"] = dict(identity)
    if total_steps == recorded_steps:
        return RunPlan("resume", schedule_steps, record, recorded_steps)
    if on_existing == "extend" and total_steps > recorded_steps:
        record["total_steps"] = total_steps
        return RunPlan("extend", schedule_steps, record, recorded_steps)
    hint = (
        "set on_existing='extend' (--config.on_existing=extend) to continue it; the learning rate then "
        "holds the schedule's end value past the original length, or "
        if total_steps > recorded_steps
        else ""
    )
    raise ValueError(
        f"{workdir} holds a run of {recorded_steps} steps and this config asks for {total_steps} "
        f"(num_steps / num_epochs); {hint}" + _way_out(workdir)
    )


def discard_run(workdir: str) -> None:
    """Removes a run's outputs (checkpoints, metrics, TensorBoard, summary) from ``workdir``."""
    for name in RUN_OUTPUTS:
        path = os.path.join(workdir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
