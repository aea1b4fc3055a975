"""What fraction of the memory floor a plain device copy reaches at each bench case's size.

The benchmark's floor is the bytes a case must move over the bandwidth of a 1 GiB copy. Small cases
cannot reach it: launch, ramp-up and tail cost a fixed few microseconds. This prints, per case, a
copy moving the same bytes (half read, half written), timed by the benchmark's protocol (L2 flushed
by reading a buffer, device held: clean lines only), and the same copy under write-flush timing
(the flush zero-fills its buffer), whose dirty lines the copy
then writes back. Not a test; on a CUDA device:

    python3 scripts/copy_floor.py chunk_gla_fwd_o_gk bench_fla [cuda:0]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from opgen.run import bench
from opgen.evidence import compare  # noqa: E402
from opgen.backends import get_backend  # noqa: E402
from opgen.spec.spec import load_spec  # noqa: E402
from opgen.run.worker import prepare_case  # noqa: E402


def main(op: str, cases: str, device: str = "cuda:0") -> None:
    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    backend = get_backend("cuda", device)
    bandwidth = compare.copy_bandwidth(backend)
    flush_elems = backend.FLUSH_BYTES // 4
    dirty = torch.empty(flush_elems, dtype=torch.float32, device=device)
    protocol = bench.Protocol(warmup=5, repeat=50)
    print(f"copy bandwidth (1 GiB) {bandwidth / 1e12:.3f} TB/s")
    print(f"{'case':<34} {'MB':>7} {'floor ms':>9} {'copy ms':>8} {'copy/floor':>10} {'dirty ms':>9} {'dirty/floor':>11}")
    seen = set()
    for row in spec.expand_cases(cases):
        case = prepare_case(spec, row, 0, device)
        nbytes = int(spec.traffic_bytes.evaluate(case["params"]))
        del case
        if nbytes in seen:
            continue
        seen.add(nbytes)
        src = torch.empty(nbytes // 8, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        copy_ms = bench.median(bench.measure(backend, lambda: dst.copy_(src), protocol))
        times = []
        timer = backend.timer()
        for _ in range(protocol.repeat):
            # the device held (the host's launch is not timed), then 256 MB zeroed: the L2 is
            # left full of dirty lines
            backend.hold()
            dirty.zero_()
            times.append(timer(lambda: dst.copy_(src)))
        dirty_ms = bench.median(times)
        floor_ms = nbytes / bandwidth * 1e3
        print(f"{compare.case_id(row):<34} {nbytes / 1e6:>7.1f} {floor_ms:>9.4f} {copy_ms:>8.4f} "
              f"{floor_ms / copy_ms:>10.3f} {dirty_ms:>9.4f} {floor_ms / dirty_ms:>11.3f}", flush=True)
        del src, dst


if __name__ == "__main__":
    main(*sys.argv[1:])
