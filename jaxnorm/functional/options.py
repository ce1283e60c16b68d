"""The options of a normalization's statistics as one typed, validated value, :class:`BatchOptions`.

The Flax modules and the public functions build it once (:func:`check_batch_options`) and it travels
unchanged, under the one name ``options``, down to the kernel that reads each field: batch norm's layer
(:func:`jaxnorm.functional.layers.batch_norm_layer`), its statistics
(:func:`jaxnorm.functional.batch.batch_statistics`) and the dispersion
(:func:`jaxnorm.functional.dispersion.dispersion_moments`). Layer, group and instance norm use the same
value with ``p`` and ``use_fast_variance`` only.
"""

from __future__ import annotations

from typing import NamedTuple

from jaxnorm.functional.calibration import Calibration
from jaxnorm.functional.checks import PNorm, canonical_p, check_bool, check_positive_int

__all__ = ["BatchOptions", "check_batch_options"]


class BatchOptions(NamedTuple):
    """Options of the statistics after validation (:func:`check_batch_options`).

    Attributes:
      p: the dispersion, 1, 2 or 'inf' (Hoffer et al., *Norm matters*, NeurIPS 2018, Sec. 3).
      topk: with ``p='inf'``, the mean of the ``topk`` largest deviations replaces the max.
      calibration: 'paper' (the paper's ``C(n)``) or 'exact' (``1 / E[top-k mean of n |N(0, 1)|]``).
      virtual_batch_size: ghost batch norm (Hoffer, Hubara & Soudry 2017, Sec. 4): statistics per
        sub-batch of this size along axis 0.
      mean_only: subtract the mean only (Salimans & Kingma 2016, Sec. 2.2).
      use_fast_variance: one pass over the data for the L2 moments (stable shifted sums), or two.
      tiny_groups: keep groups whose variance is tiny in a unit
        (:func:`~jaxnorm.functional.units.lift_tiny`); set by the normalizations from their ``epsilon``
        (:func:`~jaxnorm.functional.units.needs_tiny_unit`), not a user option.
    """

    p: PNorm = 2
    topk: int | None = None
    calibration: Calibration = "paper"
    virtual_batch_size: int | None = None
    mean_only: bool = False
    use_fast_variance: bool = True
    tiny_groups: bool = False


def check_batch_options(
    p: PNorm | float = 2,
    topk: int | None = None,
    calibration: Calibration = "paper",
    virtual_batch_size: int | None = None,
    mean_only: bool = False,
    use_fast_variance: bool = True,
) -> BatchOptions:
    """Validate the statistics' options, whatever the input; returns them canonical (``p`` in 1, 2,
    'inf'; NumPy integers and bools as Python ones).

    The modules call it at construction or call, in evaluation too, where the batch statistics are not
    computed: a wrong option fails at once, not at the first training step.
    """
    p = canonical_p(p)
    if topk is not None:
        topk = check_positive_int(topk, "topk")
        if p != "inf":
            raise ValueError(f"topk applies to p='inf' (top-k L∞ norm), got p={p!r}")
    if calibration not in ("paper", "exact"):
        raise ValueError(f"calibration must be 'paper' or 'exact', got {calibration!r}")
    if calibration == "exact" and p != "inf":
        raise ValueError(f"calibration='exact' (the L∞ constant) applies to p='inf', got p={p!r}")
    if virtual_batch_size is not None:
        virtual_batch_size = check_positive_int(virtual_batch_size, "virtual_batch_size")
    return BatchOptions(
        p,
        topk,
        calibration,
        virtual_batch_size,
        check_bool(mean_only, "mean_only"),
        check_bool(use_fast_variance, "use_fast_variance"),
    )
