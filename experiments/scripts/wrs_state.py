"""WRS with the optimizer state left alone vs rescaled with the weights (Liu et al. Sec. 5; Eq. 10 of ENorm).

``jaxnorm.optim.weight_rescaling(tau)`` placed last in a chain leaves the optimizer's state (SGD
momentum, Adam moments) as it was when the weights are rescaled; ``weight_rescaling(tau,
inner=opt, rescale_state=True)`` rescales the state consistently (first moments by s, second by
s^2). The experiment configs' wrapper registry (``jaxnorm.train.optimizers.WRAPPERS``) only has
the chain form, so this script registers the wrapping form under the name ``wrs_state`` for the
duration of the run (a workaround until the registry has it) and runs the ``fmnist_wrs`` setting
(3 x 256 BN MLP, Fashion-MNIST, 3 epochs) for SGDM (tau 20) and AdamW (tau 40) with the rescaled
state, over 3 seeds. Compare with the ``sgdm+wrs`` / ``adamw+wrs`` rows of ``grid.py fmnist_wrs``.

    python experiments/scripts/wrs_state.py [--seeds 0 1 2] [--set num_epochs=3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jaxnorm.optim
from experiments.scripts import grid
from jaxnorm.train import optimizers

VARIANTS = {
    "sgdm+wrs, state rescaled": {"optimizer.wrappers": ("wrs_state",),
                                 "optimizer.wrapper_kwargs": {"wrs_state": {"tau": 20}}},
    "adamw+wrs, state rescaled": {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3,
                                  "optimizer.wrappers": ("wrs_state",),
                                  "optimizer.wrapper_kwargs": {"wrs_state": {"tau": 40}}},
}


def weight_rescaling_with_state(inner, *, tau: int):
    """``weight_rescaling(tau, inner=inner, rescale_state=True)`` as the registry calls it."""
    return jaxnorm.optim.weight_rescaling(tau, inner=inner, rescale_state=True)


def register() -> None:
    """Adds the ``wrs_state`` wrapper to the configs' optimizer registry (this process only)."""
    jaxnorm.optim.weight_rescaling_with_state = weight_rescaling_with_state
    optimizers.WRAPPERS["wrs_state"] = ("weight_rescaling_with_state", "wrap")


def main(argv=None) -> None:
    register()
    module = grid.load_module("fmnist_wrs")
    module.VARIANTS = VARIANTS
    grid.main(["fmnist_wrs", "--out", "/tmp", *(argv if argv is not None else sys.argv[1:])], module=module)


if __name__ == "__main__":
    main()
