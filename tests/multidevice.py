"""Run Python code in a subprocess with simulated CPU devices.

``--xla_force_host_platform_device_count`` must be set before JAX starts, so multi-device tests run their
code in a fresh interpreter from the repository root and compare the results there.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_on_devices(script: str | Path, *, devices: int = 8, timeout: int = 300) -> str:
    """Run ``script`` (source text, or a file path) on ``devices`` CPU devices; return its stdout.

    Fails the calling test with the end of stderr when the script exits non-zero.
    """
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
    }
    command = [sys.executable, str(script)] if isinstance(script, Path) else [sys.executable, "-c", script]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout
