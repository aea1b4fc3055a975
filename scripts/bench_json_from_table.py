"""The ``--json`` file of a benchmark whose run kept only its table: one JSON per table of a file
written by ``opgen bench ... --output`` (several tables, one after the other, as in
``benchmarks/h200_mamba3_mimo_bwd_fwd_vs_tilelang.txt``), in the format ``opgen bench --json``
writes, so that ``opgen report`` reads values, never the table.

The values are the table's, at its printed precision (times to 0.1 us, errors to three digits).
What the table does not print per case is left out: the write-flush medians (NaN) and the
agreement of every output but the worst (``agree`` holds that one). Each file says so in
``converted_from`` and ``not_recorded``. Runs on the CPU:

    python3 scripts/bench_json_from_table.py benchmarks/h200_mamba3_mimo_bwd_fwd_vs_tilelang.txt \
        --baseline tilelang --cases official official_z \
        --out benchmarks/logs/h200_mamba3_vs_tilelang_official.json \
              benchmarks/logs/h200_mamba3_vs_tilelang_official_z.json
"""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

_HEAD = re.compile(r"^# (?P<op>\S+): generated/\S+ (?P<generated>\S+), measured on (?P<toolchain>\{.*\})$")
_NUMBERS = ("ours_ms", "base_ms", "speedup", "floor_ours", "floor_base", "ours_err", "base_err",
            "ours_host_us", "base_host_us", "ours_first_s", "base_first_s")


def tables(text: str) -> list[dict]:
    """Each table of a ``--output`` file: its provenance line's op, generated hash and toolchain,
    and its case rows as :class:`opgen.compare.CaseResult` fields."""
    out: list[dict] = []
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head:
            out.append(dict(op=head["op"], generated=head["generated"],
                            toolchain=json.loads(head["toolchain"]), results=[]))
            continue
        words = line.split()
        if not out or not words or words[0] == "case" or not re.match(r"^[A-Z]\d", words[0]):
            continue  # the header, the summary lines, blank lines
        values = dict(zip(_NUMBERS, (float(w.rstrip("x")) for w in words[1:12])))
        row = dict(case=words[0], ours_ms=values["ours_ms"], base_ms=values["base_ms"],
                   floor_ms=values["floor_ours"] * values["ours_ms"],
                   ours_err=values["ours_err"], base_err=values["base_err"],
                   ours_first_s=values["ours_first_s"], base_first_s=values["base_first_s"],
                   ours_host_us=values["ours_host_us"], base_host_us=values["base_host_us"],
                   ours_dirty_ms=math.nan, base_dirty_ms=math.nan,
                   agree={words[12]: float(words[13])} if len(words) >= 14 else {})
        out[-1]["results"].append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a file written by opgen bench --output")
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--cases", nargs="+", required=True, help="the case set of each table, in order")
    parser.add_argument("--out", nargs="+", required=True, help="one JSON file per table, in order")
    args = parser.parse_args()
    found = tables(Path(args.table).read_text(encoding="utf-8"))
    if not len(found) == len(args.cases) == len(args.out):
        raise SystemExit(f"{args.table} holds {len(found)} tables: give as many --cases and --out")
    for table, cases, out in zip(found, args.cases, args.out):
        table = dict(table, baseline=args.baseline, cases=cases, converted_from=args.table,
                     not_recorded=["ours_dirty_ms", "base_dirty_ms", "agree (all but the worst output)"])
        Path(out).write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}: {len(table['results'])} cases")


if __name__ == "__main__":
    main()
