"""CIFAR-10 VGG16 / ResNet-18 + BN: WD vs WRS (vs BWN), SGDM and AdamW (Liu et al. Table 1): accelerator.

Liu et al., Table 1 and Supp. B: BN after every conv, 200 epochs, lr x 0.1 at epochs 60 / 120 /
160, SGDM lr 0.1 / AdamW lr 1e-3, lambda = 5e-4 (the supplement sets it "in both WRS and WD"; the
WRS variants here use WRS alone, add --set optimizer.weight_decay=5e-4 for the other reading);
WRS step size tau from Table S1 (VGG16: 40 except SGDM C10 20; ResNet-18 SGDM C10: 20, AdamW C10:
40); AdamW + WRS trains 100 epochs with decays at 30 / 60 / 80. ResNet-18 (CIFAR stem, projection
shortcuts with BN) with --set model.name=resnet18 model.kwargs.stem=cifar; CIFAR-100 with --set
dataset.name=cifar100. ``python experiments/scripts/grid.py cifar10_wrs``. Needs TFDS's cifar10
(online) and an accelerator; not run here. VGG16 here ends in global pooling + one classifier.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
_ADAMW = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}
_WRS = {"optimizer.weight_decay": 0.0, "optimizer.wrappers": ("wrs",)}
VARIANTS = {
    "sgdm+wd": {},
    "sgdm+wrs": {**_WRS, "optimizer.wrapper_kwargs": {"wrs": {"tau": 20}}},
    "sgdm+bwn": {"model.norm": "bwn", "optimizer.weight_decay": 0.0},
    "adamw+wd": {**_ADAMW},
    "adamw+wrs": {**_ADAMW, **_WRS, "optimizer.wrapper_kwargs": {"wrs": {"tau": 40}},
                  "num_epochs": 100.0, "optimizer.boundaries": (0.3, 0.6, 0.8)},
}
"""grid.py variants (Table 1 rows, Fig. 8's BWN)."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_wrs"
    config.model.name = "vgg16"
    config.model.norm = "bn"
    config.model.kwargs = {}
    config.dataset.name = "cifar10"
    config.dataset.batch_size = 128
    config.dataset.augment = "crop_flip"
    config.num_epochs = 200.0
    config.log_every = 100
    config.checkpoint_every = 2000
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "step",
            "boundaries": (0.3, 0.6, 0.8),
            "decay_factor": 0.1,
            "weight_decay": 5e-4,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {"wrs": {"tau": 20}},
        }
    )
    config.sweep.key = "optimizer.wrappers"
    config.sweep.grid = ((), ("wrs",))
    config.sweep.names = ("sgdm+wd", "sgdm+wrs")
    return config
