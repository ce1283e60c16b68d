"""Fashion-MNIST MLP without normalization: SGD vs SGD + ENorm after every step (offline, CPU minutes).

Stock et al. (2019), "Equi-normalization of neural networks", Sec. 6.1 / Alg. 2: after every SGD step,
one ENorm cycle rebalances the weights across layers (the network function is unchanged) and the
momentum is rescaled with the same factors (Eq. 10); fully connected nets use c = 1.2. Here a
3 x 256 ReLU MLP without BN on Fashion-MNIST (offline, dataset-fashion-mnist), trained with plain
SGD + momentum and with the ENorm wrapper (jaxnorm.optim.enorm). Results in runs/fmnist_mlp_enorm/.
"""

from jaxnorm.train.experiment import experiment_defaults


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_mlp_enorm"
    config.model.name = "mlp"
    config.model.norm = "none"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.num_epochs = 8.0
    config.log_every = 50
    config.checkpoint_every = 500
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.05,
            "momentum": 0.9,
            "schedule": "cosine",
            "warmup_steps": 100,
            "weight_decay": 0.0,
            "wrappers": (),
            "wrapper_kwargs": {"enorm": {"c": 1.2}},
        }
    )
    config.sweep.key = "optimizer.wrappers"
    config.sweep.grid = ((), ("enorm",))
    config.sweep.names = ("sgd", "sgd+enorm")
    return config
