"""How far the frozen table's choice on each case of a case set is from the fastest candidate
measured there: the headroom a better fill rule could win with the points the table has.

Reads a measure run on the case set's buckets (``opgen tune --cases SET --trials 0
--measure-fill --records COPY`` on a device, into a copy of the op's records file, as the holdout
must stay unmeasured in the file itself: the latest run of each bucket counts, keyed as the spec
keys its case now) and the table the op's records freeze now. Prints per case: the time
of the table's point in that run (a point the run did not measure has none), the fastest
candidate and where it came from, the ratio of the two, and the geomean ratio. Runs on the CPU:

    python3 scripts/fill_oracle.py chunk_gla_fwd_o_gk h200 users_holdout \
        benchmarks/runs/h200_gla_measure_fill_users_holdout_eb22545.jsonl
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen.run.bench import geomean  # noqa: E402
from opgen.evidence.compare import case_id  # noqa: E402
from opgen.evidence.explain import explain  # noqa: E402
from opgen.spec.hardware import profile  # noqa: E402
from opgen.render.kernels import kernel_hashes  # noqa: E402
from opgen.storage.records import latest_measure_runs, record_path  # noqa: E402
from opgen.space.space import point_id  # noqa: E402
from opgen.spec.spec import load_spec  # noqa: E402
from opgen.table.table import frozen_rows, read_keyed  # noqa: E402


def main(op: str, chip_name: str, cases: str, measured: str) -> None:
    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    chip = profile(chip_name)
    table = frozen_rows(spec, chip, record_path(ROOT, chip.name, op), kernel_hashes(ROOT, spec, chip.rendering))
    runs = latest_measure_runs(read_keyed(spec, chip, Path(measured)).records)
    ratios = []
    print(f"{'case':<36} {'table ms':>9} {'best ms':>9} {'ratio':>6}  best point (source)")
    for row in spec.expand_cases(cases):
        found = explain(ROOT, spec, chip, row, table)
        latest = [r for r in runs.get(tuple(found["key"]), ()) if r.ms is not None]
        if not latest:
            print(f"{case_id(row):<36} no measure of its bucket")
            continue
        best = min(latest, key=lambda r: r.ms)
        ours = next((r.ms for r in latest if point_id(r.variant, r.point)
                     == point_id(found["variant"], found["config"])), None)
        if ours is None:
            print(f"{case_id(row):<36} {'-':>9} {best.ms:>9.4f} {'-':>6}  the table's point was not measured")
            continue
        ratios.append(best.ms / ours)
        print(f"{case_id(row):<36} {ours:>9.4f} {best.ms:>9.4f} {best.ms / ours:>6.3f}  "
              f"{best.variant}:{','.join(f'{k}={v}' for k, v in best.point.items())} ({best.source})")
    if ratios:
        print(f"geomean best / table over {len(ratios)} cases: {geomean(ratios):.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
