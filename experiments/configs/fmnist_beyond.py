"""Beyond the papers on Fashion-MNIST: AdamP vs AdamW, MP net vs BN, sphere projection vs WD, teleportation.

Four small comparisons of the scale-invariance toolkit (issue 18; ``docs/scale_invariance.md``), all on
a 3 x 256 MLP, Fashion-MNIST (offline), batch 128, 5 epochs, cosine learning-rate decay, 3 seeds:

* (a) AdamP vs AdamW on the BN MLP (Heo et al., ICLR 2021, Sec. 4): lr 1e-3, decoupled weight decay
  0.05 on the kernels for both (AdamP's ``wd_ratio`` 0.1 on the kernels it projects), AdamP with the
  paper's cosine test (``delta`` 0.1) and with the tracer's scale-invariance mask in its place.
* (b) EDM2's magnitude-preserving net without normalization layers (Karras et al., CVPR 2024,
  Sec. 3: ``norm='mp'``, forward-pass weight normalization and MP-SiLU) with and without the
  *forced* weight normalization (every hidden unit written back to norm ``sqrt(fan_in)`` after each
  step: ``sphere_projection('sqrt_fan_in')``), against the same MLP with BN and with no normalization
  (ReLU); Adam lr 1e-3, no weight decay. Forced weight normalization keeps every weight at per-element
  RMS 1, where Adam's steps of size ~lr turn a unit ~30x less than on Xavier-initialised weights (RMS
  ~0.05): it runs at EDM2's lr scale, 1e-2 (their reference rates are 0.009-0.012), and at 1e-3.
* (c) sphere projection vs weight decay on the BN MLP with SGD momentum 0.9, lr 0.1: no
  regularizer, L2 weight decay 5e-4 on the kernels, or every scale-invariant unit (the tracer's mask)
  put back on the unit sphere after each step (nGPT Sec. 2.6; WRS with ``tau = 1``).

* (d) symmetry teleportation early in training (Zhao et al., NeurIPS 2022: teleporting to a larger
  gradient norm early speeds up training) on the plain ReLU MLP (``norm='none'``: its
  junctions are the ReLU units; no BN), SGD lr 0.1 (as in (c)), without and with momentum 0.9: no
  teleport, or the ``teleportation`` wrapper (``objective='grad_norm'``) on updates 50, 100, 150 and
  200 of the first epoch with scales in [1/2, 2] (``TELEPORT``) or [0.8, 1.25] (``TELEPORT_SMALL``).
  Measured after epoch 1 and at the end (test accuracy, mean train loss of the epoch).

``python experiments/scripts/grid.py fmnist_beyond --json experiments/results/fmnist_beyond.json
--seeds 0 1 2`` runs them; ``python -m experiments fmnist_beyond`` runs (c) for one seed.
"""

from jaxnorm.train.experiment import experiment_defaults

SEEDS = (0, 1, 2)

_ADAM = {"optimizer.learning_rate": 1e-3}
_ADAMW = {**_ADAM, "optimizer.name": "adamw", "optimizer.weight_decay": 0.05}
_ADAMP = {**_ADAMW, "optimizer.name": "adamp", "optimizer.delta": 0.1, "optimizer.wd_ratio": 0.1}
_MP_ADAM = {**_ADAM, "optimizer.name": "adam", "model.norm": "mp"}
_SPHERE = {
    "optimizer.wrappers": ("sphere_projection",),
    "optimizer.wrapper_kwargs": {"sphere_projection": {"target": 1.0, "mask": "scale_invariant"}},
}
_FORCED_WN = {
    "optimizer.wrappers": ("sphere_projection",),
    "optimizer.wrapper_kwargs": {"sphere_projection": {"target": "sqrt_fan_in", "mask": "hidden_kernels"}},
}
_PLAIN_SGD = {"model.norm": "none", "optimizer.name": "sgd"}
_PLAIN_SGDM = {"model.norm": "none"}
TELEPORT = {"every": 50, "until": 200, "steps": 10, "step_size": 1.0, "max_scale": 2.0}
"""(d)'s teleportation, fixed before any run: updates 50, 100, 150, 200 (of 468 per epoch), 10 ascent
steps of size 1 on the log-scales (at init ||grad L||^2 ~ 8.5 on a batch, and a step of 1 already
reaches the box), each teleport's scales in [1/2, 2]."""
TELEPORT_SMALL = {**TELEPORT, "max_scale": 1.25}
"""The same with the box [0.8, 1.25], added after a 1-seed, 1-epoch check of ``TELEPORT`` with plain
SGD diverged (its train loss, from update 150 on)."""
_TELEPORT = {
    "optimizer.wrappers": ("teleportation",),
    "optimizer.wrapper_kwargs": {"teleportation": TELEPORT},
}
_TELEPORT_SMALL = {**_TELEPORT, "optimizer.wrapper_kwargs": {"teleportation": TELEPORT_SMALL}}
VARIANTS = {
    # (a) AdamP vs AdamW, BN MLP
    "a/adamw": _ADAMW,
    "a/adamp": _ADAMP,
    "a/adamp, tracer mask": {**_ADAMP, "optimizer.projection_mask": "scale_invariant"},
    # (b) magnitude-preserving (forced weight norm) vs BN vs plain, Adam
    "b/plain": {**_ADAM, "optimizer.name": "adam", "model.norm": "none"},
    "b/bn": {**_ADAM, "optimizer.name": "adam"},
    "b/mp": _MP_ADAM,
    "b/mp + forced wn": {**_MP_ADAM, **_FORCED_WN, "optimizer.learning_rate": 1e-2},
    "b/mp + forced wn, lr 1e-3": {**_MP_ADAM, **_FORCED_WN},
    # (c) sphere projection vs weight decay, BN MLP, SGD momentum
    "c/sgdm": {},
    "c/sgdm + wd": {"optimizer.weight_decay": 5e-4},
    "c/sgdm + sphere": _SPHERE,
    # (d) symmetry teleportation early in training, plain ReLU MLP
    "d/sgd": _PLAIN_SGD,
    "d/sgd + teleport": {**_PLAIN_SGD, **_TELEPORT},
    "d/sgd + teleport, box 1.25": {**_PLAIN_SGD, **_TELEPORT_SMALL},
    "d/sgdm": _PLAIN_SGDM,
    "d/sgdm + teleport": {**_PLAIN_SGDM, **_TELEPORT},
    "d/sgdm + teleport, box 1.25": {**_PLAIN_SGDM, **_TELEPORT_SMALL},
}
"""grid.py variants, by comparison: ``a/`` AdamP vs AdamW, ``b/`` magnitude-preserving vs BN vs plain,
``c/`` sphere projection vs weight decay, ``d/`` teleportation early in training (plain MLP)."""


def get_config():
    config = experiment_defaults()
    config.description = __doc__.splitlines()[0]
    config.workdir = "runs/fmnist_beyond"
    config.model.name = "mlp"
    config.model.norm = "bn"
    config.model.kwargs = {"depth": 3, "width": 256}
    config.dataset.name = "fashion_mnist"
    config.dataset.batch_size = 128
    config.num_epochs = 5.0
    config.log_every = 50
    config.checkpoint_every = 0
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "cosine",
            "weight_decay": 0.0,
            "weight_decay_mask": "kernels",
            "wrappers": (),
            "wrapper_kwargs": {},
        }
    )
    config.sweep.key = "optimizer.weight_decay"
    config.sweep.grid = (0.0, 5e-4)
    config.sweep.names = ("c/sgdm", "c/sgdm + wd")
    return config
