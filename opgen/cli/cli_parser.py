"""The arguments of each ``opgen`` verb, with the function that runs it; :func:`opgen.cli.main.parser`
puts them under the global options.
"""
from __future__ import annotations

from typing import Any

from .. import options
from ..space.case_sample import MAX_CASES
from ..storage.storage import HEARTBEAT_SECONDS
from ..tune.settings import Settings
from .cli_bench import cmd_bench, cmd_host_time
from .cli_campaign import cmd_build, cmd_cases, cmd_records, cmd_tune
from .cli_inspect import cmd_explain, cmd_replay, cmd_report, cmd_resources, cmd_schema


def _add_build(sub: Any) -> None:
    """``opgen build``'s arguments."""
    build = sub.add_parser("build", help="render generated/ from specs, templates and records")
    build.add_argument("--check", action="store_true", help="exit 1 if generated/ is stale; write nothing")
    build.set_defaults(func=cmd_build)


def _add_cases(sub: Any) -> None:
    """``opgen cases``'s arguments."""
    cases_p = sub.add_parser("cases", help="draw the case sets of an op's sampling section into its file")
    cases_p.add_argument("op", help="operator (specs/<op>.yaml)")
    cases_p.add_argument("--sample", type=options.integer(1, MAX_CASES, "cases one draw may check"), help="cases to draw (default: the section's count)")
    cases_p.add_argument("--seed", type=int, help="seed of the draw and the split (default: the section's)")
    cases_p.add_argument("--holdout", type=options.part, help="share held out (default: the section's)")
    cases_p.add_argument("--measure", type=options.part, help="share kept for the measured fill (default: the section's)")
    cases_p.add_argument("--measure-extra", type=options.integer(0, MAX_CASES),
                         help="cases drawn last, into the measure part alone (default: the section's measure_extra)")
    cases_p.add_argument("--out", type=options.file_to_write, help="write here instead of the section's file")
    cases_p.add_argument("--check", action="store_true", help="exit 1 if the file differs from the draw; write nothing")
    cases_p.set_defaults(func=cmd_cases)


def _add_tune(sub: Any) -> None:
    """``opgen tune``'s arguments."""
    tune_p = sub.add_parser("tune", help="search tunables on a device; append tuning records")
    tune_p.add_argument("op", help="operator (specs/<op>.yaml)")
    tune_p.add_argument("--chip", required=True, help="chip profile (h200, ascend910b3, interpreter, ...)")
    tune_p.add_argument("--cases", default="bench", help="case set of the spec (default: bench)")
    tune_p.add_argument("--case", action="append", metavar="ID",
                        help="only this case of --cases, by the id the bench tables give it "
                             "(B4-S288-H64-G1-N32-P128-R4-C8-fp16); repeatable")
    tune_p.add_argument("--variants", type=options.names, help="comma-separated variant names (default: all legal)")
    tune_p.add_argument("--device", type=options.device, help="torch device (default: cuda:0, npu:0 or cpu)")
    tune_p.add_argument("--dry-run", action="store_true",
                        help="print the search space and exit (with --trials 0 --measure-fill: the buckets the "
                             "measure step would measure, their candidates, and those an earlier run keeps)")
    tune_p.add_argument("--storage", type=options.storage, help="optuna storage: RDB URL or journal file (default .tune/)")
    tune_p.add_argument("--trials", type=options.non_negative_int, default=40, help="measured points per study at most (0: no search)")
    tune_p.add_argument("--study-seconds", type=options.non_negative, default=900.0)
    tune_p.add_argument("--campaign-seconds", type=options.non_negative, default=3 * 3600.0,
                        help="wall-clock budget of the run: the studies share it, and --measure-fill "
                             "begins no bucket past it (a later run measures the rest)")
    tune_p.add_argument("--point-timeout", type=options.seconds, default=300.0,
                        help="seconds per point (points that timed out under a shorter one are measured again)")
    tune_p.add_argument("--warmup", type=options.non_negative_int, default=5)
    tune_p.add_argument("--repeat", type=options.positive_int, default=25)
    tune_p.add_argument("--seed", type=int, default=0)
    tune_p.add_argument("--date", type=options.date, help="date stamped on records (default: today)")
    tune_p.add_argument("--no-progress", action="store_true", help="no progress bar")
    tune_p.add_argument("--records", type=options.file_to_write, help="record file (default records/<chip>/<op>.jsonl)")
    tune_p.add_argument("--exhaustive-below", type=options.non_negative_int, default=64, help="search exhaustively up to this many points")
    tune_p.add_argument("--cross-check", action="store_true",
                        help="re-measure each tuned bucket's winner against the table's fill from the others")
    tune_p.add_argument("--cross-check-all", action="store_true",
                        help="--cross-check, and every other bucket's winner re-measured on each bucket too")
    tune_p.add_argument("--cross-margin", type=options.non_negative, default=0.10, help="loss that flags the table")
    tune_p.add_argument("--measure-fill", action="store_true",
                        help="re-measure every tuned winner's point on each untuned bucket of --cases, side "
                             "by side: the build fills each with the fastest (with --trials 0: measure only); "
                             "a bucket whose latest measure run holds every candidate on the current kernels "
                             "is kept, so a cut run resumes")
    tune_p.add_argument("--remeasure", action="store_true",
                        help="with --measure-fill: measure every bucket again, even one an earlier run covers")
    tune_p.add_argument("--drop-below", type=options.share, default=0.95,
                        help="with --measure-fill: leave out a candidate that ran under this share of the fastest "
                             "one's speed on every bucket the records measured it on (0: keep every candidate)")
    tune_p.add_argument("--drop-after", type=options.positive_int, default=5,
                        help="with --measure-fill: the measured buckets a candidate needs before --drop-below "
                             "may leave it out")
    tune_p.add_argument("--tie-margin", type=options.non_negative, default=Settings.tie_margin,
                        help="relative gap under which two times of the side-by-side tie (then the smaller "
                             "on-chip estimate wins, then the point's name)")
    tune_p.add_argument("--compile-workers", type=options.non_negative_int, default=0,
                        help="processes compiling and checking a batch of points in parallel before timing")
    tune_p.add_argument("--shard", help="K/N: tune only the K-th of N shares of the buckets (hosts sharing a storage)")
    tune_p.add_argument("--devices", type=options.device_list, help="comma-separated devices (cuda:0,cuda:1): one share of the buckets each, in parallel")
    tune_p.add_argument("--heartbeat", type=options.positive_int, default=HEARTBEAT_SECONDS,
                        help="PostgreSQL storage: seconds between heartbeats of a running trial; one that "
                             "misses three is failed and measured again by another process")
    tune_p.set_defaults(func=cmd_tune)


