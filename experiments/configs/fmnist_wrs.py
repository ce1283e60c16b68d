"""Weight rescaling vs weight decay vs BWN on a BN MLP, SGD-momentum and AdamW (Fashion-MNIST, offline).

Liu et al., *The implicit biases of SGD on deep neural networks with batch normalization*, Table 1
and Fig. 8: on BN networks, weight rescaling (WRS: every tau steps, every kernel's units are set to
unit l2 norm) matches or beats weight decay (WD) with SGD-momentum and AdamW (e.g. VGG16 / CIFAR-10
SGDM 92.37 vs 92.24, AdamW 93.32 vs 92.40), and BWN + mean-only BN converges fastest early on.
Scaled down for 2 CPU cores: a 3 x 256 ReLU MLP with BN on Fashion-MNIST, 3 epochs, batch 128;
SGDM lr 0.1, AdamW lr 1e-3, cosine. WD: 5e-4 (L2, SGDM) and 0.05 (decoupled, AdamW); WRS tau 20 (SGDM)
/ 40 (AdamW): Table S1's ResNet-18 / CIFAR-10 values (for VGG16 it gives 40 in every cell); the
per-unit norms are logged, giving the weight-norm dynamics (Figs. 2-3:
growth without WD, decay with WD). ``python -m experiments fmnist_wrs`` sweeps the SGDM regularizers
for one seed; ``python experiments/scripts/grid.py fmnist_wrs`` runs all ``VARIANTS`` x ``SEEDS``.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
_ADAMW = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}
VARIANTS = {
    "sgdm": {},
    "sgdm+wd": {"optimizer.weight_decay": 5e-4},
    "sgdm+wrs": {"optimizer.wrappers": ("wrs",), "optimizer.wrapper_kwargs": {"wrs": {"tau": 20}}},
    "sgdm+bwn": {"model.norm": "bwn"},
    "adamw": {**_ADAMW},
    "adamw+wd": {**_ADAMW, "optimizer.weight_decay": 0.05},
    "adamw+wrs": {**_ADAMW, "optimizer.wrappers": ("wrs",), "optimizer.wrapper_kwargs": {"wrs": {"tau": 40}}},
    "adamw+bwn": {**_ADAMW, "model.norm": "bwn"},
    "sgdm+wrs, state rescaled": {
        "optimizer.wrappers": ("wrs_state",),
        "optimizer.wrapper_kwargs": {"wrs_state": {"tau": 20}},
    },
    "adamw+wrs, state rescaled": {
        **_ADAMW,
        "optimizer.wrappers": ("wrs_state",),
        "optimizer.wrapper_kwargs": {"wrs_state": {"tau": 40}},
    },
}
"""grid.py variants: base optimizer x regularizer (none, WD, WRS, BWN + mean-only BN); WRS with the
optimizer's state rescaled with the weights (``wrs_state``) vs left alone (``wrs``)."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_wrs"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.num_epochs = 3.0
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
