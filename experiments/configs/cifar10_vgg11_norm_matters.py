"""CIFAR-10 VGG11 + BN: weight decay acts through the effective LR (WD mimicry, norm schedule): accelerator.

Hoffer et al. (2018), *Norm matters*, Sec. 2 and suppl. Sec. 1, with the length and the masks of the
authors' code (``eladhoffer/norm_matters``, ``normmatters_wd/run_all``, ``main.py``,
``optimizers_lib.py``): VGG11 with BN after every conv, batch 128, random crop (4-pixel padding) +
flip, SGD momentum 0.9, learning rate 0.1 divided by 10 every 20 epochs, **80 epochs** (decays at 20,
40 and 60: ``StepLR(step_size=num_epochs // 4)``), weight decay 5e-4 on the last layer in every run
(its kernel and bias), one seed. The BN'd convs are scale invariant: their direction moves by
``lr / ||w||^2`` per step, so weight decay acts on them only through the norm. Six runs, in this
order:

* ``wd``: weight decay 5e-4 on every parameter (the authors' reference: ``optim.SGD(...,
  weight_decay=5e-4)`` over all of them), its per-unit conv norms recorded (``record_norms``
  wrapper, every 10 updates; the run leaves ``recorded_norms.npz``);
* ``no_wd``: weight decay on the last layer only;
* ``no_wd_mimicry``: no weight decay on the convs, each unit's step scaled by
  ``||w||^2 / ||w_ref||^2`` with the ``wd`` run's norms (``wd_mimicry`` wrapper, reference
  ``wd``): the claim is that it reaches the ``wd`` run's accuracy, where ``no_wd`` does not;
* ``lr_schedule``: the LR schedule with the conv units held at unit norm (``norm_schedule``);
* ``norm_schedule``: the conv units step at the constant 0.1 while their norms grow as
  ``sqrt(0.1 / lr(t))`` (``norm_schedule_from_lr``): the claim is that it matches ``lr_schedule``;
* ``constant_lr``: the constant 0.1 at unit norm (no decay at all, the control).

Deviations: the authors' norm-scheduling run follows the recorded norms of the ``wd`` run
(``SGDWDMimicNormSchedInsteadLR``); ``norm_schedule`` here starts from unit norms and grows them by
``sqrt(lr_0 / lr(t))`` (the same effective step as ``lr_schedule``); ``lr_schedule`` and
``constant_lr`` are controls of this write-up, not runs of the paper; norms are recorded and
followed every 10 updates (the authors: per epoch); inputs are standardized with the train split's
statistics (the authors: fixed constants). Masks: the wrappers select the scale-invariant kernels
(traced from the model; the classifier is not one). ``python -m experiments
cifar10_vgg11_norm_matters`` runs the six in order in ``runs/cifar10_vgg11_norm_matters/<name>/``
(``no_wd_mimicry`` reads ``../wd/recorded_norms.npz``); ``python experiments/scripts/grid.py
cifar10_vgg11_norm_matters --seeds 0 1 2`` runs them over seeds; ``--config.dataset.name=cifar10_jpeg``
for the offline JPEG copy. Not run here. ``fmnist_effective_lr`` runs the same six variants on
Fashion-MNIST.
"""

import copy

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0,)
WEIGHT_DECAY = 5e-4
NUM_EPOCHS = 80.0
"""The authors' run length (``--num_epochs 80`` in ``normmatters_wd/run_all``)."""
_NO_WD = {"optimizer.weight_decay_mask": "last_layer"}
_HOLD_UNIT_NORM = {
    "optimizer.wrappers": ("norm_schedule",),
    "optimizer.wrapper_kwargs": {"norm_schedule": {"rho": 1.0}},
}
VARIANTS = {
    "wd": {
        "optimizer.weight_decay_mask": "all",
        "optimizer.wrappers": ("record_norms",),
        "optimizer.wrapper_kwargs": {"record_norms": {"every": 10}},
    },
    "no_wd": {**_NO_WD},
    "no_wd_mimicry": {
        **_NO_WD,
        "optimizer.wrappers": ("wd_mimicry",),
        "optimizer.wrapper_kwargs": {"wd_mimicry": {"reference": "wd", "every": 10}},
    },
    "lr_schedule": {**_NO_WD, **_HOLD_UNIT_NORM},
    "norm_schedule": {**_NO_WD, "optimizer.wrappers": ("norm_schedule_from_lr",)},
    "constant_lr": {**_NO_WD, **_HOLD_UNIT_NORM, "optimizer.schedule": "constant"},
}
"""grid.py variants, in run order (``no_wd_mimicry`` reads ``wd``'s recorded norms)."""


def optimizer_sweep(optimizer, variants) -> tuple[dict, ...]:
    """The ``optimizer`` block of each of ``variants`` (they differ only there): the sweep grid."""
    blocks = []
    for overrides in variants.values():
        block = copy.deepcopy(optimizer.to_dict())
        for key, value in overrides.items():
            block[key.removeprefix("optimizer.")] = value
        blocks.append(block)
    return tuple(blocks)


def set_effective_lr_sweep(config, variants, weight_decay: float, boundaries=(1 / 3, 2 / 3)) -> None:
    """The optimizer of the six runs (SGD momentum 0.9, lr 0.1 divided by 10 at ``boundaries``,
    fractions of the run; ``weight_decay`` on every kernel unless a variant sets its mask; the variants'
    wrappers) and the sweep over ``variants``, in order."""
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "step",
            "boundaries": tuple(boundaries),
            "decay_factor": 0.1,
            "weight_decay": weight_decay,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {},
        }
    )
    config.sweep.key = "optimizer"
    config.sweep.grid = optimizer_sweep(config.optimizer, variants)
    config.sweep.names = tuple(variants)


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_vgg11_norm_matters"
    config.model.name = "vgg11"
    config.model.norm = "bn"
    config.model.kwargs = {}
    config.dataset.name = "cifar10"
    config.dataset.batch_size = 128
    config.dataset.augment = "crop_flip"
    config.num_epochs = NUM_EPOCHS
    config.log_every = 100
    config.checkpoint_every = 2000
    set_effective_lr_sweep(config, VARIANTS, WEIGHT_DECAY, boundaries=(0.25, 0.5, 0.75))
    return config
