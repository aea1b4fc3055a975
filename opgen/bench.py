"""The timing protocol: warm-up, repeats with a cache flush before each, the median, and a
side-by-side re-measure of the best few so drift between them cancels. Uses ``backends``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from .backends import Backend


@dataclass(frozen=True)
class Protocol:
    """How a point is timed. Defaults suit kernels of 10 us to 10 ms."""

    warmup: int = 5
    repeat: int = 25
    flush: bool = True


DEFAULT = Protocol()


def measure(backend: Backend, fn: Callable[[], object], protocol: Protocol = DEFAULT) -> list[float]:
    """Times of ``protocol.repeat`` calls of ``fn`` after ``protocol.warmup`` untimed ones, in ms."""
    for _ in range(protocol.warmup):
        fn()
    backend.synchronize()
    timer = backend.timer()
    times = []
    for _ in range(protocol.repeat):
        if protocol.flush:
            backend.flush()
        times.append(timer(fn))
    return times


def median(times: list[float]) -> float:
    """The median of a non-empty list of times."""
    return statistics.median(times)


def side_by_side(backend: Backend, fns: dict[str, Callable[[], object]], rounds: int = 5,
                 protocol: Protocol = DEFAULT) -> dict[str, float]:
    """Median times of several callables measured in interleaved rounds (same drift for all)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    per_round = Protocol(warmup=max(1, protocol.warmup // 2), repeat=max(1, protocol.repeat // rounds),
                         flush=protocol.flush)
    for _ in range(rounds):
        for name in sorted(fns):
            samples[name].extend(measure(backend, fns[name], per_round))
    return {name: median(times) for name, times in samples.items()}
