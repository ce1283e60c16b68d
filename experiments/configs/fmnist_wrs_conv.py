"""WD vs WRS vs BWN on a narrow VGG11 / ResNet-18 with BN (Liu et al. Table 1, Fig. 8), Fashion-MNIST subset.

The ``fmnist_wrs`` variants (SGDM / AdamW x none / WD / WRS / BWN + mean-only BN, and WRS with the
optimizer state rescaled) on the convolutional networks of Liu et al.'s Table 1, scaled down for
2 CPU cores: VGG11 + BN with every conv at a quarter of its channels (16 ... 128), or ``--set
model.name=resnet18 "model.kwargs={'width': 16}"`` (ResNet-18 + BN, CIFAR stem, 16 ... 128
channels), on the first 10,000 Fashion-MNIST training images (28 x 28; no augmentation), 4
epochs, batch 128, cosine decay; SGDM lr 0.1, AdamW lr 1e-3; WD 5e-4 (L2) with SGDM and 0.05
(decoupled) with AdamW; WRS tau 20 (SGDM) / 40 (AdamW): Table S1's ResNet-18 / CIFAR-10 values
(for VGG16 Table S1 gives 40 in every cell, so the VGG11 + SGDM runs do not use the paper's tau).
Paper: VGG16 / ResNet-18 on
CIFAR-10/100, 200 epochs (``cifar10_wrs``). ``python experiments/scripts/grid.py fmnist_wrs_conv``.
"""

from experiments.configs.fmnist_wrs import VARIANTS as _MLP_VARIANTS
from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1)
VARIANTS = dict(_MLP_VARIANTS)
"""grid.py variants: those of ``fmnist_wrs``."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_wrs_conv"
    config.model.name = "vgg11"
    config.model.norm = "bn"
    config.model.kwargs = {"width_multiplier": 0.25}
    config.dataset.name = "fashion_mnist"
    config.dataset.train_split = "train[:10000]"
    config.dataset.batch_size = 128
    config.num_epochs = 4.0
    config.log_every = 20
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "cosine",
            "weight_decay": 0.0,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {"wrs": {"tau": 20}},
        }
    )
    config.sweep.key = "optimizer.wrappers"
    config.sweep.grid = ((), ("wrs",))
    config.sweep.names = ("sgdm", "sgdm+wrs")
    return config
