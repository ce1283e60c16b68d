"""optax transformations that control weight norms: WRS, BWN, norm schedules, ENorm."""

from jaxnorm.optim.enorm import MAX_STEP_SCALE as MAX_STEP_SCALE
from jaxnorm.optim.enorm import EnormState as EnormState
from jaxnorm.optim.enorm import enorm as enorm
from jaxnorm.optim.masks import scale_invariant_mask as scale_invariant_mask
from jaxnorm.optim.mimicry import NormRecordState as NormRecordState
from jaxnorm.optim.mimicry import WDMimicryState as WDMimicryState
from jaxnorm.optim.mimicry import record_norms as record_norms
from jaxnorm.optim.mimicry import reference_schedule as reference_schedule
from jaxnorm.optim.mimicry import wd_mimicry as wd_mimicry
from jaxnorm.optim.projection import BWNProjectionState as BWNProjectionState
from jaxnorm.optim.projection import NormScheduleState as NormScheduleState
from jaxnorm.optim.projection import bwn_projection as bwn_projection
from jaxnorm.optim.projection import norm_schedule as norm_schedule
from jaxnorm.optim.projection import norm_schedule_from_lr as norm_schedule_from_lr
from jaxnorm.optim.rescaling import WeightRescalingState as WeightRescalingState
from jaxnorm.optim.rescaling import weight_rescaling as weight_rescaling
from jaxnorm.optim.scales import last_scales as last_scales
from jaxnorm.optim.state import register_state_rule as register_state_rule
from jaxnorm.optim.state import rescale_state as rescale_state
