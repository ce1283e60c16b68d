"""CIFAR-10 ResNet-56: L2 vs L1 vs L∞ BN, BN vs WN vs BWN + mean-only BN (Norm matters suppl. Tables 1-2).

Hoffer et al. (2018), suppl. Table 2 (ResNet-56 / CIFAR-10: L2 BN 93.03%, L1 BN 93.07%) and
Table 1 (BN 93.03%, WN 92.5%, BWN 92.88%). The supplement does not list the recipe; this is He et
al.'s (2016) CIFAR one: crop + flip, batch 128, SGD momentum 0.9, lr 0.1 divided by 10 at 50% and
75% of 160 epochs, weight decay 1e-4 on kernels (none for BWN, whose norms are fixed). Variants:
``python experiments/scripts/grid.py cifar10_resnet56_norm_matters``; float16 / bfloat16 runs with
--set precision=bfloat16. Needs TFDS's cifar10 prepared (online) and an accelerator; not run here.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
VARIANTS = {
    "l2bn": {"model.norm": "bn"},
    "l1bn": {"model.norm": "l1bn"},
    "linfbn": {"model.norm": "linfbn"},
    "topk10bn": {"model.norm": "topk"},
    "wn": {"model.norm": "wn"},
    "bwn+meanbn": {"model.norm": "bwn", "optimizer.weight_decay": 0.0},
}
"""grid.py variants (suppl. Tables 1 and 2 columns)."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_resnet56_norm_matters"
    config.model.name = "resnet56"
    config.model.norm = "bn"
    config.dataset.name = "cifar10"
    config.dataset.batch_size = 128
    config.dataset.augment = "crop_flip"
    config.num_epochs = 160.0
    config.log_every = 100
    config.checkpoint_every = 2000
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "step",
            "boundaries": (0.5, 0.75),
            "decay_factor": 0.1,
            "weight_decay": 1e-4,
            "weight_decay_mask": "kernels",
        }
    )
    config.sweep.key = "model.norm"
    config.sweep.grid = ("bn", "l1bn", "linfbn")
    return config
