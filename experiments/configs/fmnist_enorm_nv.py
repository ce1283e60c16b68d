"""ENorm CIFAR-NV batch-size tables on Fashion-MNIST, scaled down: baseline vs BN vs GN vs ENorm-1 / 1.2.

Stock et al. (2019), Sec. 6.2, Tables 2, 3, 5, 6: the fully convolutional CIFAR-NV network
(Gitman & Ginsburg 2017), Xavier init, a BatchNorm after the classifier for the baseline and
ENorm (as the paper does), SGD without momentum (Tables 2 / 5) and with momentum 0.9 (Tables 3 /
6), weight decay 1e-3, learning rate decayed quadratically to 1e-4, batch sizes 8..256; the claim:
ENorm beats the baseline at every batch size and, at small batches, ENorm-1.2 is comparable to
BN. Scaled down for one CPU core: Fashion-MNIST (28 x 28 x 1, the network's input size, no
augmentation), channel widths (16, 32, 40) instead of (128, 256, 320), the first 10,000 training
images, 3 epochs (paper: 128 epochs of CIFAR-10), one learning rate per optimizer for every batch
size and method, from the paper's grid {0.01, 0.05, 0.1} but not cross-validated: 0.05 without
momentum, 0.01 with momentum 0.9 (the same effective step ``lr / (1 - momentum)`` up to 2x).

    python experiments/scripts/enorm_nv.py          # every table cell (batch x momentum), 1 seed
    python -m experiments fmnist_enorm_nv           # BN vs GN at batch 128 without momentum
    python experiments/scripts/grid.py fmnist_enorm_nv --only baseline bn gn \
        --set dataset.batch_size=8 [optimizer.name=momentum optimizer.learning_rate=0.01]
        # one cell without ENorm (grid.py cannot pass ENorm the discovered spec; the script does)
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1)
_FINAL_BN = {"model.kwargs.final_bn": True}
VARIANTS = {
    "baseline": {"model.norm": "none", **_FINAL_BN},
    "bn": {"model.norm": "bn"},
    "gn": {"model.norm": "gn", "model.kwargs.num_groups": 8},
    "enorm-1": {**_FINAL_BN, "optimizer.wrappers": ("enorm",),
                "optimizer.wrapper_kwargs": {"enorm": {"c": 1.0}}},
    "enorm-1.2": {**_FINAL_BN, "optimizer.wrappers": ("enorm",),
                  "optimizer.wrapper_kwargs": {"enorm": {"c": 1.2}}},
}
"""grid.py variants (the columns of Tables 2 / 3)."""


def learning_rate(batch_size: int, momentum: float) -> float:
    """The learning rate of a table cell: 0.05 without momentum, 0.01 with (any batch size)."""
    del batch_size  # the paper picks one rate per cell from the same grid; no batch scaling here
    return 0.01 if momentum else 0.05


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_enorm_nv"
    config.model.name = "cifar_nv"
    config.model.norm = "none"
    config.model.kwargs = {"kernel_init": "xavier", "widths": (16, 32, 40), "final_bn": False}
    config.dataset.name = "fashion_mnist"
    config.dataset.train_split = "train[:10000]"
    config.dataset.batch_size = 128
    config.num_epochs = 3.0
    config.log_every = 20
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "sgd",
            "learning_rate": learning_rate(128, 0.0),
            "momentum": 0.9,  # used when name = "momentum" (Tables 3 / 6)
            "schedule": "quadratic",
            "end_value": 1e-4,
            "weight_decay": 1e-3,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {"enorm": {"c": 1.2}},
        }
    )
    config.sweep.key = "model.norm"  # the ENorm runs need the discovered spec: enorm_nv.py
    config.sweep.grid = ("bn", "gn")
    return config
