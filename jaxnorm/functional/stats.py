"""Compatibility re-exports: the statistics now live by concept in :mod:`.calibration`, :mod:`.moments`,
:mod:`.collectives`, :mod:`.dispersion` and :mod:`.batch`.

Kept because code outside the package imports ``jaxnorm.functional.stats`` (e.g. ``L1_CONSTANT`` in
experiment scripts, ``batch_moments``); new code imports from the modules above or from
:mod:`jaxnorm.functional`.
"""

from jaxnorm.functional.batch import (
    BatchOptions,
    batch_gives_statistics,
    batch_moments,
    batch_stats,
    check_batch_options,
    ghost_batches,
)
from jaxnorm.functional.calibration import L1_CONSTANT, Calibration, expected_topk_abs_normal, linf_constant
from jaxnorm.functional.collectives import AxisIndexGroups, gather_invariant
from jaxnorm.functional.dispersion import dispersion_moments
from jaxnorm.functional.moments import CONDITION_LIMIT, ChannelGroups, Moments, combine_moments, local_moments

__all__ = [
    "CONDITION_LIMIT",
    "L1_CONSTANT",
    "AxisIndexGroups",
    "BatchOptions",
    "Calibration",
    "ChannelGroups",
    "Moments",
    "batch_gives_statistics",
    "batch_moments",
    "batch_stats",
    "check_batch_options",
    "combine_moments",
    "dispersion_moments",
    "expected_topk_abs_normal",
    "gather_invariant",
    "ghost_batches",
    "linf_constant",
    "local_moments",
]
