#!/usr/bin/env bash
# The checks to run when a GPU / TPU is at hand, in about 8 minutes, each part under its own time limit
# so that one slow part leaves the others' results: the compiled programs' passes over the input
# (passes.py), the layers' speed against flax at a launch-bound and a bandwidth-bound size (norms.py),
# the training step of the CIFAR-10 configs (configs.py), the loop against a hand-written step
# (train.py), and the core and module tests with XLA's optimizations on. Results go to $OUT (default
# ./device-out), one file per part; record them in benchmarks/RESULTS.md with the machine and date.
#
#   bash benchmarks/device_checks.sh            # needs jax with the accelerator's plugin, flax, optax,
#                                               # chex, orbax, ml_collections, pytest (+ pytest-xdist)
# The lent H200 / H100 image (jax 0.11.2) lacks ml_collections and tensorflow: carry the ml_collections
# wheel (pure Python) and install it with --target before this script; nothing here needs tensorflow.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
part() {  # part NAME SECONDS COMMAND...: run COMMAND under a time limit, output to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s)"
  timeout -s INT "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "rc $?"
  tail -n 4 "$OUT/$name.txt"
}
part passes 60 python3 benchmarks/passes.py
part norms 140 python3 benchmarks/norms.py --shapes 128x32x32x64,256x32x32x128 --dtypes float32 --repeats 7
part configs 150 python3 benchmarks/configs.py --steps 60 \
  --runs "cifar10_wrs:sgdm+wd,cifar10_resnet56_norm_matters:l1bn,cifar10_wrs:resnet18 sgdm+wrs,cifar10_enorm_fc:bn"
part train 40 python3 benchmarks/train.py --quick
XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DISABLE_MOST_OPTIMIZATIONS=0 part tests 110 \
  python3 -m pytest -q -p no:cacheprovider -n 14 -rf --tb=short tests/test_core_fuzz.py tests/test_functional.py \
  tests/test_functional_edges.py tests/test_functional_overflow.py tests/test_functional_platform.py \
  tests/test_nn.py tests/test_nnx.py tests/test_magnitude.py tests/test_enorm_balance.py