def _add_bench(sub: Any) -> None:
    """``opgen bench``'s arguments."""
    bench_p = sub.add_parser("bench", help="time a generated op against a baseline, side by side")
    bench_p.add_argument("op", help="operator (specs/<op>.yaml)")
    bench_p.add_argument("--baseline", required=True, help="a baseline named in the spec (e.g. fla)")
    bench_p.add_argument("--cases", default="bench", help="case set of the spec")
    bench_p.add_argument("--case", action="append", metavar="ID",
                         help="only this case of --cases, by its id in the tables; repeatable")
    bench_p.add_argument("--set", nargs="+", metavar="NAME=VALUE",
                         help="values set in every case (e.g. use_exp2=true for a baseline that computes "
                              "exp2 only); cases made equal by them run once")
    bench_p.add_argument("--backend", default="cuda", choices=("cuda", "npu"))
    bench_p.add_argument("--device", type=options.device, help="torch device (default: the backend's first)")
    bench_p.add_argument("--rounds", type=options.positive_int, default=5, help="interleaved rounds")
    bench_p.add_argument("--warmup", type=options.non_negative_int, default=10)
    bench_p.add_argument("--repeat", type=options.positive_int, default=50)
    bench_p.add_argument("--seed", type=int, default=0)
    bench_p.add_argument("--output", type=options.file_to_write, help="also write the table to this file")
    bench_p.add_argument("--where", metavar="FORMULA",
                         help="run only the cases for which this formula of their fields is true (e.g. "
                              "'chunk_size >= 16'), read as the case set holds them, before --set")
    bench_p.add_argument("--shard", help="K/N: run only the K-th of N shares of the cases")
    bench_p.add_argument("--devices", type=options.device_list, help="comma-separated devices (cuda:0,cuda:1): one share of the cases each, in parallel")
    bench_p.add_argument("--json", type=options.file_to_write, help="also write the results as JSON (what --merge reads; with --devices, the merged results)")
    bench_p.add_argument("--merge", nargs="+", type=options.file_to_read, metavar="JSON",
                         help="run nothing: print one table from the --json files of shards run apart")
    bench_p.add_argument("--compile-only", action="store_true",
                         help="call each side once per case, so that its kernels are compiled into the disk "
                              "caches: no golden, no check, no timing (the compiling processes before a timed run)")
    bench_p.set_defaults(func=cmd_bench)


