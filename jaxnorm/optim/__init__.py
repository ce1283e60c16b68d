"""optax transformations that control weight norms: WRS, BWN, norm schedules, ENorm."""

from jaxnorm.optim.rescaling import WeightRescalingState as WeightRescalingState
from jaxnorm.optim.rescaling import weight_rescaling as weight_rescaling
from jaxnorm.optim.state import register_state_rule, rescale_state
