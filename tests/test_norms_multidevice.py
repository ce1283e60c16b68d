"""Batch statistics across 8 simulated CPU devices equal those of the single-device global batch.

The devices are simulated in a subprocess (``--xla_force_host_platform_device_count=8`` must be set
before JAX starts), which prints the max error of every case; see ``_multidevice_norms.py``.
"""

import json
from pathlib import Path

import pytest
from multidevice import run_on_devices

WORKER = Path(__file__).with_name("_multidevice_norms.py")


@pytest.fixture(scope="module")
def errors():
    return json.loads(run_on_devices(WORKER, timeout=600).strip().splitlines()[-1])


def test_every_case_ran(errors):
    modes = {name.split()[0] for name in errors}
    assert {"pmap", "shard_map", "jit-sharded", "BatchNorm"} <= modes
    assert sum(name.startswith("shard_map") for name in errors) == 8  # 4 norms x (masked, unmasked)


def test_statistics_equal_global_batch(errors):
    bad = {name: err for name, err in errors.items() if not err < 1e-10}
    assert not bad, bad
