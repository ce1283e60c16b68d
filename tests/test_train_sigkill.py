"""A run killed with SIGKILL (no chance to clean up) resumes from its last committed checkpoint and
ends bit-identical to an uninterrupted run."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

from jaxnorm.train import Checkpointer

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from test_train_loop import CONFIG, Net, _sources
    from jaxnorm.train import train

    class HangAt:
        def __init__(self, source, at, marker):
            self.source, self.at, self.marker = source, at, marker
            self.steps_per_epoch = source.steps_per_epoch
            self.global_batch_size = source.global_batch_size

        def epoch(self, epoch, start=0):
            for i, batch in enumerate(self.source.epoch(epoch, start), start):
                if epoch * self.steps_per_epoch + i == self.at:
                    open(self.marker, "w").close()
                    time.sleep(600)  # killed here
                yield batch

    mode, workdir = sys.argv[1], sys.argv[2]
    train_src, eval_src = _sources()
    data = HangAt(train_src, 10, workdir + ".marker") if mode == "hang" else train_src
    from jaxnorm.train import Checkpointer
    print("START", Checkpointer(workdir + "/checkpoints").latest_step())
    result = train(CONFIG, model=Net(), train_data=data, eval_data=eval_src, workdir=workdir)
    if mode == "resume":
        import numpy as np, jax
        np.savez(workdir + ".npz", *[np.asarray(x) for x in jax.tree.leaves(result.state)])
    """
)


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__))))
    run, ref = str(tmp_path / "run"), str(tmp_path / "ref")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    child = subprocess.Popen(
        [sys.executable, str(script), "hang", run],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 240
        # step 10's batch is requested after steps 1..10 ran: checkpoints 4 and 8 exist (8 may still
        # be in flight when the marker appears; wait until it is committed).
        while time.time() < deadline and child.poll() is None:
            if os.path.exists(run + ".marker") and Checkpointer(run + "/checkpoints").latest_step() == 8:
                break
            time.sleep(0.5)
        assert child.poll() is None, child.stderr.read()[-3000:]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    for workdir, start in ((run, "8"), (ref, "None")):
        proc = subprocess.run(
            [sys.executable, str(script), "resume", workdir],
            env=env, capture_output=True, text=True, timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"START {start}" in proc.stdout  # the killed run resumes from step 8
    with np.load(run + ".npz") as a, np.load(ref + ".npz") as b:
        assert a.files == b.files
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k])
