"""optax transformations that control weight norms: WRS, BWN, norm schedules, ENorm."""

from jaxnorm.optim.state import register_state_rule, rescale_state
