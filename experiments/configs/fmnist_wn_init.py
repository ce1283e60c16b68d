"""Survey: weight norm with and without the data-dependent init (Salimans & Kingma 2016, Sec. 3), 16 layers.

Weight norm ``W = g v / ||v||`` leaves the activation scale to ``g``: initialized as the plain layer
(``g = ||v||``, Xavier ``v``) the signal of a deep ReLU MLP shrinks layer after layer; the
data-dependent init sets ``g`` and the bias from a batch so that every pre-activation starts with
zero mean and unit variance (``g_init="data"``). 16 hidden layers of 256 units with weight norm only,
SGD momentum 0.9, cosine, batch 128, 2 epochs; ``g_init`` in {``norm``, ``ones`` (flax's g = 1),
``data``}; ``model.init`` sees the first 512 training images of the first epoch (``init_examples``,
the loop's data-dependent-init hook). The analysis reports the logit RMS at init.
``python experiments/scripts/grid.py fmnist_wn_init --set optimizer.learning_rate=0.005`` (and 0.02,
the default): the two learning rates of the write-up.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1)
VARIANTS = {name: {"model.kwargs.g_init": name} for name in ("norm", "ones", "data")}
"""grid.py variants: weight norm's ``g`` initialisation."""
ANALYSIS = "wn_init"


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_wn_init"
    config.model.name = "mlp"
    config.model.norm = "wn"
    config.model.kwargs = {"depth": 16, "width": 256, "kernel_init": "xavier", "g_init": "norm"}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.init_examples = 512
    config.num_epochs = 2.0
    config.log_every = 50
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.02,
            "momentum": 0.9,
            "schedule": "cosine",
            "weight_decay": 0.0,
        }
    )
    config.sweep.key = "model.kwargs.g_init"
    config.sweep.grid = ("norm", "ones", "data")
    return config
