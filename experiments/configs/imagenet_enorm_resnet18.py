"""ImageNet ResNet-18 (type C): baseline / BN / GN / ENorm-1 across batch sizes (ENorm Table 4): accelerator.

Stock et al. (2019), Sec. 6.3, setting by setting (the config's value in brackets): ResNet-18 with
type-C learnt skip connections (Sec. 4) [``resnet18``, ImageNet stem, ``shortcut = "C"``]; Kaiming
init; the standard augmentation of Szegedy et al. [``inception_crop_flip``]; 90 epochs of SGD with
momentum 0.9; initial learning rate ``0.1 B / 256`` (linear scaling) for batch size ``B`` in
{32, 64, 128, 256} [:data:`BATCH_SIZES`, :func:`learning_rate`]; weight decay 1e-4 for B = 128 and
256, 10^-4.5 for B = 64, 1e-5 for B = 32 [:data:`WEIGHT_DECAY`]; learning rate decayed quadratically
to 1e-5; GN with 32 groups; a BN after the classifier for the baseline and ENorm (its statistics
shared across GPUs) [``final_bn``]; the median error of the final 5 epochs reported [evaluation
every epoch: the last five ``eval`` records of the run's history]. One ``<method> b<B>`` variant
per cell of Table 4 (:data:`VARIANTS`)::

    python experiments/scripts/grid.py imagenet_enorm_resnet18 --seeds 0 --only "enorm-1 b64"

Deviations: the paper trains on 8 GPUs and computes BN's statistics per GPU; here they are over the
whole batch on one host (``--config.model.virtual_batch_size=<B / 8>`` gives per-GPU-sized ghost
batches; whether the paper's ``B`` is per GPU or in total is not stated, this config reads it as the
total); which parameters get weight decay is not stated (here: the kernels); the number of runs per
cell is not stated (here: one seed). Needs TFDS's ``imagenet2012`` prepared from the manual
download. Never run here.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0,)
BATCH_SIZES = (32, 64, 128, 256)
WEIGHT_DECAY = {32: 1e-5, 64: 10**-4.5, 128: 1e-4, 256: 1e-4}
"""Sec. 6.3: weight decay per batch size (smaller batches take more steps per epoch)."""
GN_GROUPS = 32


def learning_rate(batch_size: int) -> float:
    """The linear scaling rule of Sec. 6.3: ``0.1 B / 256``."""
    return 0.1 * batch_size / 256


def cell(batch_size: int) -> dict:
    """The overrides of one batch-size row of Table 4."""
    return {
        "dataset.batch_size": batch_size,
        "optimizer.learning_rate": learning_rate(batch_size),
        "optimizer.weight_decay": WEIGHT_DECAY[batch_size],
    }


_FINAL_BN = {"model.kwargs.final_bn": True}
METHODS = {
    "baseline": {"model.norm": "none", **_FINAL_BN},
    "bn": {"model.norm": "bn"},
    "gn": {"model.norm": "gn", "model.kwargs.num_groups": GN_GROUPS},
    "enorm-1": {
        "model.norm": "none",
        **_FINAL_BN,
        "optimizer.wrappers": ("enorm",),
        "optimizer.wrapper_kwargs": {"enorm": {"c": 1.0}},
    },
}
"""Table 4's columns (ENorm-1: "values of c different from 1 did not yield better results")."""
VARIANTS = {
    f"{method} b{b}": {**overrides, **cell(b)} for b in BATCH_SIZES for method, overrides in METHODS.items()
}
"""grid.py variants: every cell of Table 4."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/imagenet_enorm_resnet18"
    config.model.name = "resnet18"
    config.model.norm = "bn"
    config.model.kwargs = {
        "stem": "imagenet",
        "shortcut": "C",
        "kernel_init": "kaiming",
        "final_bn": False,
        "num_groups": GN_GROUPS,
    }
    config.dataset.name = "imagenet2012"
    config.dataset.train_split = "train"
    config.dataset.eval_split = "validation"
    config.dataset.augment = "inception_crop_flip"
    config.dataset.batch_size = 256
    config.dataset.eval_batch_size = 250
    config.num_epochs = 90.0
    config.eval_every = 0  # every epoch: the median of the last five is the paper's number
    config.log_every = 100
    config.checkpoint_every = 5000
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": learning_rate(256),
            "momentum": 0.9,
            "schedule": "quadratic",
            "end_value": 1e-5,
            "weight_decay": WEIGHT_DECAY[256],
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {"enorm": {"c": 1.0}},
        }
    )
    config.sweep.key = "model.norm"
    config.sweep.grid = ("bn", "gn")
    return config
