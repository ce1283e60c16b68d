"""Time-dependence of WD and WRS (Liu et al. Fig. 7) on Fashion-MNIST: BN MLP, whole-run regularizers.

Liu et al., *The implicit biases of SGD on deep neural networks with batch normalization*, Sec. 5
and Fig. 7 (VGG16 + BN, CIFAR-10, 200 epochs, lr x 0.1 at epochs 60 / 120 / 160): weight decay
(WD) or weight rescaling (WRS) applied only after the first learning-rate decay ("WD 60-200")
does not give the benefit of applying it from the start; applied only before it, it does
(following Golatkar et al. 2019). Scaled down for one CPU core: a 3 x 256 ReLU MLP with BN on the
first 10,000 Fashion-MNIST training images, 60 epochs (4,680 steps: the small training set is
fitted, train loss ~0.01, the regime where WD helps here; at 15 epochs it does not), SGD momentum
0.9, lr 0.1 multiplied by 0.1 at 30 / 60 / 80 % of the run (the paper's 60 / 120 / 160 of 200),
batch 128; WD 5e-4 (L2, the paper's) on the kernels, WRS tau 20 (Table S1 gives 40 for
VGG16, the paper's network here; 20 is its ResNet-18 + SGDM value).
``VARIANTS`` holds the whole-run regularizers; ``python experiments/scripts/wd_time.py`` adds the
early-only and late-only ones (switched by step) and runs them all.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
WEIGHT_DECAY = 5e-4
TAU = 20
VARIANTS = {
    "none": {},
    "wd (whole run)": {"optimizer.weight_decay": WEIGHT_DECAY},
    "wrs (whole run)": {"optimizer.wrappers": ("wrs",), "optimizer.wrapper_kwargs": {"wrs": {"tau": TAU}}},
}
"""grid.py variants (the whole-run regularizers; wd_time.py adds the windowed ones)."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_wd_time"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.train_split = "train[:10000]"
    config.dataset.batch_size = 128
    config.num_epochs = 60.0
    config.log_every = 100
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "step",
            "boundaries": (0.3, 0.6, 0.8),
            "decay_factor": 0.1,
            "weight_decay": 0.0,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {"wrs": {"tau": TAU}},
        }
    )
    config.sweep.key = "optimizer.weight_decay"
    config.sweep.grid = (0.0, WEIGHT_DECAY)
    config.sweep.names = ("none", "wd")
    return config
