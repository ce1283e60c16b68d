"""Fashion-MNIST MLP: BN vs L1-BN vs L∞-BN vs GN, full data, offline (about 5 min on 2 CPU cores).

Hoffer et al. (2018), "Norm matters", Sec. 4: batch norm with the L1 or L∞ dispersion in place of the
standard deviation trains as well as L2 batch norm (their Table 1 / Fig. 2, on CIFAR and ImageNet).
The same comparison, plus group norm, at a size a laptop CPU runs in minutes: a 3 x 256 ReLU MLP,
a norm after every hidden layer, on Fashion-MNIST read offline from the Debian package
dataset-fashion-mnist (60,000 train / 10,000 test images). Each run writes
runs/fmnist_norms/<norm>/ (metrics.jsonl, checkpoints, plots); the command prints a results table and
saves overlaid accuracy / loss / weight-norm plots in runs/fmnist_norms/. Convolutional nets are the
GPU configs' business: on 2 CPU cores a small CNN trains at a few hundred images per second.
"""

from jaxnorm.train.experiment import experiment_defaults


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_norms"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.num_epochs = 8.0
    config.log_every = 50
    config.eval_every = 0  # every epoch
    config.checkpoint_every = 500
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "cosine",
            "warmup_steps": 100,
            "weight_decay": 5e-4,
            "weight_decay_mask": "kernels",
        }
    )
    config.sweep.key = "model.norm"
    config.sweep.grid = ("bn", "l1bn", "linfbn", "gn")
    return config
