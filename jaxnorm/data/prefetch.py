"""Prefetching: compute the next batches on a background thread while the current one is used."""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import TypeVar

from jaxnorm.data.base import check_int

T = TypeVar("T")


def prefetch(make: Callable[[int], T], indices: range, size: int = 2) -> Iterator[T]:
    """Yield ``make(i)`` for ``i`` in ``indices``, keeping up to ``size`` results in flight.

    ``make`` runs on one worker thread (NumPy releases the GIL in its copies), so batch assembly
    overlaps with the consumer's device step. Closing the generator early cancels the pending
    work. ``size=0`` computes each batch on demand. ``size`` (an integer >= 0) is checked when this
    is called, not at the first ``next``.
    """
    return _prefetched(make, indices, check_int("size", size))


def _prefetched(make: Callable[[int], T], indices: range, size: int) -> Iterator[T]:
    """The generator behind :func:`prefetch`, ``size`` already checked."""
    if size == 0:
        yield from (make(i) for i in indices)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending: collections.deque[concurrent.futures.Future[T]] = collections.deque()
        todo = iter(indices)
        try:
            for i in todo:
                pending.append(pool.submit(make, i))
                if len(pending) > size:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
