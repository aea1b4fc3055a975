"""How well the nearest fill stands in for the measure step, scored on the records alone: for each
bucket the measure step measured (``opgen tune --measure-fill``), the row the nearest fill gives it
from the tuned and the other measured buckets (leave-one-out), looked up among that bucket's own
measured candidates. Prints per bucket the fill's source (a tuned or measured key, or ``default``:
a bucket where the spec's default ran fastest is nearer than any row, or none serves) and the
fastest candidate's time over the fill's, as the measured fill weighs runs: each run's fastest
over the point's time in it, geometric mean over the bucket's runs that timed it
(``opgen.table.fill_measured.run_shares``); then the geomean and the minimum. With ``--no-kept`` the
measured buckets where the default ran fastest are no sources of the fill.
Runs on the CPU:

    python3 scripts/fill_loo.py chunk_gla_fwd_o_gk h200 [--no-kept]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen.run.bench import geomean  # noqa: E402
from opgen.spec.hardware import profile  # noqa: E402
from opgen.render.kernels import kernel_hashes  # noqa: E402
from opgen.spec.keys import sort_key  # noqa: E402
from opgen.storage.records import latest_measure_runs, record_path  # noqa: E402
from opgen.table.bucket_shapes import edge_params  # noqa: E402
from opgen.space.space import carried_clamped, case_inputs, evaluate_params, point_id  # noqa: E402
from opgen.spec.spec import load_spec  # noqa: E402
from opgen.table.fill_measured import fill_measured, run_shares  # noqa: E402
from opgen.table.fill_nearest import leave_one_out_fill, stand_ins  # noqa: E402
from opgen.table.table_records import read_keyed, split_winners  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("op")
    parser.add_argument("chip")
    parser.add_argument("--no-kept", action="store_true", help="measured buckets kept at the default are no sources")
    args = parser.parse_args()
    spec = load_spec(ROOT / "specs" / f"{args.op}.yaml", ROOT)
    chip = profile(args.chip)
    hashes = kernel_hashes(ROOT, spec, chip.rendering)
    path = record_path(ROOT, chip.name, spec.op)
    records = read_keyed(spec, chip, path).records
    tuned, _, pending = split_winners(spec, chip, path, records, hashes)
    measured = fill_measured(spec, chip, tuned, records, hashes, pending)
    rows = {r.key: r for r in measured.rows}
    runs = latest_measure_runs(records)
    shares = run_shares(records, hashes)
    ratios = []
    print(f"{'bucket':<46} {'fill from':<46} {'best/fill':>9}")
    for key in sorted({*rows, *measured.kept}, key=sort_key):
        params = evaluate_params(spec, case_inputs(spec, runs[key][0].case))
        variant, point, source = leave_one_out_fill(spec, chip, {**tuned, **stand_ins(rows.values())}, key, params,
                                                    keep=frozenset() if args.no_kept else frozenset(measured.kept))
        config = carried_clamped(spec, chip, variant, point, params, edge_params(spec, runs[key][0].case, 'fill_loo'))
        ident = None if config is None else point_id(variant, config)
        found = [share for (_, i), share in shares.get(key, {}).items() if i == ident]
        ratio = 1 / min(found) if found else None
        if ratio is not None:
            ratios.append(ratio)
        print(f"{str(key):<46} {source or 'default':<46} {'not measured' if ratio is None else f'{ratio:9.3f}'}")
    print(f"fastest measured over the fill's point: geomean {geomean(ratios):.3f}, min {min(ratios):.3f} "
          f"over {len(ratios)} buckets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
