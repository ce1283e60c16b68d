"""Norm matters on Fashion-MNIST: L2 vs L1 vs L∞ vs top-k BN, BWN + mean-only BN vs WN, low precision.

Hoffer et al. (2018), *Norm matters*, suppl. Table 2 (L1 BN matches L2 BN: ResNet-56 / CIFAR-10
93.07% vs 93.03%), Sec. 4 (L∞ and top-k BN train about as well), suppl. Table 1 (bounded weight
norm + mean-only BN 92.88% vs BN 93.03% vs WN 92.5% on ResNet-56 / CIFAR-10) and Sec. 4.1 (L1 / L∞
BN are robust in low precision). Scaled down for 2 CPU cores: a 3 x 256 ReLU MLP on Fashion-MNIST
(offline), SGD momentum 0.9, lr 0.1 cosine, weight decay 5e-4 on kernels, 3 epochs, batch 128.
``python -m experiments fmnist_norm_matters`` runs the L2 / L1 / L∞ / top-k sweep for one seed;
``python experiments/scripts/grid.py fmnist_norm_matters`` runs every ``VARIANTS`` entry over
``SEEDS`` (mean ± std). For the convolutional setting see cifar10_resnet56_norm_matters.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
VARIANTS = {
    "l2bn": {"model.norm": "bn"},
    "l1bn": {"model.norm": "l1bn"},
    "linfbn": {"model.norm": "linfbn"},
    "topk10bn": {"model.norm": "topk"},
    "bwn+meanbn": {"model.norm": "bwn", "optimizer.weight_decay": 0.0},
    "wn": {"model.norm": "wn"},
    "none": {"model.norm": "none"},
    "l2bn-bf16": {"model.norm": "bn", "precision": "bfloat16"},
    "l1bn-bf16": {"model.norm": "l1bn", "precision": "bfloat16"},
    "linfbn-bf16": {"model.norm": "linfbn", "precision": "bfloat16"},
    "l2bn-fp16": {"model.norm": "bn", "precision": "float16"},
    "l1bn-fp16": {"model.norm": "l1bn", "precision": "float16"},
    "linfbn-fp16": {"model.norm": "linfbn", "precision": "float16"},
}
"""grid.py variants. BWN runs without weight decay: its weight norms are fixed by the projection."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_norm_matters"
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
            "warmup_steps": 100,
            "weight_decay": 5e-4,
            "weight_decay_mask": "kernels",
        }
    )
    config.sweep.key = "model.norm"
    config.sweep.grid = ("bn", "l1bn", "linfbn", "topk")
    return config
