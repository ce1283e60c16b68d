"""Survey, the optimization view: top Hessian eigenvalue and largest stable SGD step, with and without BN.

Santurkar et al. (2018), as presented in Arpit's *Normalization techniques* slides (Sec. 7): batch
norm smooths the loss landscape, so gradient descent tolerates larger learning rates. Plain gradient
descent on a quadratic is stable for ``eta < 2 / lambda_max``. A 3 x 256 ReLU MLP on Fashion-MNIST
(offline), without normalization and with BN, trains 300 steps of plain SGD (batch 128, constant
learning rate) at each learning rate of :data:`LEARNING_RATES`; the analysis reports the final
training loss (a run is stable when every loss is finite and the last is below the first), and the
top Hessian eigenvalue of the training loss on the first 512 training images (30 Lanczos steps, BN
in training mode: the function SGD descends) at initialization and after the lr 0.1 run.
``python experiments/scripts/grid.py fmnist_hessian_lr`` prints the table and draws
``<out>/fmnist_hessian_lr_analysis.png``.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0,)
LEARNING_RATES = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
VARIANTS = {
    f"{norm} lr {lr:g}": {"model.norm": norm, "optimizer.learning_rate": lr}
    for norm in ("none", "bn")
    for lr in LEARNING_RATES
}
"""grid.py variants: ``<norm> lr <lr>`` (the analysis groups them by the first word)."""
ANALYSIS = "hessian_lr"


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_hessian_lr"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.num_steps = 300
    config.log_every = 1  # every step's loss: the stability test reads the first and the last
    config.weight_norms = False
    config.checkpoint_every = 0
    config.optimizer.update(
        {"name": "sgd", "learning_rate": 0.1, "schedule": "constant", "weight_decay": 0.0}
    )
    config.sweep.key = "model.norm"
    config.sweep.grid = ("none", "bn")
    return config
