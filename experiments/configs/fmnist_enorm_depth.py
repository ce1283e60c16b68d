"""ENorm FC depth sweep on Fashion-MNIST: baseline vs BN vs GN vs ENorm-1 / 1.2, SGD without momentum.

Stock et al. (2019), Sec. 6.1 and Fig. 4: a fully connected ReLU net (input layer, ``p`` hidden
500 x 500 layers, classifier; Xavier init), SGD without momentum, batch 256, weight decay 1e-3,
learning rate decayed linearly to zero, 60 epochs on CIFAR-10; ENorm with c = 1.2 beats the
baseline, BN and GN at every depth. Scaled down here for 2 CPU cores: Fashion-MNIST (offline),
width 256, 3 epochs, one learning rate (0.05, not cross-validated). ``python -m experiments
fmnist_enorm_depth`` runs the baseline vs ENorm-1.2 sweep for one seed; ``python
experiments/scripts/grid.py fmnist_enorm_depth --set model.kwargs.depth=8`` runs every variant
of ``VARIANTS`` over ``SEEDS`` and prints mean ± std.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
VARIANTS = {
    "baseline": {"model.norm": "none"},
    "bn": {"model.norm": "bn"},
    "gn": {"model.norm": "gn", "model.kwargs.num_groups": 16},
    "enorm-1": {"optimizer.wrappers": ("enorm",), "optimizer.wrapper_kwargs": {"enorm": {"c": 1.0}}},
    "enorm-1.2": {"optimizer.wrappers": ("enorm",), "optimizer.wrapper_kwargs": {"enorm": {"c": 1.2}}},
}
"""grid.py variants (the model's depth comes from the base config or ``--set model.kwargs.depth=``)."""


def depth_sweep_setting():
    """The setting the ENorm Fashion-MNIST configs share (this sweep, ``fmnist_enorm_c_depth``,
    ``fmnist_implicit_enorm``): a ``depth`` x 256 ReLU MLP without normalization, Xavier init, SGD without
    momentum, batch 256, lr 0.05 decayed linearly to 0, weight decay 1e-3 on the kernels, 3 epochs."""
    config = experiment_defaults()
    config.model.name = "mlp"
    config.model.norm = "none"
    config.model.kwargs = {"depth": 2, "width": 256, "kernel_init": "xavier"}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 256
    config.num_epochs = 3.0
    config.log_every = 50
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "sgd",
            "learning_rate": 0.05,
            "schedule": "linear",
            "weight_decay": 1e-3,
            "weight_decay_mask": "kernels",
        }
    )
    return config


def get_config():
    config = depth_sweep_setting()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_enorm_depth"
    config.optimizer.wrappers = ()
    config.optimizer.wrapper_kwargs = {"enorm": {"c": 1.2}}
    config.sweep.key = "optimizer.wrappers"
    config.sweep.grid = ((), ("enorm",))
    config.sweep.names = ("baseline", "enorm-1.2")
    return config
