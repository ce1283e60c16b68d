#!/usr/bin/env bash
# ENorm Fig. 4 on CIFAR-10 (JPEG q75 copy): FC width 500, depths 2 / 8 / 16 hidden layers, baseline / BN /
# GN (10 groups) / ENorm-1 / ENorm-1.2. Per depth: the learning rate chosen from the paper's grid on the
# 40k / 10k train / validation split (seed 0, SELECT_EPOCHS=4 epochs), then 3 seeds on train / test at the
# chosen rate (TEST_EPOCHS=12 epochs; the paper trains 60: what one CPU core allows in about two hours). Resumable: run it again after a stop (finished runs are skipped,
# an interrupted one resumes from its checkpoint). Results: experiments/results/cifar10_enorm_fc_*.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-cifar10_jpeg}
SELECT_EPOCHS=${SELECT_EPOCHS:-4}
TEST_EPOCHS=${TEST_EPOCHS:-12}
VARIANTS="baseline bn gn-10 enorm-1 enorm-1.2"
for depth in ${DEPTHS:-2 8 16}; do
  python experiments/scripts/resume_grid.py cifar10_enorm_fc \
    --jsonl experiments/results/cifar10_enorm_fc_select.jsonl --workdir runs/cifar10_enorm_fc_select \
    --only $VARIANTS --seeds 0 --grid model.kwargs.depth=$depth \
    --grid optimizer.learning_rate=0.0005,0.001,0.005,0.01,0.05,0.1 \
    --set dataset.name=$DATA num_epochs=$SELECT_EPOCHS checkpoint_every=500
  python experiments/scripts/resume_grid.py cifar10_enorm_fc \
    --jsonl experiments/results/cifar10_enorm_fc_test.jsonl --workdir runs/cifar10_enorm_fc_test \
    --only $VARIANTS --seeds 0 1 2 --grid model.kwargs.depth=$depth \
    --select experiments/results/cifar10_enorm_fc_select.jsonl:optimizer.learning_rate \
    --set dataset.name=$DATA num_epochs=$TEST_EPOCHS dataset.train_split=train dataset.eval_split=test checkpoint_every=500
done
