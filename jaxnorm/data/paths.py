"""Where datasets live: the ``data_dir`` option, ``$JAXNORM_DATA_DIR``, ``~/tensorflow_datasets``."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "JAXNORM_DATA_DIR"
"""Environment variable naming the TFDS data directory."""


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir`` if given, else ``$JAXNORM_DATA_DIR``, else ``~/tensorflow_datasets``."""
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or "~/tensorflow_datasets"
    if not isinstance(data_dir, str | os.PathLike):
        raise TypeError(f"data_dir must be a path (a str or os.PathLike) or None, got {data_dir!r}")
    return Path(data_dir).expanduser()


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is not prepared in the data directory; the message says how to get it."""
