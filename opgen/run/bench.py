"""The timing protocol: warm-up, repeats with a cache flush before each, the median, and a
side-by-side re-measure of the best few so drift between them cancels. Uses ``backends``.

Before each timed call the device is also held busy (``Backend.hold``) for longer than the call's
host work, measured first, so the timer measures the device's work: the host's launch overhead
(argument checks, dispatch, Triton's launcher) is measured apart by :func:`host_overhead`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from ..backends import Backend


@dataclass(frozen=True)
class Protocol:
    """How a point is timed. Defaults suit kernels of 10 us to 10 ms."""

    warmup: int = 5
    repeat: int = 25
    flush: bool = True
    hold: bool = True
    # Write-flush timing (``dirty=True``): flush and hold write, so the timed call starts with the
    # cache full of dirty lines and pays their write-back. The default reads: clean lines only.
    dirty: bool = False


DEFAULT = Protocol()
HOLD_MARGIN = 2.0  # the hold before a timed call covers this many times the call's host work


def measure(backend: Backend, fn: Callable[[], object], protocol: Protocol = DEFAULT) -> list[float]:
    """Times of ``protocol.repeat`` calls of ``fn`` after ``protocol.warmup`` untimed ones, in ms."""
    for _ in range(protocol.warmup):
        fn()
    backend.synchronize()
    cover = HOLD_MARGIN * host_overhead(backend, fn, calls=3) if protocol.hold else 0.0
    timer = backend.timer()
    times = []
    for _ in range(protocol.repeat):
        if protocol.flush:
            backend.flush(protocol.dirty)
        if protocol.hold:
            backend.hold(protocol.dirty, cover)
        times.append(timer(fn))
    return times


def host_overhead(backend: Backend, fn: Callable[[], object], calls: int = 20) -> float:
    """Host seconds per call of ``fn``: ``calls`` calls queued back to back behind a held device,
    so the host never waits for the device (the queue holds far more launches than ``calls``)."""
    fn()
    backend.synchronize()
    backend.hold()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    backend.synchronize()
    return elapsed / calls


def median(times: list[float]) -> float:
    """The median of a non-empty list of times."""
    return statistics.median(times)


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values."""
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def per_round(protocol: Protocol, rounds: int) -> Protocol:
    """The protocol of one round of a side-by-side re-measure: half the warm-up (at least 2) and
    an equal share of the repeats (at least 3), so ``rounds`` rounds cost about one measure."""
    return dataclasses.replace(protocol, warmup=max(2, protocol.warmup // 2),
                               repeat=max(3, protocol.repeat // rounds))


def side_by_side(backend: Backend, fns: dict[str, Callable[[], object]], rounds: int = 5,
                 protocol: Protocol = DEFAULT) -> dict[str, float]:
    """Median times of several callables measured in interleaved rounds (same drift for all)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    one_round = per_round(protocol, rounds)
    for _ in range(rounds):
        for name in sorted(fns):
            samples[name].extend(measure(backend, fns[name], one_round))
    return {name: median(times) for name, times in samples.items()}
