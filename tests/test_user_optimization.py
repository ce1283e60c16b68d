"""The edge-case modules of the core, compiled as users compile them.

The suite compiles with most XLA optimizations off (``conftest.py``), which cuts its time; XLA runs the
same programs, but the machine code rounds differently (LLVM contracts ``a * b + c`` into FMAs,
vectorizes reductions, refines an approximate ``rsqrt``). Properties that hold bit for bit — a constant
channel normalizes to exactly 0, huge and tiny input stay finite — could hold in one and not in the other,
so the modules that check them (``conftest.USER_OPTIMIZATION_MODULES``) are deselected from that run and
run here instead, one subprocess per module (so that a parallel run spreads them over its workers) at
JAX's default optimization, with the run's own marker expression.
"""

import os
import subprocess
import sys

import pytest
from conftest import OPTIMIZATIONS_OFF, TESTS, USER_OPTIMIZATION_MODULES


@pytest.mark.skipif(not OPTIMIZATIONS_OFF, reason="this run compiles as users do: the modules ran in it")
@pytest.mark.parametrize("module", USER_OPTIMIZATION_MODULES)
def test_edge_modules_pass_at_the_default_optimization(request, module):
    markers = request.config.getoption("markexpr")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               *(["-m", markers] if markers else []), str(TESTS / module)]
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "0"}
    done = subprocess.run(command, env=env, cwd=TESTS.parent, capture_output=True, text=True, timeout=1800)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, done.stdout[-3000:]
