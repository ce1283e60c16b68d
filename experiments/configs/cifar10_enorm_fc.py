"""CIFAR-10 fully connected depth sweep (ENorm Sec. 6.1, Fig. 4), the paper's settings: accelerator config.

Stock et al. (2019), Sec. 6.1: input 3072 -> 500, ``p`` layers 500 x 500, classifier 500 x 10,
Xavier init, per-channel standardized input, no augmentation; 60 epochs of SGD without momentum,
batch 256, weight decay 1e-3, learning rate decayed linearly to zero (initial value cross-validated
in {0.0005, 0.001, 0.005, 0.01, 0.05, 0.1}: sweep it with --config.sweep.key=optimizer.learning_rate).
Variants (``python experiments/scripts/grid.py cifar10_enorm_fc --set model.kwargs.depth=p``):
baseline, BN, GN (groups cross-validated in {5, 10, 20, 50}), ENorm-1, ENorm-1.2. Needs TFDS's
cifar10 prepared (online); not run here.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
VARIANTS = {
    "baseline": {"model.norm": "none"},
    "bn": {"model.norm": "bn"},
    "gn": {"model.norm": "gn", "model.kwargs.num_groups": 10},
    "enorm-1": {"optimizer.wrappers": ("enorm",), "optimizer.wrapper_kwargs": {"enorm": {"c": 1.0}}},
    "enorm-1.2": {"optimizer.wrappers": ("enorm",), "optimizer.wrapper_kwargs": {"enorm": {"c": 1.2}}},
}
"""grid.py variants; the depth ``p`` is ``model.kwargs.depth - 1`` hidden 500 x 500 layers."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_enorm_fc"
    config.model.name = "mlp"
    config.model.norm = "none"
    # depth = number of hidden layers = 1 (3072 x 500) + p (500 x 500); p = 3 here (Annex D, Fig. 10)
    config.model.kwargs = {"depth": 4, "width": 500, "kernel_init": "xavier"}
    config.dataset.name = "cifar10"
    config.dataset.augment = "none"
    config.dataset.batch_size = 256
    config.num_epochs = 60.0
    config.log_every = 100
    config.checkpoint_every = 2000
    config.optimizer.update(
        {
            "name": "sgd",
            "learning_rate": 0.01,
            "schedule": "linear",
            "end_value": 0.0,
            "weight_decay": 1e-3,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {"enorm": {"c": 1.2}},
        }
    )
    config.sweep.key = "optimizer.wrappers"
    config.sweep.grid = ((), ("enorm",))
    config.sweep.names = ("baseline", "enorm-1.2")
    return config
