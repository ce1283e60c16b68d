"""Smoke runs of the benchmark scripts: each runs to the end at a tiny size and prints its table.

The numbers are not checked (performance lives in the benchmarks, not in timed tests); what is checked is
that a rename or an API change in jaxnorm does not leave a script that no longer runs.
"""

import os
import pathlib
import subprocess
import sys

import pytest
from fmnist import needs_fmnist

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"

TINY = ["--shapes", "4x4x4x32", "--dtypes", "float32,bfloat16", "--repeats", "2"]


def _run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=BENCHMARKS.parent,
    )
    assert result.returncode == 0, f"{script} exited with {result.returncode}:\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        # two layers: the script end to end, without compiling every layer (the full table: benchmarks/)
        (
            "norms.py",
            [*TINY, "--rows", "BatchNorm p=1,LayerNorm"],
            [
                "| 4x4x4x32 | bfloat16 | BatchNorm p=1 | fwd+bwd |",
                "| 4x4x4x32 | float32 | LayerNorm | fwd |",
                "checked lines PASS",
            ],
        ),
        (
            "eager.py",
            ["--repeats", "1", "--rows", "BatchNorm p=1,RMSNorm"],
            ["| BatchNorm p=1 | 64x8 | fwd+bwd |", "| RMSNorm | 2x8x8x16 | fwd |"],
        ),
        # compile_time.py and platform_forms.py measure compilers, not kernels: each program is compiled
        # whole even at the smallest input (10-20 s apiece on 2 cores): slow, rerun by hand with each table
        pytest.param(
            "compile_time.py",
            ["--depth", "1", "--repeats", "1", "--rows", "LayerNorm axes"],
            ["| LayerNorm axes | grad |", "| layer | program | ours (s) | flax (s) | ours / flax |"],
            marks=pytest.mark.slow,
        ),
        ("floor.py", TINY, ["| 4x4x4x32 | float32 |", "sums_one_pass/copy", "floor_l1/floor_separate |"]),
        # one layer: every form is traced and compiled once per pass
        pytest.param(
            "platform_forms.py",
            [*TINY, "--rows", "LayerNorm"],
            [
                "| 4x4x4x32 | bfloat16 | LayerNorm | fwd+bwd | last_axis.distinct |",
                "| 4x4x4x32 | bfloat16 | LayerNorm | fwd | last_axis.separate_reads |",
                "| form | programs reached | best gain | worst gain | verdict |",
            ],
            marks=pytest.mark.slow,
        ),
        # optim.py and enorm.py build ResNets even at their smallest (1.5-2 min each on 2 cores): slow.
        pytest.param(
            "optim.py",
            ["--quick"],
            [
                "sgd + weight_rescaling(20)",
                "sgd + bwn_projection()",
                "| sgd + sphere_projection() | sgd |",
                "| radial_projection(sgd) | sgd |",
                "| sgdp(momentum 0.9) | sgd |",
                "| adamp | adamw |",
                "| adamwn(target 1.0) | adamw |",
                "train step (adamw)",
            ],
            marks=pytest.mark.slow,
        ),
        # a sample's calls dispatched back to back, blocked once (the default off CPU)
        ("norms.py", [*TINY, "--rows", "RMSNorm", "--sync", "sample"],
         ["blocked once per sample", "| 4x4x4x32 | float32 | RMSNorm | fwd+bwd x |"]),
        # the compiled programs' passes over the input, ours / flax (any backend)
        ("passes.py", ["--shape", "4x4x4x32", "--rows", "BatchNorm p=2,LayerNorm"],
         ["| BatchNorm p=2 | fwd |", "| LayerNorm | fwd+bwd x |"]),
        # one config's step time through the one loop on in-memory images of the dataset's shape
        ("configs.py", ["--steps", "3", "--runs", "cifar10_enorm_fc:enorm-1",
                        "--set", "model.kwargs.depth=2", "model.kwargs.width=8"],
         ["| cifar10_enorm_fc:enorm-1 | mlp | 256 | float32 |"]),
        # train.py and input_pipeline.py train real steps (~1 min each on 2 cores): slow, like optim.py.
        pytest.param("train.py", ["--quick"], ["jaxnorm loop vs hand loop + data"], marks=pytest.mark.slow),
        # a model without batch statistics (KeyError 'batch_stats' before); --steps / --repeats win
        # over --quick's (ignored before)
        pytest.param(
            "train.py",
            ["--quick", "--norm", "none", "--batch", "8", "--steps", "3", "--repeats", "1"],
            ["loop runs of 3 steps, 1 repeats"],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "enorm.py",
            ["--batch", "2", "--width", "4", "--repeats", "1", "--max-cycles", "2"],
            ["SGD-momentum step (anchor)", "enorm(sgd) full step"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_benchmark_script_runs(script, args, expected):
    output = _run(script, *args)
    assert "date: " in output.splitlines()[0], output[:500]  # the machine and date head every table
    for text in expected:
        assert text in output, f"{text!r} not in the output of {script}:\n{output[-3000:]}"


@pytest.mark.slow
@needs_fmnist
def test_input_pipeline_benchmark_runs():
    output = _run("input_pipeline.py", "--quick")
    assert "fashion_mnist data vs mlp step" in output


@pytest.mark.parametrize("script", ["norms.py", "optim.py", "platform_forms.py", "eager.py", "train.py"])
def test_zero_repeats_is_an_error(script):
    """``--repeats 0`` ran the default number of repeats (``args.repeats or default``) instead of saying
    that it is not a number of samples."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--repeats", "0"],
        capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent,
    )
    assert result.returncode == 2 and "--repeats must be" in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_train_benchmark_runs_without_tensorflow():
    """Without tensorflow (an experiments extra; the GPU machine had none) train.py skips its TensorBoard
    row instead of failing in the loop's writer."""
    code = ("import runpy, sys; sys.modules['tensorflow'] = None; "
            "sys.argv = ['train.py', '--quick', '--steps', '3', '--repeats', '1', '--batch', '8']; "
            f"runpy.run_path({str(BENCHMARKS / 'train.py')!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            cwd=BENCHMARKS.parent, env={**os.environ, "PYTHONPATH": str(BENCHMARKS)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tensorboard=True: not timed (tensorflow is not installed)" in result.stdout


def test_configs_benchmark_refuses_an_unknown_variant():
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "configs.py"), "--runs", "cifar10_wrs:sgd+wrs"],
        capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent,
    )
    assert result.returncode != 0 and "has no variant 'sgd+wrs'" in result.stderr, result.stderr[-2000:]
