"""CIFAR-10 CIFAR-NV batch-size tables (ENorm Tables 2, 3, 5, 6), the paper's settings: accelerator config.

Stock et al. (2019), Sec. 6.2, setting by setting (the config's value in brackets): Gitman &
Ginsburg's fully convolutional CIFAR-NV [``cifar_nv``], Xavier init; 28 x 28 random crops +
horizontal flips, center crops at test [``cifar_nv_crop``]; 40,000 train / 10,000 validation images
[``train_minus_validation`` / ``validation``]; 128 epochs of SGD, without momentum (Tables 2 / 5) or
with momentum 0.9 (Tables 3 / 6) [``--set optimizer.name=momentum``]; weight decay 1e-3; learning
rate cross-validated on the held-out set in {0.01, 0.05, 0.1} [:data:`LEARNING_RATES`: the config's
built-in sweep, evaluated on the validation split] and decayed quadratically to 1e-4; a BN after the
classifier for the baseline and ENorm; GN groups cross-validated in {4, 8, 16, 32, 64}
[:data:`GN_GROUPS`: the ``gn-<groups>`` variants]; batch sizes 8 ... 256 [:data:`BATCH_SIZES`]; 5
runs averaged [:data:`SEEDS`], reported on the test set.

One table cell, selection then the test number::

    python -m experiments cifar10_enorm_nv --config.dataset.batch_size=32 [--config.optimizer.name=momentum]
    python experiments/scripts/grid.py cifar10_enorm_nv --set dataset.batch_size=32 \
        optimizer.learning_rate=<chosen> dataset.eval_split=test

Deviations: none in the recipe; the paper does not say whether the final runs retrain on all 50,000
images (here they train on the 40,000). ``--config.dataset.name=cifar10_jpeg`` for the offline JPEG
copy. Not run here.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2, 3, 4)
LEARNING_RATES = (0.01, 0.05, 0.1)
"""The paper's cross-validation grid for the initial learning rate."""
GN_GROUPS = (4, 8, 16, 32, 64)
"""The paper's cross-validation grid for GN's number of groups."""
BATCH_SIZES = (8, 16, 32, 64, 128, 256)
"""Tables 2-3 (8 ... 128) and 5-6 (... 256)."""
_FINAL_BN = {"model.kwargs.final_bn": True}
VARIANTS = {
    "baseline": {"model.norm": "none", **_FINAL_BN},
    "bn": {"model.norm": "bn"},
    **{f"gn-{g}": {"model.norm": "gn", "model.kwargs.num_groups": g} for g in GN_GROUPS},
    "enorm-1": {
        "model.norm": "none",  # the paper's ENorm nets: no BN but the final one (Sec. 6.2)
        **_FINAL_BN,
        "optimizer.wrappers": ("enorm",),
        "optimizer.wrapper_kwargs": {"enorm": {"c": 1.0}},
    },
    "enorm-1.2": {
        "model.norm": "none",  # the paper's ENorm nets: no BN but the final one (Sec. 6.2)
        **_FINAL_BN,
        "optimizer.wrappers": ("enorm",),
        "optimizer.wrapper_kwargs": {"enorm": {"c": 1.2}},
    },
}
"""grid.py variants (Tables 2 / 3 columns)."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_enorm_nv"
    config.model.name = "cifar_nv"
    config.model.norm = "bn"
    config.model.kwargs = {"kernel_init": "xavier", "final_bn": False}
    config.dataset.name = "cifar10"
    config.dataset.train_split = "train_minus_validation"
    config.dataset.eval_split = "validation"
    config.dataset.augment = "cifar_nv_crop"
    config.dataset.batch_size = 128
    config.num_epochs = 128.0
    config.log_every = 100
    config.checkpoint_every = 2000
    config.optimizer.update(
        {
            "name": "sgd",
            "learning_rate": 0.05,
            "momentum": 0.9,
            "schedule": "quadratic",
            "end_value": 1e-4,
            "weight_decay": 1e-3,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {"enorm": {"c": 1.2}},
        }
    )
    config.sweep.key = "optimizer.learning_rate"
    config.sweep.grid = LEARNING_RATES
    config.sweep.names = tuple(f"lr={lr:g}" for lr in LEARNING_RATES)
    return config
