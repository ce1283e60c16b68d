#!/usr/bin/env bash
# Norm matters, L1 / L-inf / top-k vs L2 BN on CIFAR-10 (JPEG q75 copy) conv nets, plain and residual:
# VGG11 at width x0.25 and ResNet-18 (CIFAR stem) at base width 8, 3 seeds, 8 epochs of the He et al.
# recipe of cifar10_resnet56_norm_matters (SGD momentum 0.9, lr 0.1 / 10 at 50 % and 75 %, WD 1e-4,
# crop + flip, batch 128). Narrow nets and short runs: what 2 CPU cores allow (the paper: ResNet-56,
# full width; its supplement does not state the recipe). Resumable (finished runs are skipped).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-cifar10_jpeg}
EPOCHS=${EPOCHS:-8}
for model in "vgg11:{'width_multiplier': 0.25}" "resnet18:{'width': 8, 'stem': 'cifar'}"; do
  name=${model%%:*}; kwargs=${model#*:}
  python experiments/scripts/resume_grid.py cifar10_resnet56_norm_matters \
    --jsonl experiments/results/cifar10_norm_matters_conv.jsonl --workdir runs/cifar10_norm_matters_conv \
    --only l2bn l1bn linfbn topk10bn --seeds 0 1 2 --grid model.name=$name \
    --set dataset.name=$DATA num_epochs=$EPOCHS checkpoint_every=300 "model.kwargs=$kwargs"
done
