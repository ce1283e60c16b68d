"""CIFAR-10 CIFAR-NV batch-size tables (ENorm Tables 2, 3, 5, 6), the paper's settings: accelerator config.

Stock et al. (2019), Sec. 6.2: Gitman & Ginsburg's fully convolutional CIFAR-NV, Xavier init,
28 x 28 random crops + horizontal flips (center crops at test), 40,000 train / 10,000 validation
images, 128 epochs of SGD (no momentum: Tables 2 / 5; momentum 0.9: Tables 3 / 6), weight decay
1e-3, learning rate cross-validated in {0.01, 0.05, 0.1} and decayed quadratically to 1e-4, a BN
after the classifier for the baseline and ENorm, GN groups cross-validated in {4, 8, 16, 32, 64},
5 runs averaged. One table cell: ``python experiments/scripts/grid.py cifar10_enorm_nv --set
dataset.batch_size=32 [optimizer.name=momentum]`` (batch sizes 8, 16, 32, 64, 128, 256).
Reported on the test split; pass --config.dataset.eval_split=validation for model selection.
Needs TFDS's cifar10 prepared (online) and an accelerator; not run here.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2, 3, 4)
_FINAL_BN = {"model.kwargs.final_bn": True}
VARIANTS = {
    "baseline": {"model.norm": "none", **_FINAL_BN},
    "bn": {"model.norm": "bn"},
    "gn": {"model.norm": "gn", "model.kwargs.num_groups": 32},
    "enorm-1": {**_FINAL_BN, "optimizer.wrappers": ("enorm",),
                "optimizer.wrapper_kwargs": {"enorm": {"c": 1.0}}},
    "enorm-1.2": {**_FINAL_BN, "optimizer.wrappers": ("enorm",),
                  "optimizer.wrapper_kwargs": {"enorm": {"c": 1.2}}},
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
    config.dataset.eval_split = "test"
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
    config.sweep.key = "model.norm"
    config.sweep.grid = ("bn", "gn")
    return config
