#!/usr/bin/env bash
# ENorm on CIFAR-NV across batch sizes (Stock et al. Tables 2-3) on CIFAR-10 (JPEG q75 copy): the
# cifar10_enorm_nv config (the paper's recipe: 28 x 28 crops + flips, WD 1e-3, quadratic decay to
# 1e-4, final BN for baseline / ENorm) at BATCHES, SGD without momentum (OPTIMIZER=momentum for
# Table 3). Per batch size and variant the learning rate is chosen from the paper's grid {0.01,
# 0.05, 0.1} on the 40k / 10k split (seed 0, SELECT_EPOCHS), then 3 seeds train TEST_EPOCHS and report
# test accuracy (paper: 128 epochs, 5 runs). GN with 32 groups only (the paper cross-validates 4-64).
# The optimizer is a grid key, so SGD and momentum runs share the two files and stay apart.
# Resumable. Results: experiments/results/cifar10_enorm_nv_{select,test}.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-cifar10_jpeg}
OPTIMIZER=${OPTIMIZER:-sgd}
SELECT_EPOCHS=${SELECT_EPOCHS:-3}
TEST_EPOCHS=${TEST_EPOCHS:-10}
VARIANTS="baseline bn gn-32 enorm-1 enorm-1.2"
for batch in ${BATCHES:-32 128}; do
  python experiments/scripts/resume_grid.py cifar10_enorm_nv \
    --jsonl experiments/results/cifar10_enorm_nv_select.jsonl --workdir runs/cifar10_enorm_nv_select \
    --only $VARIANTS --seeds 0 --grid optimizer.name=$OPTIMIZER --grid dataset.batch_size=$batch \
    --grid optimizer.learning_rate=0.01,0.05,0.1 \
    --set dataset.name=$DATA num_epochs=$SELECT_EPOCHS checkpoint_every=500
  python experiments/scripts/resume_grid.py cifar10_enorm_nv \
    --jsonl experiments/results/cifar10_enorm_nv_test.jsonl --workdir runs/cifar10_enorm_nv_test \
    --only $VARIANTS --seeds 0 1 2 --grid optimizer.name=$OPTIMIZER --grid dataset.batch_size=$batch \
    --select experiments/results/cifar10_enorm_nv_select.jsonl:optimizer.learning_rate \
    --set dataset.name=$DATA num_epochs=$TEST_EPOCHS dataset.train_split=train \
      dataset.eval_split=test checkpoint_every=500
done
