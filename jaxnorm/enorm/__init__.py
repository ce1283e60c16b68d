"""Equi-normalization (Stock et al., ICLR 2019): junction specs, balancing cycles, discovery, and
symmetry teleportation along the same rescalings (Zhao et al., NeurIPS 2022)."""

from jaxnorm.enorm.balance import enorm_balance, multipliers, objective
from jaxnorm.enorm.check import check
from jaxnorm.enorm.discover import discover, scale_invariant_kernels
from jaxnorm.enorm.implicit import apply_log_scales, implicit_penalty, init_log_scales
from jaxnorm.enorm.spec import Junction, Spec, chain
from jaxnorm.enorm.teleport import teleport, teleport_objective
from jaxnorm.enorm.transport import StatLink, batch_stats_map, transport_batch_stats

__all__ = [
    "Junction",
    "Spec",
    "StatLink",
    "apply_log_scales",
    "batch_stats_map",
    "chain",
    "check",
    "discover",
    "enorm_balance",
    "implicit_penalty",
    "init_log_scales",
    "multipliers",
    "objective",
    "scale_invariant_kernels",
    "teleport",
    "teleport_objective",
    "transport_batch_stats",
]
