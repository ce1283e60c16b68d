"""Recorded unit norms on disk: the reference that a wd_mimicry run reads from another run."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm.optim import record_norms
from jaxnorm.train import norm_records


def _recorded_state():
    params = {
        "dense": {"kernel": jnp.full((3, 2), 2.0), "bias": jnp.zeros(2)},
        "head": {"kernel": jnp.ones((2, 4))},
    }
    mask = {"dense": {"kernel": True, "bias": False}, "head": {"kernel": False}}
    tx = optax.chain(optax.sgd(0.1), record_norms(3, mask=mask))
    state = tx.init(params)
    for _ in range(3):
        _, state = tx.update(
            {
                "dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)},
                "head": {"kernel": jnp.ones((2, 4))},
            },
            state,
            params,
        )
    return state


def test_save_load_and_resolve_round_trip(tmp_path):
    norms = norm_records.recorded_norms(_recorded_state())
    path = norm_records.save_recorded_norms(str(tmp_path / "wd"), norms)
    assert path == str(tmp_path / "wd" / norm_records.FILENAME)
    loaded = norm_records.load_recorded_norms(path)
    assert set(loaded) == {"dense"} and set(loaded["dense"]) == {"kernel"}
    np.testing.assert_allclose(loaded["dense"]["kernel"], np.full((3, 2), np.sqrt(12.0)), rtol=1e-6)
    # the file, its run directory, or the run's name seen from a sibling run's workdir
    for reference, workdir in ((path, None), (str(tmp_path / "wd"), None), ("wd", str(tmp_path / "mimic"))):
        assert norm_records.resolve_reference(reference, workdir) == path


def test_no_record_and_bad_references_give_clear_errors(tmp_path):
    assert norm_records.recorded_norms(optax.sgd(0.1).init({"w": jnp.ones((2, 2))})) is None
    with pytest.raises(
        ValueError, match=r"reference 'wd' has no recorded norms; looked for .*record_norms wrapper"
    ):
        norm_records.resolve_reference("wd", str(tmp_path / "mimic"))
    with pytest.raises(ValueError, match="must name a recorded-norms file or run"):
        norm_records.resolve_reference("", None)
    with pytest.raises(ValueError, match="holds no recorded kernel"):
        norm_records.save_recorded_norms(str(tmp_path / "x"), {"w": None})
    with pytest.raises(ValueError, match="contains '/'"):
        norm_records.save_recorded_norms(str(tmp_path / "y"), {"a/b": jnp.ones((2, 2))})
    with pytest.raises(ValueError, match="2 record_norms states"):
        state = _recorded_state()
        norm_records.recorded_norms((state, state))


def test_a_sibling_run_wins_over_a_directory_of_its_name_where_the_command_runs(tmp_path, monkeypatch):
    """The current directory was searched first: run from a directory holding another sweep's
    ``wd/recorded_norms.npz``, a ``no_wd_mimicry`` run followed those norms without a word (found by the
    CLI fuzz of 2026-12-02)."""
    norms = norm_records.recorded_norms(_recorded_state())
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    own = norm_records.save_recorded_norms(str(sweep / "wd"), norms)
    norm_records.save_recorded_norms(str(elsewhere / "wd"), norms)
    monkeypatch.chdir(elsewhere)
    assert norm_records.resolve_reference("wd", str(sweep / "mimic")) == own
    assert norm_records.resolve_reference("wd", None) == "wd/" + norm_records.FILENAME  # no sweep: as given
