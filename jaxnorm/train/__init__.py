"""The training engine: one loop for every experiment (jit-sharded or pmap, single- or multi-host).

Import cost: pulls in optax, orbax and matplotlib; ``import jaxnorm`` does not import this package.
"""

from jaxnorm.train.checkpoint import Checkpointer, StopSignal
from jaxnorm.train.data import ArraySource, BatchSource
from jaxnorm.train.loop import RunResult, default_config, evaluate, total_steps, train
from jaxnorm.train.metrics import MetricsWriter, layer_unit_norms, read_jsonl, weight_norm_metrics
from jaxnorm.train.optimizers import (
    OPTIMIZERS,
    SCHEDULES,
    WEIGHT_DECAY_MASKS,
    WRAPPERS,
    make_optimizer,
    make_schedule,
    weight_decay_mask,
)
from jaxnorm.train.plots import plot_run, plot_runs
from jaxnorm.train.precision import LossScale, adjust_loss_scale, initial_loss_scale
from jaxnorm.train.sharding import DataParallel, initialize_distributed
from jaxnorm.train.state import TrainState, create_train_state
from jaxnorm.train.step import correct_predictions, cross_entropy, make_eval_step, make_train_step

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "WEIGHT_DECAY_MASKS",
    "WRAPPERS",
    "ArraySource",
    "BatchSource",
    "Checkpointer",
    "DataParallel",
    "LossScale",
    "MetricsWriter",
    "RunResult",
    "StopSignal",
    "TrainState",
    "adjust_loss_scale",
    "correct_predictions",
    "create_train_state",
    "cross_entropy",
    "default_config",
    "evaluate",
    "initial_loss_scale",
    "initialize_distributed",
    "layer_unit_norms",
    "make_eval_step",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "plot_run",
    "plot_runs",
    "read_jsonl",
    "total_steps",
    "train",
    "weight_decay_mask",
    "weight_norm_metrics",
]
