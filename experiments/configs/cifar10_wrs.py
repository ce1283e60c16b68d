"""CIFAR-10 VGG16 / ResNet-18 + BN: WD vs WRS (vs BWN), SGDM and AdamW (Liu et al. Table 1): accelerator.

Liu et al., Sec. 6.1 and Supp. B.2, setting by setting (the config's value in brackets):

* networks: VGG16 with a BN after every conv [``vgg16``]; the ResNet-18 variant with a BN after
  every conv [``resnet18``, CIFAR stem: the ``resnet18 ...`` variants];
* batch size 100 for every image-recognition run [``dataset.batch_size = 100``];
* SGDM: lr 0.1, x 0.1 at epochs 60 / 120 / 160 of 200 [``step`` at 0.3 / 0.6 / 0.8; momentum 0.9,
  which the paper does not state];
  AdamW: lr 1e-3, the same schedule; AdamW + WRS: 100 epochs, decays at 30 / 60 / 80 [the same
  fractions of 100 epochs];
* WD: lambda = 5e-4 on every conv kernel and every BN gamma [``weight_decay_mask =
  "kernels_and_bn_scales"``: the classifier's kernel too, as every weight vector is rescaled in
  WRS]; WRS: every weight vector, the output layer's included, rescaled to unit norm
  every tau updates, and WD 5e-4 on the BN gammas only [``wrs`` wrapper on every kernel,
  ``weight_decay_mask = "bn_scales"``]; with AdamW the decay is decoupled [``adamw``];
* tau (Table S1, CIFAR-10): VGG16 40 with SGDM and AdamW; ResNet-18 20 (SGDM) and 40 (AdamW)
  [:data:`TAU`];
* BWN (Hoffer et al.'s code, as Liu et al. ran it): mean-only BN on the convs, WD 5e-4 on the final
  fully connected layer only, lr / schedule as WD and WRS [``bwn`` norm, ``weight_decay_mask =
  "last_layer"``];
* augmentation: random brightness, contrast, hue and saturation, a 32 x 32 crop of the image
  zero-padded to 38 x 38, flips [``colour_crop_flip``; the jitter ranges are not stated, TensorFlow's
  Inception ``distort_color`` ones stand in: ``jaxnorm.data.augment.COLOUR_JITTER``];
* 3 trials [:data:`SEEDS`]; reported on the test set.

Deviations (REPRODUCTION.md lists them too): the colour-jitter ranges (not stated; see above);
inputs standardized per channel after the augmentation (the paper: scaled to [0, 1]); the SGDM
momentum 0.9 (not stated); WD also on the classifier's kernel (the paper: on "all conv kernels" and
the BN gammas only); BWN's
classifier is weight-normalized as well (jaxnorm's ``bwn`` model); VGG16 ends in
global pooling + one classifier (on the 1 x 1 map of the last block this is the usual CIFAR VGG's
flatten + linear). ``python experiments/scripts/grid.py cifar10_wrs [--only ...]``;
``--config.dataset.name=cifar10_jpeg`` for the offline JPEG copy. Not run here.
"""

from experiments.configs.cifar10_vgg11_norm_matters import optimizer_sweep
from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)
BATCH_SIZE = 100
WEIGHT_DECAY = 5e-4
TAU = {("vgg16", "sgdm"): 40, ("vgg16", "adamw"): 40, ("resnet18", "sgdm"): 20, ("resnet18", "adamw"): 40}
"""WRS step size tau, Liu et al. Table S1 (CIFAR-10 column)."""

_ADAMW = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}
_ADAMW_WRS_SCHEDULE = {"num_epochs": 100.0, "optimizer.boundaries": (0.3, 0.6, 0.8)}
_RESNET18 = {"model.name": "resnet18", "model.kwargs": {"stem": "cifar"}}


def _wrs(tau: int) -> dict:
    """WRS every ``tau`` updates on every kernel; WD only on the BN gammas."""
    return {
        "optimizer.wrappers": ("wrs",),
        "optimizer.wrapper_kwargs": {"wrs": {"tau": tau}},
        "optimizer.weight_decay_mask": "bn_scales",
    }


_BWN = {"model.norm": "bwn", "optimizer.weight_decay_mask": "last_layer"}


def _variants(model: str, prefix: str, extra: dict) -> dict:
    return {
        f"{prefix}sgdm+wd": {**extra},
        f"{prefix}sgdm+wrs": {**extra, **_wrs(TAU[(model, "sgdm")])},
        f"{prefix}sgdm+bwn": {**extra, **_BWN},
        f"{prefix}adamw+wd": {**extra, **_ADAMW},
        f"{prefix}adamw+wrs": {**extra, **_ADAMW, **_wrs(TAU[(model, "adamw")]), **_ADAMW_WRS_SCHEDULE},
    }


VARIANTS = {**_variants("vgg16", "", {}), **_variants("resnet18", "resnet18 ", _RESNET18)}
"""grid.py variants: Table 1's rows (VGG16, then the ResNet-18 variant) and Fig. 8's BWN."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/cifar10_wrs"
    config.model.name = "vgg16"
    config.model.norm = "bn"
    config.model.kwargs = {}
    config.dataset.name = "cifar10"
    config.dataset.batch_size = BATCH_SIZE
    config.dataset.augment = "colour_crop_flip"
    config.num_epochs = 200.0
    config.log_every = 100
    config.checkpoint_every = 2000
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "step",
            "boundaries": (0.3, 0.6, 0.8),
            "decay_factor": 0.1,
            "weight_decay": WEIGHT_DECAY,
            "weight_decay_mask": "kernels_and_bn_scales",
            "wrappers": (),
            "wrapper_kwargs": {"wrs": {"tau": TAU[("vgg16", "sgdm")]}},
        }
    )
    swept = {name: VARIANTS[name] for name in ("sgdm+wd", "sgdm+wrs")}  # they differ in the optimizer only
    config.sweep.key = "optimizer"
    config.sweep.grid = optimizer_sweep(config.optimizer, swept)
    config.sweep.names = tuple(swept)
    return config
