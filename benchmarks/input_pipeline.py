"""Is the input pipeline the bottleneck? ``jaxnorm.data`` batches/s vs the model's train step.

Usage::

    python benchmarks/input_pipeline.py [--quick] [--batch 128]

Candidates, timed in alternation (``_timing.py``), batch ``--batch``:

* ``fashion_mnist data``: one batch of the real offline Fashion-MNIST pipeline
  (``jaxnorm.data.load``, no augmentation), produced on the calling thread (``prefetch_size=0``:
  the full host cost of a batch, none of it hidden by the prefetch thread).
* ``cifar crop_flip data`` / ``cifar cifar_nv_crop data``: one batch of an in-memory 50,000 x 32 x
  32 x 3 uint8 dataset (random pixels, CIFAR's shape) with the CIFAR augmentations.
* ``mlp step``: a jitted SGD-momentum step of ``mlp`` (3 x 256, BN) on a device-resident
  Fashion-MNIST batch (the README experiment's model): the anchor for the Fashion-MNIST pipeline.
* ``cifar_nv step`` / ``resnet18 step``: the same for ``cifar_nv`` (BN) on 28 x 28 crops and the
  CIFAR ``resnet18`` (BN) on 32 x 32 images: the anchors for CIFAR. Only on an accelerator (on a
  2-core CPU one full-width step takes seconds, so any pipeline keeps up) or with ``--cifar-steps``.

Reported: images/s of each, and data-to-step ratios (> 1: the pipeline produces batches faster
than the model consumes them, on one host thread; the loop's prefetch thread then hides it).
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import machine_lines, paired_ratio, time_interleaved

from jaxnorm import data, models


def endless(ds):
    """Batches across epochs without end."""
    while True:
        yield from ds


def train_step(model, x, y):
    """A jitted SGD-momentum step bound to one device-resident batch."""
    variables = model.init(jax.random.key(0), x, train=False)
    tx = optax.sgd(0.01, momentum=0.9)
    state = [variables["params"], variables.get("batch_stats", {}), None]
    state[2] = tx.init(state[0])

    @jax.jit
    def step(params, stats, opt_state):
        def loss_fn(p):
            logits, updates = model.apply({"params": p, "batch_stats": stats}, x, train=True,
                                          mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, updates["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    def run():
        *state[:3], loss = step(*state)
        return loss

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--cifar-steps", action="store_true",
                        help="time the CIFAR model steps on CPU too")
    args = parser.parse_args()
    b = args.batch

    fmnist = data.load("fashion_mnist", "train", batch_size=b, train=True, prefetch_size=0)
    rng = np.random.default_rng(0)
    cifar_images = rng.integers(0, 256, size=(50_000, 32, 32, 3), dtype=np.uint8)
    cifar_labels = rng.integers(0, 10, size=50_000).astype(np.int32)
    stats = dict(mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616))
    cifar = {
        aug: data.ArrayDataset(cifar_images, cifar_labels, batch_size=b, train=True, seed=0,
                               augment=aug, drop_remainder=True, process_index=0,
                               process_count=1, prefetch_size=0, **stats)
        for aug in ("crop_flip", "cifar_nv_crop")
    }
    sources = {"fashion_mnist data": endless(fmnist),
               "cifar crop_flip data": endless(cifar["crop_flip"]),
               "cifar cifar_nv_crop data": endless(cifar["cifar_nv_crop"])}

    fm = next(iter(fmnist))
    candidates = {name: (lambda it=it: next(it)["image"]) for name, it in sources.items()}
    candidates["mlp step"] = train_step(
        models.create("mlp", num_classes=10, norm="bn", depth=3, width=256),
        jnp.asarray(fm["image"]), jnp.asarray(fm["label"]))
    pairs = [("fashion_mnist data", "mlp step")]
    if jax.default_backend() != "cpu" or args.cifar_steps:
        nv = next(iter(cifar["cifar_nv_crop"]))
        cf = next(iter(cifar["crop_flip"]))
        candidates["cifar_nv step"] = train_step(
            models.create("cifar_nv", num_classes=10, norm="bn"),
            jnp.asarray(nv["image"]), jnp.asarray(nv["label"]))
        candidates["resnet18 step"] = train_step(
            models.create("resnet18", num_classes=10, norm="bn"),
            jnp.asarray(cf["image"]), jnp.asarray(cf["label"]))
        pairs += [("cifar cifar_nv_crop data", "cifar_nv step"),
                  ("cifar crop_flip data", "resnet18 step")]

    timings = time_interleaved(candidates, repeats=3 if args.quick else 7, min_sample_seconds=0.2)
    print("\n".join(f"- {line}" for line in machine_lines()))
    print(f"- batch {b}; data candidates on the calling thread (no prefetch)\n")
    print("| candidate | ms / batch | images / s |")
    print("| --- | --- | --- |")
    for name, timing in timings.items():
        print(f"| {name} | {timing.median * 1e3:.3f} | {b / timing.median:.0f} |")
    print()
    for data_name, step_name in pairs:
        ratio = paired_ratio(timings[step_name], timings[data_name])
        print(f"{data_name} vs {step_name}: data {ratio:.2f}x as fast as the step (paired; "
              "> 1: not the bottleneck)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