def _add_host_time(sub: Any) -> None:
    """``opgen host-time``'s arguments."""
    host_p = sub.add_parser("host-time", help="the host work one call of each generated op costs up to its "
                                              "kernels' launch, beside a torch add_")
    host_p.add_argument("ops", nargs="*", help="operators (default: every op of specs/)")
    host_p.add_argument("--cases", default="host", help="case set of each spec (default: host)")
    host_p.add_argument("--backend", default="interpreter", choices=("interpreter", "cuda", "npu"),
                        help="where the tensors live (default: interpreter, CPU tensors)")
    host_p.add_argument("--device", type=options.device, help="torch device (default: the backend's first)")
    host_p.add_argument("--launch", default="none", choices=("none", "real"),
                        help="none: Triton's launch replaced by a no-op (any host); real: the launch itself (a device)")
    host_p.add_argument("--rounds", type=options.positive_int, default=201, help="interleaved rounds")
    host_p.add_argument("--calls", type=options.positive_int, default=10,
                        help="calls a round (few: a round the host's other work preempts is an outlier the median drops)")
    host_p.add_argument("--seed", type=int, default=0)
    host_p.add_argument("--json", type=options.file_to_write, help="also write the results as JSON")
    host_p.set_defaults(func=cmd_host_time)


def _add_records(sub: Any) -> None:
    """``opgen records``'s arguments."""
    records_p = sub.add_parser("records", help="report what the tuning records of an op on a chip hold")
    records_p.add_argument("op")
    records_p.add_argument("--chip", required=True)
    records_p.add_argument("--records", type=options.file_to_write, help="record file (default: records/<chip>/<op>.jsonl)")
    records_p.add_argument("--pull", metavar="URL", type=options.database_url,
                           help="first append the records a PostgreSQL tuning storage holds and the file lacks")
    records_p.set_defaults(func=cmd_records)


def _add_explain(sub: Any) -> None:
    """``opgen explain``'s arguments."""
    explain_p = sub.add_parser("explain", help="what the frozen table runs for one call's shape, and why")
    explain_p.add_argument("op")
    explain_p.add_argument("--chip", required=True)
    explain_p.add_argument("values", nargs="+", metavar="NAME=VALUE",
                           help="dims, scalars, dtype, <tensor>_given of the call (e.g. B=2 T=1024 dtype=bfloat16)")
    explain_p.add_argument("--json", action="store_true", help="print the answer as JSON")
    explain_p.add_argument("--compile", action="store_true",
                           help="also compile the kernels it runs at this shape for the chip, on this host (as "
                                "opgen resources: registers, spills, shared memory, occupancy; the Ascend front "
                                "end's verdict on an NPU chip)")
    explain_p.add_argument("--python", type=options.file_to_read, help="with --compile: a Python whose Triton has the NVIDIA backend")
    explain_p.set_defaults(func=cmd_explain)


