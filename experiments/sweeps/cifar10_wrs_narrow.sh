#!/usr/bin/env bash
# WRS vs WD (Liu et al. Table 1) on CIFAR-10 (JPEG q75 copy) with the paper's stated setting except
# width and length: the cifar10_wrs config (batch 100, colour jitter + 38 x 38 padded crops + flips,
# WD 5e-4 on kernels and BN gammas, WRS with WD on the gammas only, tau from Table S1, lr x 0.1 at
# 30 / 60 / 80 % of the run) on VGG16 at width x0.25 and ResNet-18 at base width 8, SGDM and AdamW,
# 3 seeds, EPOCHS epochs (paper: 200; AdamW + WRS: half, as the paper; num_epochs is a grid key
# because grid values are set after a variant's own settings).
# Effective-LR ablation (stage 2, ABLATION=1): WD and WRS with SGDM at 0.5x and 2x the paper's
# learning rate. WRS holds ||w|| at 1 where WD settles elsewhere, so at one learning rate the two
# differ in effective step eta / ||w||^2 as well as in the regularizer; WRS's advantage, if any,
# should survive at each method's best rate of the three.
# Resumable: run it again after a stop. Results: experiments/results/cifar10_wrs_narrow*.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-cifar10_jpeg}
EPOCHS=${EPOCHS:-10}
# model.kwargs.<key> as a grid key: grid values are set after the variant's own model.kwargs
# Seeds outermost: every method's seed 0 comes first, so a partial sweep already compares them.
for model in "model.kwargs.width_multiplier=0.25:" "model.kwargs.width=8:resnet18 "; do
  IFS=: read -r width prefix <<< "$model"
  for seed in 0 1 2; do
    python experiments/scripts/resume_grid.py cifar10_wrs \
      --jsonl experiments/results/cifar10_wrs_narrow.jsonl --workdir runs/cifar10_wrs_narrow \
      --only "${prefix}sgdm+wd" "${prefix}sgdm+wrs" "${prefix}adamw+wd" --seeds $seed \
      --grid "$width" --grid num_epochs=$EPOCHS --set dataset.name=$DATA checkpoint_every=500
    python experiments/scripts/resume_grid.py cifar10_wrs \
      --jsonl experiments/results/cifar10_wrs_narrow.jsonl --workdir runs/cifar10_wrs_narrow \
      --only "${prefix}adamw+wrs" --seeds $seed \
      --grid "$width" --grid num_epochs=$((EPOCHS / 2)) --set dataset.name=$DATA checkpoint_every=500
  done
  if [ "${ABLATION:-0}" = 1 ]; then
    # seeds outermost here too: a partial ablation already has both methods at both rates for seed 0
    for seed in 0 1 2; do
      python experiments/scripts/resume_grid.py cifar10_wrs \
        --jsonl experiments/results/cifar10_wrs_narrow_lr.jsonl --workdir runs/cifar10_wrs_narrow_lr \
        --only "${prefix}sgdm+wd" "${prefix}sgdm+wrs" --seeds $seed --grid "$width" \
        --grid num_epochs=$EPOCHS --grid optimizer.learning_rate=0.05,0.2 --set dataset.name=$DATA \
        checkpoint_every=500
    done
  fi
done
