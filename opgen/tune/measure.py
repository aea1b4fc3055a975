"""Measuring points on a bucket's cases: one by one, or a batch compiled and checked in parallel
worker processes first. Uses ``worker``, ``search`` (``Measured``), ``plan``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from ..run.worker import Result, Task, Worker
from ..space.plan import Bucket
from ..space.space import Point, Variant, budget_bytes
from ..spec.hardware import ChipProfile
from ..spec.spec import OpSpec
from .search import Measured

TaskOf = Callable[..., Task]
"""``task_of(point, case, timed=True, protocol=None)``: the task of a point on a case."""


def measure(worker: Worker, task_of: TaskOf, point: Point, bucket: Bucket, timeout: float) -> Measured:
    """Run a point on every case of its bucket; stop at the first failure."""
    out = Measured(point)
    for case in bucket.cases:
        result = worker.run(task_of(point, case), timeout)
        out.results.append(result)
        if result.status != "ok":
            break
    return out


def measure_batch(pool: Sequence[Worker], measure_one: Callable[[Point, Bucket], Measured], task_of: TaskOf,
                  points_: list[Point], bucket: Bucket, timeout: float) -> list[Measured]:
    """Measure several points: compile and check them in parallel on ``pool`` first, then time
    the rest one by one (``measure_one``). A failure in the parallel phase is final, except a
    timeout or running out of device memory: the workers share the device and the host, so a slow
    point (a large case, a long compile) may only have waited for the others, and one case's
    inputs and golden in every worker may fill the device together; such a point is measured again
    alone, under the same timeout, and a real hang costs two timeouts. After an out-of-memory the
    pool's workers are stopped first (each keeps its cases' inputs and goldens on the device) and
    start again with the next batch."""
    if not pool or len(points_) < 2:
        return [measure_one(p, bucket) for p in points_]
    out = []
    for point, failed in zip(points_, _check_on_pool(pool, task_of, points_, bucket, timeout)):
        final = failed is not None and failed.status != "timeout" and not out_of_memory(failed)
        out.append(Measured(point, [failed]) if final else measure_one(point, bucket))
    return out


def check_batch(pool: Sequence[Worker], worker: Worker, task_of: TaskOf, points_: list[Point], bucket: Bucket,
                timeout: float) -> list[Result | None]:
    """Compile and check several points on every case of a bucket, untimed: per point, its first
    failure or None. In parallel on ``pool`` first, as :func:`measure_batch` does (a timeout or
    out-of-memory there is checked again alone on ``worker``), else one by one on ``worker``."""

    def alone(point: Point) -> Result | None:
        untimed = functools.partial(task_of, timed=False)
        return next((r for r in measure(worker, untimed, point, bucket, timeout).results if r.status != "ok"), None)

    if not pool or len(points_) < 2:
        return [alone(p) for p in points_]
    out = []
    for point, failed in zip(points_, _check_on_pool(pool, task_of, points_, bucket, timeout)):
        again = failed is not None and (failed.status == "timeout" or out_of_memory(failed))
        out.append(alone(point) if again else failed)
    return out


def _check_on_pool(pool: Sequence[Worker], task_of: TaskOf, points_: list[Point], bucket: Bucket,
                   timeout: float) -> list[Result | None]:
    """Each point's first failure (None: every case passed) on the bucket's cases, compiled and
    checked untimed in parallel on the pool's workers; after an out-of-memory the pool's workers
    are stopped (each keeps its cases' inputs and goldens on the device) and start again with the
    next batch."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    free: queue.Queue[Any] = queue.Queue()
    for worker in pool:
        worker.start()  # from this thread: a worker dies with the thread that started it
        free.put(worker)

    def compile_one(task: Task) -> Result:
        worker = free.get()
        try:
            return worker.run(task, timeout)
        finally:
            free.put(worker)

    tasks = [task_of(p, case, timed=False) for p in points_ for case in bucket.cases]
    threads = ThreadPoolExecutor(len(pool))
    try:
        checked = list(threads.map(compile_one, tasks))
    finally:  # interrupted: the tasks not started never start
        threads.shutdown(wait=True, cancel_futures=True)
    if any(out_of_memory(r) for r in checked):
        for worker in pool:
            worker.close()
    n = len(bucket.cases)
    return [next((r for r in checked[i * n:(i + 1) * n] if r.status != "ok"), None) for i in range(len(points_))]


def out_of_memory(result: Result) -> bool:
    """Whether a failure is the device running out of memory (torch's OutOfMemoryError, CUDA's or
    the NPU's message), which the other workers' cases may have caused."""
    return result.status == "crash" and (result.reason.startswith("OutOfMemoryError")
                                         or "out of memory" in result.reason.split("\n", 1)[0].lower())


def budget_record(spec: OpSpec, profile: ChipProfile, variant: Variant, point: Point, params: dict[str, Any],
                  reported: dict[str, int] | None = None) -> dict[str, Any] | None:
    """A record's ``budget`` field: the spec's estimate of a point's on-chip bytes and, where the
    compiler reported them, the real shared memory or UB bytes, registers and spills."""
    used = budget_bytes(spec, variant, point.config, params, profile)
    if used is None:
        return None
    real = reported or {}
    value = None
    if "shared" in real:
        value = real["shared"]
    elif "required_ub_bits" in real:
        value = real["required_ub_bits"] // 8
    out = {"kind": used[0], "estimate": used[1], "reported": value}
    out.update({k: real[name] for k, name in (("regs", "n_regs"), ("spills", "n_spills")) if name in real})
    return out
