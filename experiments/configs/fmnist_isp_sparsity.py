"""Liu et al. Fig. 5: WD makes BN-followed weights sparse in the input span (ISP), not in parameter space.

Liu et al. (Sec. 4.2) project each BN-followed kernel onto the eigenvectors of its input covariance
(input-span projection, ISP, ``jaxnorm.diagnostics.input_span_projection``) and fit a generalized
Gaussian to the projected and to the raw weights (``fit_generalized_gaussian``): with weight decay
the ISP's shape ``beta`` is small (heavy-tailed: a few input-span directions carry the weight) while
the raw weights stay Gaussian-like; WRS, they report, is WD-like in the ISP of early layers. Here: a
3 x 256 ReLU MLP with BN on Fashion-MNIST (offline), SGD momentum 0.9, lr 0.1 cosine, batch 128, 3
epochs, without WD, with WD 5e-3 on the hidden kernels, and with WRS (tau 20; Table S1: 40 for
VGG16). The analysis (``ANALYSIS``, :mod:`experiments.scripts.analyses`) fits ``beta`` for hidden
layers 1 and 2, their inputs being the ReLU features on the first 2,000 training images.
``python experiments/scripts/grid.py fmnist_isp_sparsity`` prints ``beta`` (mean ± std over seeds).
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1)
VARIANTS = {
    "no wd": {},
    "wd": {"optimizer.weight_decay": 5e-3, "optimizer.weight_decay_mask": "hidden_kernels"},
    "wrs (tau 20)": {"optimizer.wrappers": ("wrs",), "optimizer.wrapper_kwargs": {"wrs": {"tau": 20}}},
}
"""grid.py variants."""
ANALYSIS = "isp_sparsity"


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_isp_sparsity"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.num_epochs = 3.0
    config.log_every = 50
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "cosine",
            "weight_decay": 0.0,
            "weight_decay_mask": "hidden_kernels",
            "wrappers": (),
            "wrapper_kwargs": {"wrs": {"tau": 20}},
        }
    )
    return config
