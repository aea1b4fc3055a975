"""The tracked text describes the product, not how it was made.

Docs, code, specs, templates, scripts and generated files say what was measured, on which
hardware and toolchain, with which command and at which commit; the history of the work lives in
git. This scans every git-tracked text file, data aside, for words of that history (numbered work
periods and runs, the measuring machine as borrowed, the tools of a development environment) and
prints ``file:line`` for each hit.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOCASE = re.IGNORECASE

# (pattern, what it catches, words one of which a text must hold for the pattern to be searched:
# a fast substring test, lower case for the case-blind patterns). Matched against each file's whole
# text, hits reported per line.
PATTERNS: list[tuple[re.Pattern[str], str, tuple[str, ...]]] = [
    (re.compile(r"\bsessions?\b", NOCASE), "work periods ('session 7', 'this session')", ("session",)),
    (re.compile(r"\bsittings?\b", NOCASE), "work periods", ("sitting",)),
    # a number after "call" that is no duration ("first call 0.60 s", "per call 44-88 µs")
    (re.compile(r"\bcalls? \d+(?:\s*[-–]\s*\d+)?(?![-–.\d])(?!\s*(?:µs|us|ms|s)\b)", NOCASE),
     "numbered runs ('call 3', 'calls 2-4')", ("call",)),
    (re.compile(r"call\d", NOCASE), "run numbers in file names ('s7call5', 'call1')", ("call",)),
    (re.compile(r"\bdevice calls?\b", NOCASE), "the development environment's unit of work", ("device call",)),
    (re.compile(r"\blent\b|\bborrow(?:s|ed|ing)?\b|\bleas(?:e|es|ed|ing)\b", NOCASE),
     "the measuring machine as lent, borrowed or leased", ("lent", "borrow", "leas")),
    (re.compile(r"\bworkplaces?\b|\bdevice[- ]tool\b|\bsandbox", NOCASE), "the development environment",
     ("workplace", "tool", "sandbox")),
    (re.compile(r"\bCEO\b"), "the development environment's roles", ("CEO",)),
    (re.compile(r"\$OUT\b|\bOUT\b"), "the development environment's output folder ($OUT)", ("OUT",)),
    (re.compile(r"\bcarr(?:y|ies|ied)\s+\.(?:whl|tune)\b|\bcarried wheels\b", NOCASE),
     "the development environment's file transfer (carry)", ("carr",)),
    (re.compile(r"\bnvidia-h200(?:-x\d+)?\b|\bkind\s+`?nvidia", NOCASE),
     "machine kinds of the development environment", ("nvidia-", "kind")),
    (re.compile(r"\bthis machine\b|\bproject machines?\b", NOCASE), "the machines the work ran on",
     ("machine",)),
    (re.compile(r"\bshared/[\w.-]+|\bshared seed\b|\bseed \d{3}\b", NOCASE),
     "files and labels outside the repository (cite the public document)", ("shared", "seed ")),
    (re.compile(r"\btoday\b", NOCASE), "dating the work ('today's kernels')", ("today",)),
]
# How the code came to be, told against a commit ("before commit 371d19c", "as before 371d19c",
# "since 175810b ..."): git holds that history. Searched in the product's code, specs, templates,
# scripts, docs and README only: benchmarks/README.md and the benchmark tables tie each figure to the
# commit it was measured at, which is provenance of a measurement, not history.
HISTORY = [
    (re.compile(r"\b(?:before|since|until|prior to)\s+(?:the\s+)?(?:commit\s+)?"
                r"(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", NOCASE),
     "history told against a commit ('before commit 371d19c')", ("before", "since", "until", "prior")),
    (re.compile(r"\bthe seed(?:'s)?\b(?! (?:of|for|argument|value|draws?)\b)", NOCASE),
     "documents outside the repository ('the seed's ...': name the public MindSpeed-Ops port)", ("seed",)),
]
HISTORY_SCOPE = re.compile(r"^(?:opgen/|specs/|templates/|scripts/|docs/|README\.md$)")

# Dates in prose date the work; in Python files they are record data of the tests and of the
# generated tables' row comments, so this one pattern skips *.py.
DATE = (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "dates in prose", ("20",))

# Data, not prose: tuning records, benchmark logs and sweeps (raw tool output), JSON. This file
# itself names the patterns.
SKIP = re.compile(r"^(records/.*\.jsonl|benchmarks/runs/.*|benchmarks/sweeps/.*|.*\.json|"
                  r"tests/test_product_text\.py)$")

# (path, pattern on the hit's line, why it is legitimate).
ALLOWED: list[tuple[str, re.Pattern[str], str]] = [
    ("opgen/cli/cli_campaign.py", re.compile(r"datetime\.date\.today\(\)"),
     "the date stamped on new records defaults to the current date"),
    ("opgen/cli/cli_parser.py", re.compile(r"\(default: today\)"), "the --date option's help says so"),
    ("opgen/render/render.py", re.compile(r"\bSandboxedEnvironment\b|jinja2\.sandbox\b"),
     "Jinja's restricted template environment, the base of the bounded one the build renders with"),
    ("tests/conftest.py", re.compile(r'^@pytest\.fixture\(scope="session"\)$'),
     "pytest's scope of a fixture made once for the whole test run"),
]


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p and not SKIP.match(p)]


def _text(path: str) -> str | None:
    try:
        data = (ROOT / path).read_bytes()
    except OSError:  # listed by git but absent from the work tree
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _matches(text: str, patterns=PATTERNS):
    """(match, what) of every pattern in ``text``, searched where one of its words occurs."""
    low = text.lower()
    for pattern, what, words in patterns:
        hay = low if pattern.flags & NOCASE else text
        if any(w in hay for w in words):
            yield from ((m, what) for m in pattern.finditer(text))


def _hits() -> tuple[list[str], set[int]]:
    """The hits not allowed, as ``file:line: text (what)``, and the allowlist entries used."""
    hits, used = [], set()
    for path in _tracked():
        text = _text(path)
        if text is None:
            continue
        patterns = PATTERNS if path.endswith(".py") else [*PATTERNS, DATE]
        if HISTORY_SCOPE.match(path):
            patterns = [*patterns, *HISTORY]
        for m, what in _matches(text, patterns):
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            line = text[start:end if end >= 0 else len(text)]
            allowed = [i for i, (p, rule, _) in enumerate(ALLOWED) if p == path and rule.search(line)]
            if allowed:
                used.update(allowed)
                continue
            lineno = text.count("\n", 0, m.start()) + 1
            hits.append(f"{path}:{lineno}: {line.strip()[:120]}  ({what})")
    return hits, used


def test_no_development_history_in_tracked_text():
    hits, used = _hits()
    if hits:
        pytest.fail("development-history words in tracked text:\n" + "\n".join(hits), pytrace=False)
    stale = [f"{p}: {rule.pattern} ({why})" for i, (p, rule, why) in enumerate(ALLOWED) if i not in used]
    if stale:
        pytest.fail("allowlist entries that match nothing:\n" + "\n".join(stale), pytrace=False)


@pytest.mark.parametrize("line", [
    "measured in session 7", "this sitting", "in call 3", "calls 2-4", "h200_bench_s7call5.txt",
    "h200_tune_call1_gla.log", "one device call", "on the lent H200", "a borrowed GPU", "the lease",
    "the workplace's device tool", "in the sandbox", "ask the CEO", "copied to $OUT", "written to OUT/x",
    "carry .whl", "kind nvidia-h200-x2", "on this machine", "see shared/ASCEND.md", "shared seed 002",
    "today's kernels",
])
def test_patterns_catch_their_examples(line):
    assert any(_matches(line)), line


@pytest.mark.parametrize("line", [
    "--devices cuda:0,cuda:1", "a device", "the first call 0.00-0.60 s", "host time per call 44-88 µs",
    "OUT_DIR", "release", "start_new_session=True", "Shard files carry the hash", "NVIDIA H200",
])
def test_patterns_leave_product_words(line):
    assert not any(_matches(line)), line


@pytest.mark.parametrize("line", [
    "Read-flush timing (since commit 371d19c)", "the flush zero-fills, as before 371d19c",
    "since 175810b earlier winners are found", "before 59f7756 made stage0's products broadcast",
    "until the commit 4be6858", "the seed's dual benchmark",
])
def test_history_patterns_catch_their_examples(line):
    assert any(_matches(line, HISTORY)), line


@pytest.mark.parametrize("line", [
    "measured at 947cd28", "the table of 635d56f", "at commit 0e96d98", "since the hold covers it",
    "before deadbeef", "sampling: seed 3", "the seed of the draw", "One seed's search",
    "before 1000000 calls",
])
def test_history_patterns_leave_provenance_and_product_words(line):
    assert not any(_matches(line, HISTORY)), line


def test_history_is_searched_in_the_product_only():
    assert all(HISTORY_SCOPE.match(p) for p in ("opgen/cli/main.py", "specs/x.yaml", "templates/a/b.j2",
                                                 "scripts/gpu_tune.sh", "docs/OPERATOR.md", "README.md"))
    assert not any(HISTORY_SCOPE.match(p) for p in ("benchmarks/README.md", "benchmarks/h200_x.txt",
                                                     "tests/test_x.py", "records/h200/x.jsonl"))


def test_dates_are_caught_outside_python():
    assert any(_matches("## The runs of 2026-11-30", [DATE]))
