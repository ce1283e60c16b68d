"""Equi-normalization (Stock et al., ICLR 2019): junction specs, balancing cycles, discovery."""

from jaxnorm.enorm.balance import enorm_balance, multipliers, objective
from jaxnorm.enorm.spec import Junction, Spec, chain

__all__ = ["Junction", "Spec", "chain", "enorm_balance", "multipliers", "objective"]
