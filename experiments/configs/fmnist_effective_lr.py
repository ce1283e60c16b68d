"""Norm matters Sec. 2 on Fashion-MNIST: WD mimicry without WD; a norm schedule in place of LR decay.

The six runs of ``cifar10_vgg11_norm_matters`` (read its docstring: ``wd`` reference with recorded
norms, ``no_wd``, ``no_wd_mimicry``, ``lr_schedule`` at unit norm, ``norm_schedule`` at constant
LR, ``constant_lr``) scaled down for 2 CPU cores: a 3 x 256 ReLU MLP with BN on Fashion-MNIST
(offline), SGD momentum 0.9, batch 128, 3 epochs, lr 0.1 divided by 10 after epochs 1 and 2, and
weight decay 5e-3 (paper: 5e-4 over 60 epochs; 3 epochs of 5e-4 barely move the norms) on the
classifier in every run and on the hidden kernels in ``wd``. Norms recorded every update.
``python experiments/scripts/grid.py fmnist_effective_lr`` runs the six over ``SEEDS``;
``python -m experiments fmnist_effective_lr`` runs them once.
"""

from experiments.configs.cifar10_vgg11_norm_matters import VARIANTS as _CIFAR_VARIANTS
from experiments.configs.cifar10_vgg11_norm_matters import set_effective_lr_sweep
from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
_MASKS = {name: "last_kernel" for name in _CIFAR_VARIANTS} | {"wd": "kernels"}
"""Weight decay masks of the committed runs (experiments/results/fmnist_effective_lr.json): the
classifier's kernel, every kernel for ``wd`` (the CIFAR config follows the authors' code instead)."""
VARIANTS = {
    name: {**overrides, "optimizer.weight_decay_mask": _MASKS[name]}
    for name, overrides in _CIFAR_VARIANTS.items()
}
VARIANTS["wd"]["optimizer.wrapper_kwargs"] = {"record_norms": {"every": 1}}
VARIANTS["no_wd_mimicry"]["optimizer.wrapper_kwargs"] = {"wd_mimicry": {"reference": "wd", "every": 1}}
"""grid.py variants (the CIFAR config's six, norms recorded and followed every update)."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_effective_lr"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.num_epochs = 3.0
    config.log_every = 50
    config.checkpoint_every = 0
    set_effective_lr_sweep(config, VARIANTS, 5e-3)
    return config
