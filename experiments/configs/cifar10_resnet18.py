"""CIFAR-10 ResNet-18 (CIFAR stem) with BN, SGD + cosine, 200 epochs: the accelerator config.

The standard CIFAR-10 recipe (crop with 4-pixel padding + flip, batch 128, SGD momentum 0.9, lr 0.1,
weight decay 5e-4 on kernels, cosine decay) on ResNet-18 with the CIFAR stem; swap the norm with
--config.model.norm=l1bn (etc.) or sweep it with --config.sweep.key=model.norm. Needs TFDS's
cifar10 prepared (tfds.builder('cifar10').download_and_prepare(), online) and a GPU / TPU to finish
in hours; --config.precision=bfloat16 for mixed precision. Results in runs/cifar10_resnet18/.
"""

from jaxnorm.train.experiment import experiment_defaults


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_resnet18"
    config.model.name = "resnet18"
    config.model.norm = "bn"
    config.model.kwargs = {"stem": "cifar"}
    config.dataset.name = "cifar10"
    config.dataset.batch_size = 128
    config.dataset.augment = "crop_flip"
    config.num_epochs = 200.0
    config.log_every = 100
    config.checkpoint_every = 2000
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
    return config
