"""Survey: scaled weight norm keeps forward and backward norms stable with depth; plain weight norm does not.

Arpit, Campos & Bengio (2019), in Arpit's *Normalization techniques* slides: with weight norm
``W = g v / ||v||`` every ReLU layer changes the activation scale by a factor that depends on its
fan-in and fan-out; scaled weight norm multiplies by ``sqrt(gain * fan_in / fan_out)`` (gain 2
before a ReLU, 1/N at the end of each of N residual branches) and keeps the activation and gradient
norms of order one at any depth. No training: each run is one step at learning rate 0 (the params
stay at their init), and the analysis measures the run's initialization on the first 256
Fashion-MNIST training images: the logit RMS, the per-layer activation RMS, and the ratio of the
cross-entropy's gradient norms of the first and last hidden layers' directions ``v`` (ResNet-56:
the stem and the last block), for MLPs of 2-32 hidden layers (width 256) and ResNet-56 (width 16,
option-A shortcuts) with ``wn`` and ``swn``. ``python experiments/scripts/grid.py fmnist_swn_depth``
prints the table and draws ``<out>/fmnist_swn_depth_analysis.png``.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0,)
DEPTHS = (2, 4, 8, 16, 32)
VARIANTS = {
    **{
        f"MLP {norm} depth {d}": {"model.norm": norm, "model.kwargs.depth": d}
        for norm in ("wn", "swn")
        for d in DEPTHS
    },
    **{
        f"ResNet-56 {norm}": {"model.name": "resnet56", "model.norm": norm, "model.kwargs": {}}
        for norm in ("wn", "swn")
    },
}
"""grid.py variants."""
ANALYSIS = "swn_depth"


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_swn_depth"
    config.model.name = "mlp"
    config.model.norm = "swn"
    config.model.kwargs = {"depth": 8, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 256
    config.dataset.eval_split = "test[:256]"
    config.dataset.eval_batch_size = 256
    config.num_steps = 1
    config.log_every = 1
    config.checkpoint_every = 0
    config.optimizer.update({"name": "sgd", "learning_rate": 0.0, "weight_decay": 0.0})
    config.sweep.key = "model.norm"
    config.sweep.grid = ("wn", "swn")
    return config
