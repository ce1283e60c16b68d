"""ENorm-1.2 at depth 16 (Stock et al. Sec. 3.7, Fig. 4): where c goes decides whether the deep FC net trains.

In the ``fmnist_enorm_depth`` sweep ENorm-1.2 (one cycle after every SGD step, every junction
balanced to ``||outgoing_j|| = c ||incoming_j||``) does not train at depth 16 while ENorm-1 does.
The authors' code (facebookresearch/enorm, ``ENorm._step_fc``) uses the same rule but never balances
the last junction (the units the classifier reads). In the depth sweep's setting (16 x 256 ReLU MLP
without normalization, Xavier, SGD without momentum, batch 256, WD 1e-3 on the kernels, lr 0.05
decayed linearly to 0, 3 epochs of Fashion-MNIST) the variants place c differently through the
``enorm`` wrapper's per-junction ``c`` (``{"hidden": c_h, "last": c_l}``, ``c_l = None``: not
balanced) and ``start`` (balancing begins after that many updates). The analysis reports the mean
per-unit norm of the first and last hidden kernels and the classifier, and the first logged step
with a non-finite loss. ``python experiments/scripts/grid.py fmnist_enorm_c_depth --seeds 0``.
"""

from experiments.configs.fmnist_enorm_depth import depth_sweep_setting


def _enorm(c, **kwargs):
    return {"optimizer.wrappers": ("enorm",), "optimizer.wrapper_kwargs": {"enorm": {"c": c, **kwargs}}}


SEEDS = (0, 1)
VARIANTS = {
    "enorm-1.2, every junction": _enorm(1.2),
    "enorm-1.2, last junction skipped": _enorm({"hidden": 1.2, "last": None}),
    "enorm-1.2 hidden, c=1 last": _enorm({"hidden": 1.2, "last": 1.0}),
    "enorm-1.2 from step 100": _enorm(1.2, start=100),
    "enorm-1.1, every junction": _enorm(1.1),
    "enorm-1.1, last junction skipped": _enorm({"hidden": 1.1, "last": None}),
    "enorm-1, every junction": _enorm(1.0),
}
"""grid.py variants."""
ANALYSIS = "unit_norms"


def get_config():
    config = depth_sweep_setting()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_enorm_c_depth"
    config.model.kwargs.depth = 16
    config.log_every = 10
    config.optimizer.wrappers = ("enorm",)
    config.optimizer.wrapper_kwargs = {"enorm": {"c": 1.2}}
    return config
