"""Throughput of the training loop against a minimal hand-written flax + optax loop.

Usage::

    python benchmarks/train.py [--quick] [--model mlp] [--norm bn] [--batch 128] [--steps 200]

Same model (``jaxnorm.models.create``), optimizer (SGD + momentum), batch size and data (synthetic
Fashion-MNIST-shaped arrays held in memory) for every candidate:

* ``hand step``: a jitted ``(params, batch_stats, opt_state, x, y) -> ...`` step written directly
  with flax and optax (donated state), on one device-resident batch: the model step alone.
* ``jaxnorm step``: ``make_train_step`` compiled by ``DataParallel`` (jit + NamedSharding), same
  fixed batch: the step's own overhead (metrics, LR, loss-scale bookkeeping).
* ``hand loop + data``: the hand step fed host batches from the same ``ArraySource`` the loop
  uses (``jax.device_put`` per step): the model step with data; timed as a block of ``n`` steps
  right after each loop run, and the loop-vs-hand ratio is the median over these adjacent pairs.
* ``jaxnorm loop``: ``jaxnorm.train.train`` for ``n`` steps (metrics to JSONL every step, fetched
  every 50, weight norms at log steps, checkpoint and SIGTERM checks every step, tqdm off); its
  per-step time is from the run's own throughput clock (after the first, compiling step).
* ``jaxnorm loop + tensorboard``: the same with ``tensorboard=True`` (every record also written
  as TensorBoard scalars); its cost is the median of paired ratios against the plain loop run.
* ``data only``: iterating the ``ArraySource`` without training.

It also times ``MetricsWriter.write`` alone, per record, with and without TensorBoard (the writer's
own cost, free of the step's noise).

Step-level candidates are timed in alternation (``_timing.py``); loop runs are interleaved with
them, and medians over repeats are reported. Target (issue 5): jaxnorm loop >= 0.95x hand loop.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import machine_lines, paired_ratio, positive_count, time_interleaved

from jaxnorm import models
from jaxnorm.train import (
    ArraySource,
    DataParallel,
    create_train_state,
    make_train_step,
    train,
)

LOOP_TARGET = 0.95


def writer_microseconds(tensorboard: bool, records: int = 2000) -> float:
    """Microseconds per ``MetricsWriter.write`` of a train record (loss, accuracy, lr)."""
    import os

    from jaxnorm.train.metrics import MetricsWriter

    record = {"loss": 0.5, "accuracy": 0.9, "lr": 0.1}
    with tempfile.TemporaryDirectory() as d:
        tb_dir = os.path.join(d, "tb") if tensorboard else None
        writer = MetricsWriter(os.path.join(d, "metrics.jsonl"), tensorboard_dir=tb_dir)
        writer.write(0, record)
        start = time.perf_counter()
        for step in range(1, records + 1):
            writer.write(step, record)
        writer.close()
        return (time.perf_counter() - start) / records * 1e6


def _hand_step(model, tx):
    """The anchor: the minimal flax + optax BN training step."""

    def loss_fn(params, batch_stats, x, y):
        logits, updates = model.apply(
            {"params": params, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, updates.get("batch_stats", {})

    @jax.jit
    def step(params, batch_stats, opt_state, x, y):
        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), batch_stats, opt_state, loss

    return jax.jit(step.__wrapped__, donate_argnums=(0, 1, 2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--norm", default="bn")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=None, help="steps of each loop run (300; --quick: 60)")
    parser.add_argument("--repeats", type=int, default=None, help="5; --quick: 2")
    parser.add_argument("--quick", action="store_true", help="a fast smoke version")
    args = parser.parse_args(argv)
    # explicit --steps / --repeats win over --quick's, as in norms.py
    args.repeats = positive_count(parser, "--repeats", args.repeats, 2 if args.quick else 5)
    args.steps = positive_count(parser, "--steps", args.steps, 60 if args.quick else 300, unit="steps")
    kwargs = {"depth": 3, "width": 256} if args.model == "mlp" else {}
    model = models.create(args.model, num_classes=10, norm=args.norm, **kwargs)
    tx = optax.sgd(0.05, momentum=0.9)
    b = args.batch
    rng = np.random.default_rng(0)
    n_examples = 8 * b
    data = {
        "image": rng.normal(size=(n_examples, 28, 28, 1)).astype(np.float32),
        "label": rng.integers(0, 10, n_examples).astype(np.int32),
    }
    source = ArraySource(data, b, seed=0)
    x, y = jnp.asarray(data["image"][:b]), jnp.asarray(data["label"][:b])

    # hand-written anchor state
    variables = model.init(jax.random.PRNGKey(0), x[:1], train=False)
    hand = {"state": (variables["params"], variables.get("batch_stats", {}), tx.init(variables["params"]))}
    hand_step = _hand_step(model, tx)

    def run_hand_fixed():
        p, s, o, loss = hand_step(*hand["state"], x, y)
        hand["state"] = (p, s, o)
        return loss

    batches = {"it": iter(())}

    def next_host_batch():
        try:
            return next(batches["it"])
        except StopIteration:
            batches["it"] = source.epoch(0)
            return next(batches["it"])

    def run_hand_data():
        batch = next_host_batch()
        p, s, o, loss = hand_step(
            *hand["state"], jax.device_put(batch["image"]), jax.device_put(batch["label"])
        )
        hand["state"] = (p, s, o)
        return loss

    parallel = DataParallel("jit")
    ours = {
        "state": parallel.init_state(lambda: create_train_state(model.init, tx, jax.random.PRNGKey(0), x[:1]))
    }
    our_step = parallel.compile_train_step(make_train_step(model.apply, tx))
    global_batch = parallel.shard_batch({"image": np.asarray(x), "label": np.asarray(y)})

    def run_our_fixed():
        ours["state"], metrics = our_step(ours["state"], global_batch)
        return metrics["loss"]

    def run_data_only():
        return next_host_batch()["image"].sum()

    steps = {"hand step": run_hand_fixed, "jaxnorm step": run_our_fixed, "data only": run_data_only}
    config = {
        "progress": False,
        "log_every": 50,
        "checkpoint_every": 0,
        "optimizer": {"name": "momentum", "learning_rate": 0.05, "momentum": 0.9},
    }

    def loop_step_seconds(n, tensorboard=False):
        with tempfile.TemporaryDirectory() as workdir:
            run_config = {**config, "num_steps": n, "tensorboard": tensorboard}
            result = train(run_config, model=model, train_data=source, workdir=workdir)
        return b / result.summary["images_per_second"]

    def hand_data_step_seconds(n):
        jax.block_until_ready(run_hand_data())
        start = time.perf_counter()
        for _ in range(n):
            loss = run_hand_data()
        jax.block_until_ready(loss)
        return (time.perf_counter() - start) / n

    # TensorBoard writing needs tensorflow (an experiments extra): without it, its rows are skipped.
    with_tensorboard = importlib.util.find_spec("tensorflow") is not None
    loop_times, hand_data_times, step_timings, tb_times = [], [], [], []
    n = args.steps
    for _ in range(args.repeats):
        loop_times.append(loop_step_seconds(n))
        if with_tensorboard:
            tb_times.append(loop_step_seconds(n, tensorboard=True))
        hand_data_times.append(hand_data_step_seconds(n))
        step_timings.append(time_interleaved(steps, repeats=3, min_sample_seconds=0.1))
    merged = {name: statistics.median(t.median for t in (s[name] for s in step_timings)) for name in steps}
    merged["hand loop + data"] = statistics.median(hand_data_times)
    loop_step = statistics.median(loop_times)
    loop_vs_hand = statistics.median(h / lo for h, lo in zip(hand_data_times, loop_times, strict=True))
    if with_tensorboard:
        tb_cost = statistics.median(t / lo for t, lo in zip(tb_times, loop_times, strict=True)) - 1.0
    ratio_fixed = statistics.median(paired_ratio(s["hand step"], s["jaxnorm step"]) for s in step_timings)

    def ips(seconds):
        return b / seconds

    print("\n".join(f"- {line}" for line in machine_lines()))
    print(
        f"- model: {args.model} ({args.norm}), batch {b}, SGD momentum; loop runs of {n} "
        f"steps, {args.repeats} repeats\n"
    )
    print("| candidate | ms / step | images / s | vs hand step |")
    print("| --- | --- | --- | --- |")
    rows = [
        *((k, v) for k, v in merged.items() if k != "data only"),
        ("jaxnorm loop", loop_step),
        *((("jaxnorm loop + tensorboard", statistics.median(tb_times)),) if with_tensorboard else ()),
    ]
    for name, seconds in rows:
        ratio = merged["hand step"] / seconds
        print(f"| {name} | {seconds * 1e3:.3f} | {ips(seconds):.0f} | {ratio:.3f}x |")
    print(f"| data only | {merged['data only'] * 1e3:.3f} | {ips(merged['data only']):.0f} | - |")
    verdict = "PASS" if loop_vs_hand >= LOOP_TARGET else "FAIL"
    print(
        f"\njaxnorm step vs hand step (paired, same fixed batch): {ratio_fixed:.3f}x\n"
        f"jaxnorm loop vs hand loop + data (median of adjacent pairs): {loop_vs_hand:.3f}x "
        f"(target >= {LOOP_TARGET}: {verdict})\n"
        + (f"tensorboard=True costs {100 * tb_cost:+.1f} % of the loop's step time (median of pairs)\n"
           if with_tensorboard else "tensorboard=True: not timed (tensorflow is not installed)\n")
        + f"input pipeline alone: {ips(merged['data only']):.0f} images/s vs the step's "
        f"{ips(merged['hand step']):.0f}"
    )
    if not with_tensorboard:
        return 0 if verdict == "PASS" or args.quick else 1
    plain = statistics.median(writer_microseconds(False) for _ in range(3))
    with_tb = statistics.median(writer_microseconds(True) for _ in range(3))
    share = 100 * (with_tb - plain) * 1e-6 / loop_step
    print(
        f"metrics writer per record: {plain:.0f} us JSONL only, {with_tb:.0f} us with tensorboard "
        f"({with_tb - plain:.0f} us for TensorBoard, {share:.1f} % of a loop step)"
    )
    return 0 if verdict == "PASS" or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
