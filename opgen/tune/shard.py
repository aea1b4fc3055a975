"""Work split over several devices: ``--shard K/N`` keeps one share, ``--devices`` runs them all.

A shard is a deterministic share of a list of weighted items (a campaign's buckets, a benchmark's
cases): items go, heaviest first, to the least loaded share, ties to the lower index, so every
shard computes the same split on its own. ``run_shards`` starts one ``opgen`` process per device,
each pinned to its device through the vendor's visibility variable (the process then sees it as
device 0, which is where Triton launches), hands it its options by value (a JSON object on its
standard input: the parent's parsed options with its device and shard) and prefixes their output
lines with the device.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import UsageError
from ..run.lifetime import die_with_parent

if TYPE_CHECKING:
    from ..space.plan import StudyPlan

__all__ = ["parse_shard", "assign", "shard_plans", "pin", "run_shards", "FROM_STDIN"]

FROM_STDIN = "--options-from-stdin"
"""The one argument of a shard process: its parsed options follow as JSON on standard input."""
_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N) with 0 <= K < N.

    Raises:
        UsageError: for anything else.
    """
    parts = text.split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"--shard must be K/N with whole numbers, got {text!r}")
    k, n = int(parts[0]), int(parts[1])
    if n < 1 or not 0 <= k < n:
        raise UsageError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return k, n


def assign(weights: Sequence[float], n: int) -> list[int]:
    """The shard of each item: heaviest first to the least loaded shard (ties: lower index)."""
    load = [0.0] * n
    out = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        target = min(range(n), key=lambda s: (load[s], s))
        out[i] = target
        load[target] += weights[i]
    return out


def shard_plans(plans: list[StudyPlan], k: int, n: int, cap: int | None = None) -> list[StudyPlan]:
    """The studies of the K-th of N shares of the buckets, weighed by the points they may measure
    (at most ``cap`` per study); every shard computes the same split (``opgen.tune.shard.assign``)."""
    keys = list(dict.fromkeys(p.bucket.key for p in plans))
    weight = {key: 0.0 for key in keys}
    for p in plans:
        weight[p.bucket.key] += min(len(p.points), cap) if cap else len(p.points)
    mine = {key for key, s in zip(keys, assign([weight[key] for key in keys], n)) if s == k}
    return [p for p in plans if p.bucket.key in mine]


def pin(device: str) -> tuple[dict[str, str], str]:
    """Environment that shows a process only ``device``, and the name it has there.

    ``cuda:3`` -> ({"CUDA_VISIBLE_DEVICES": "3"}, "cuda:0"); likewise ``npu:N``.

    Raises:
        UsageError: for a device that is not ``cuda:N`` or ``npu:N``.
    """
    kind, _, index = device.partition(":")
    if kind not in _VISIBLE or not index.isdigit():
        raise UsageError(f"--devices takes cuda:N or npu:N entries, got {device!r}")
    return {_VISIBLE[kind]: index}, f"{kind}:0"


def run_shards(options: Sequence[Mapping[str, Any]], devices: Sequence[str]) -> list[int]:
    """Run ``opgen`` once per device, in parallel, with ``options[i]`` (parsed command-line
    options, JSON-able) plus ``device`` and ``shard`` (``i/N``) set for the i-th device.

    Output lines are prefixed with ``[device]``; returns the exit codes in device order.
    """
    if len(set(devices)) != len(devices):
        raise UsageError(f"--devices lists a device twice: {','.join(devices)}")
    procs = []
    for i, device in enumerate(devices):
        env, local = pin(device)
        payload = json.dumps({**options[i], "device": local, "shard": f"{i}/{len(devices)}"})
        # a shard dies with this process as a worker does (its own workers then die with it)
        proc = subprocess.Popen([sys.executable, "-m", "opgen.cli", FROM_STDIN],
                                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=functools.partial(die_with_parent, os.getpid())
                                if os.name == "posix" else None)
        proc.stdin.write(payload)
        proc.stdin.close()
        procs.append(proc)
    lock = threading.Lock()

    def relay(device: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with lock:
                print(f"[{device}] {line}", end="", flush=True)

    threads = [threading.Thread(target=relay, args=(d, p)) for d, p in zip(devices, procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [p.wait() for p in procs]