def _add_resources(sub: Any) -> None:
    """``opgen resources``'s arguments."""
    resources_p = sub.add_parser(
        "resources", help="what the compiler says of the kernels the frozen table launches, no device",
        description="Every kernel the frozen table of CHIP launches (each distinct choice at the case it was measured on, "
                    "and the spec's default at those shapes; or, with --cases, what the table runs on each "
                    "case), compiled for the chip on this host without launching it. NVIDIA: registers per "
                    "thread, spill stores and loads, stack, shared memory, warps, the warp-group (wgmma) dots "
                    "and those with a dim of 16 or 32 (the kernels of the sm_90 wgmma fault form, "
                    "triton-lang/triton#10486, counted), and the blocks per multiprocessor they allow; "
                    "cached by Triton's compile key under .cache/opgen-resources. "
                    "The compile needs upstream Triton's NVIDIA backend: where this Python's Triton lacks it "
                    "(triton-ascend), it runs in a subprocess of --python, $OPGEN_CUDA_PYTHON, or the "
                    ".venv-descriptors that scripts/descriptor_interpreter.sh makes (in the project, or beside "
                    "this Python's venv). Ascend: the front end's verdict (TTIR -> Linalg) beside the spec's "
                    "UB estimate; the compiler's UB figure needs an NPU.")
    resources_p.add_argument("op")
    resources_p.add_argument("--chip", required=True)
    resources_p.add_argument("--cases", help="what the table runs on each case of this case set, instead of its choices")
    resources_p.add_argument("--json", action="store_true", help="print the answer as JSON")
    resources_p.add_argument("--jobs", type=options.positive_int, help="processes compiling the kernels not cached (default: the CPUs)")
    resources_p.add_argument("--python", type=options.file_to_read, help="a Python whose Triton has the NVIDIA backend, for the compile step")
    resources_p.add_argument("--cache", type=options.folder_to_write, help="folder of the cached figures (default: .cache/opgen-resources)")
    resources_p.add_argument("--compile-timeout", type=options.non_negative, default=600.0,
                             help="seconds a kernel may take to compile before it is reported as not compiled "
                                  "(0: no limit)")
    resources_p.add_argument("--check-budget", action="store_true",
                             help="the spec's budget formula against the compiled shared memory, on the table's "
                                  "choices and --sample points a variant drawn from its space at the cases of "
                                  "--cases (default: bench, or the spec's first case set); exit 1 on an "
                                  "underestimate")
    resources_p.add_argument("--spill-free", type=options.positive_int, metavar="N",
                             help="for each choice whose kernels spill, compile the N points of its space nearest it "
                                  "(fewest tunables changed first) at its case, and name the nearest that spills nothing")
    resources_p.add_argument("--keep", type=options.names, help="with --spill-free: tunables held at the choice's values "
                                            "(comma-separated, e.g. CHUNK_MAXNREG,DOT_PRECISION)")
    resources_p.add_argument("--set", type=options.names, metavar="NAME=VALUE",
                             help="with --spill-free: tunables the search holds at a value of their domain instead "
                                  "of the choice's (NAME=VALUE), or only where the choice holds FROM (NAME=FROM:TO); "
                                  "a choice they change is searched whether it spills or not, the choice as set "
                                  "first (e.g. CHUNK_MAXNREG=0:168: the uncapped choices under a 168-register cap)")
    resources_p.add_argument("--twins", type=options.names, metavar="A:B",
                             help="with --spill-free: pairs of options of one variant axis whose variants are "
                                  "searched as one space, a change of variant counted as one tunable changed "
                                  "(e.g. split:rowsplit,splitscan:rowscan)")
    resources_p.add_argument("--sample", type=options.positive_int, default=2, help="with --check-budget: points drawn a variant")
    resources_p.add_argument("--seed", type=int, default=0, help="seed of --check-budget's draw and of "
                                                                 "--spill-free's order among points as near")
    resources_p.add_argument("--variants", type=options.names, help="with --check-budget: only these variants (comma-separated)")
    resources_p.add_argument("--no-choices", action="store_true", help="with --check-budget: the drawn points alone")
    resources_p.set_defaults(func=cmd_resources)


def _add_report(sub: Any) -> None:
    """``opgen report``'s arguments."""
    report_p = sub.add_parser("report", help="a markdown page with plots of an op on a chip, from the committed files")
    report_p.add_argument("op")
    report_p.add_argument("--chip", required=True)
    report_p.add_argument("--out", type=options.folder_to_write, help="folder for the page and its PNGs (default: report/<chip>/<op>)")
    report_p.add_argument("--storage", type=options.storage_to_read, help="read the tuning history from this optuna storage (RDB URL or journal "
                          "file) instead of the records")
    report_p.set_defaults(func=cmd_report)


def _add_schema(sub: Any) -> None:
    """``opgen schema``'s arguments."""
    schema_p = sub.add_parser("schema", help="the JSON Schema of the spec format")
    schema_p.add_argument("--out", type=options.file_to_write, help="write it to this file (the repository keeps specs/spec.schema.json)")
    schema_p.set_defaults(func=cmd_schema)


def _add_replay(sub: Any) -> None:
    """``opgen replay``'s arguments."""
    replay_p = sub.add_parser("replay", help="replay the search on a recorded exhaustive sweep")
    replay_p.add_argument("op")
    replay_p.add_argument("--chip", required=True)
    replay_p.add_argument("--records", required=True, type=options.file_to_read, help="record file holding the sweep")
    replay_p.add_argument("--variant", required=True)
    replay_p.add_argument("--fraction", type=options.fraction, default=0.3, help="trial budget as a fraction of the sweep")
    replay_p.add_argument("--within", type=options.non_negative, default=0.03, help="gap to the exhaustive best that counts as a hit")
    replay_p.add_argument("--seeds", type=options.positive_int, default=20)
    replay_p.set_defaults(func=cmd_replay)



def add_verbs(sub: Any) -> None:
    """One sub-parser per verb under ``sub``, in the order ``opgen --help`` lists them."""
    for add in (_add_build, _add_cases, _add_tune, _add_bench, _add_host_time, _add_records, _add_explain, _add_resources, _add_report, _add_schema, _add_replay):
        add(sub)
