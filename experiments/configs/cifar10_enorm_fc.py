"""CIFAR-10 fully connected depth sweep (ENorm Sec. 6.1, Fig. 4), the paper's settings: accelerator config.

Stock et al. (2019), Sec. 6.1, setting by setting (the config's value in brackets): input 3072 ->
500, ``p`` layers 500 x 500, classifier 500 x 10 [``mlp``, width 500, ``depth = p + 1`` hidden
layers]; Xavier init; inputs standardized per channel, no augmentation; 60 epochs of SGD without
momentum, batch 256, weight decay 1e-3, learning rate decayed linearly to zero; the initial rate
cross-validated in {0.0005, 0.001, 0.005, 0.01, 0.05, 0.1} [:data:`LEARNING_RATES`: the config's
built-in sweep, run on the 40k / 10k train / validation split]; GN groups cross-validated in
{5, 10, 20, 50} [:data:`GN_GROUPS`: the ``gn-<groups>`` variants]; methods baseline, BN, GN,
ENorm-1, ENorm-1.2 (one ENorm cycle after every SGD step, Alg. 2) [:data:`VARIANTS`].

Selection, then the test number, per depth and method::

    python -m experiments cifar10_enorm_fc --config.model.kwargs.depth=9 [--config.model.norm=bn]
    python experiments/scripts/grid.py cifar10_enorm_fc --set model.kwargs.depth=9 \\
        optimizer.learning_rate=<chosen> dataset.train_split=train dataset.eval_split=test

Deviations: the paper does not say how its cross-validation splits the data (here: the last 10,000
training images are the validation split); ENorm's last junction (the units the classifier reads)
is balanced, which the authors' code skips (REPRODUCTION.md, "ENorm-1.2 at depth 16"); the hidden
layers have biases (rescaled with their units). ``--config.dataset.name=cifar10_jpeg`` for the
offline JPEG copy. Not run here.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
LEARNING_RATES = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1)
"""The paper's cross-validation grid for the initial learning rate."""
GN_GROUPS = (5, 10, 20, 50)
"""The paper's cross-validation grid for GN's number of groups."""
_ENORM = {"optimizer.wrappers": ("enorm",)}
VARIANTS = {
    "baseline": {"model.norm": "none"},
    "bn": {"model.norm": "bn"},
    **{f"gn-{g}": {"model.norm": "gn", "model.kwargs.num_groups": g} for g in GN_GROUPS},
    "enorm-1": {**_ENORM, "optimizer.wrapper_kwargs": {"enorm": {"c": 1.0}}},
    "enorm-1.2": {**_ENORM, "optimizer.wrapper_kwargs": {"enorm": {"c": 1.2}}},
}
"""grid.py variants: Fig. 4's methods, GN once per group count; the depth ``p`` is
``model.kwargs.depth - 1`` hidden 500 x 500 layers."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_enorm_fc"
    config.model.name = "mlp"
    config.model.norm = "none"
    # depth = number of hidden layers = 1 (3072 x 500) + p (500 x 500); p = 3 here (Annex D, Fig. 10)
    config.model.kwargs = {"depth": 4, "width": 500, "kernel_init": "xavier"}
    config.dataset.name = "cifar10"
    config.dataset.train_split = "train_minus_validation"
    config.dataset.eval_split = "validation"
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
    config.sweep.key = "optimizer.learning_rate"
    config.sweep.grid = LEARNING_RATES
    config.sweep.names = tuple(f"lr={lr:g}" for lr in LEARNING_RATES)
    return config
