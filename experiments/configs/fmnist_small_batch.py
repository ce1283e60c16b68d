"""Survey: BN vs ghost BN vs LN vs GN vs WN vs NormProp at small batch sizes (Fashion-MNIST subset, offline).

Arpit, *Normalization techniques* (slides): batch norm's statistics get noisy as the batch shrinks,
so its accuracy drops at small batch sizes, while layer norm, group norm, weight norm and
normalization propagation do not depend on the batch. A 3 x 256 ReLU MLP on the first 10,000
Fashion-MNIST training images, 2 epochs, SGD momentum 0.9, cosine decay, weight decay 5e-4; the
learning rate follows the linear scaling rule (0.1 at batch 128). ``python
experiments/scripts/grid.py fmnist_small_batch --set dataset.batch_size=4
optimizer.learning_rate=0.003125`` is one column; the default is batch 128.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1)
VARIANTS = {
    "none": {"model.norm": "none"},
    "bn": {"model.norm": "bn"},
    "ln": {"model.norm": "ln"},
    "gn": {"model.norm": "gn", "model.kwargs.num_groups": 16},
    "wn": {"model.norm": "wn"},
    "normprop": {"model.norm": "normprop"},
}
"""grid.py variants."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_small_batch"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.train_split = "train[:10000]"
    config.dataset.batch_size = 128
    config.num_epochs = 2.0
    config.log_every = 50
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "cosine",
            "weight_decay": 5e-4,
            "weight_decay_mask": "kernels",
        }
    )
    config.sweep.key = "model.norm"
    config.sweep.grid = ("bn", "ln", "gn", "wn", "normprop")
    return config
