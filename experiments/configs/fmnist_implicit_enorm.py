"""ENorm Annex C / Fig. 8: implicit ENorm (learned rescalings under a norm penalty) in the FC depth sweep.

Implicit ENorm reparametrizes every weight as ``D_{k-1}^-1 W_k D_k`` with learnable ``D = exp(u)``
and trains ``(W, u)`` jointly on ``CE + lambda sum_k ||D_{k-1}^-1 W_k D_k||^2`` (the loop's
``implicit_enorm`` hook, :mod:`jaxnorm.train.params_hooks`); the function does not depend on ``u``,
which only follows the penalty. Setting of ``fmnist_enorm_depth`` (Fashion-MNIST, ``depth`` x 256
ReLU MLP without normalization, Xavier, SGD without momentum, batch 256, lr 0.05 decayed linearly to
0, 3 epochs): the baseline with weight decay 1e-3 on the kernels (the penalty ``5e-4 ||W||^2``)
against implicit ENorm with the same penalty on the rescaled weights and no other decay. ``u``'s
gradient is small (about 1e-3 per unit), so ``u`` gets its own speed, ``lr_factor`` times the
weights' learning rate (Annex C did not tune the two apart). The analysis reports the mean ``|u|``
and the imbalance of the effective weights (0 = ENorm-1's fixed point).
``python experiments/scripts/grid.py fmnist_implicit_enorm --set model.kwargs.depth=8`` (2: default).
"""

from experiments.configs.fmnist_enorm_depth import depth_sweep_setting

FACTORS = (1, 10, 100, 1000, 10000)
SEEDS = (0, 1, 2)
VARIANTS = {
    "baseline": {},
    **{
        f"implicit, u lr x{f:g}": {
            "optimizer.weight_decay": 0.0,
            "implicit_enorm.weight": 5e-4,
            "implicit_enorm.lr_factor": float(f),
        }
        for f in FACTORS
    },
}
"""grid.py variants."""
ANALYSIS = "implicit_enorm"


def get_config():
    config = depth_sweep_setting()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_implicit_enorm"
    config.implicit_enorm.lr_factor = 1000.0
    config.sweep.key = "implicit_enorm.weight"
    config.sweep.grid = (0.0, 5e-4)
    config.sweep.names = ("baseline (wd 1e-3)", "implicit x1000 (also wd 1e-3)")
    return config
