"""Generated Python laid out by black, used as a library: the version pinned in pyproject.toml and
one fixed mode (:data:`MODE`), so the same source always gives the same bytes.

Black lays out code only: it changes no statement (the syntax tree is the same, docstrings' indent
aside) and splits no comment, docstring or string. Then the prose black leaves past the width is
filled (:func:`fill_prose`): a comment on a line of its own and each docstring line, a word at a
time at their own indentation, which black keeps as they are. A long trailing comment or string
literal stays longer than the width. A formatted text is kept in memory and, where the folder can
be written, on disk under :func:`cache_dir` (named by a hash of black's version, the mode and the
text), since black takes seconds over an op's kernel modules. Uses nothing from opgen.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import io
import os
import tempfile
import textwrap
import tokenize
from pathlib import Path

import black

WIDTH = 100
"""The line length every generated module is formatted to."""

MODE = black.Mode(line_length=WIDTH, target_versions={black.TargetVersion.PY310}, magic_trailing_comma=False)
"""Black's mode for generated modules: the width, Python 3.10 (the oldest Python opgen supports),
and a trailing comma left by a template no reason to keep a bracket split."""


def cache_dir() -> Path:
    """Where formatted texts are kept: ``$OPGEN_FORMAT_CACHE``, else ``opgen/black`` under the
    user's cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    named = os.environ.get("OPGEN_FORMAT_CACHE")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opgen" / "black"


def _key(text: str, width: int) -> str:
    mode = f"{black.__version__}\0{width}\0{sorted(v.name for v in MODE.target_versions)}\0{MODE.magic_trailing_comma}"
    return hashlib.sha256(f"{mode}\0{text}".encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=4096)
def format_source(text: str, width: int = WIDTH) -> str:
    """``text``, valid Python, as black lays it out within ``width``, its prose filled
    (:func:`fill_prose`).

    Raises:
        black.InvalidInput: where ``text`` is not Python black parses.
    """
    path = cache_dir() / _key(text, width)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    mode = MODE if width == WIDTH else black.Mode(line_length=width, target_versions=MODE.target_versions,
                                                  magic_trailing_comma=MODE.magic_trailing_comma)
    out = fill_prose(black.format_str(text, mode=mode), width)
    _store(path, out)
    return out


def _store(path: Path, text: str) -> None:
    """Keep ``text`` at ``path``, written whole or not at all (a folder that cannot be written is
    no error: the cache only saves time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass


def fill_prose(text: str, width: int = WIDTH) -> str:
    """``text`` with every comment line of its own and every docstring line (a string statement's
    line: a module's, class's or function's docstring, or an attribute's) longer than ``width``
    filled within it, a word at a time at the line's own indentation (a longer word stays whole)."""
    lines = text.split("\n")
    long = {i for i, line in enumerate(lines) if len(line) > width}
    if not long:
        return text
    prose = _comment_lines(text) | _docstring_lines(text)
    out: list[str] = []
    for i, line in enumerate(lines):
        if i not in long or i not in prose:
            out.append(line)
            continue
        body = line.lstrip()
        indent = line[: len(line) - len(body)]
        marker = "# " if body.startswith("#") else ""
        words = body.lstrip("#").strip() if marker else body
        room = max(width - len(indent) - len(marker), 20)
        pieces = textwrap.wrap(words, room, break_long_words=False, break_on_hyphens=False) or [""]
        out.extend((indent + marker + piece).rstrip() for piece in pieces)
    return "\n".join(out)


def _comment_lines(text: str) -> set[int]:
    """Indices of the lines that hold a comment and nothing else."""
    out = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip():
            out.add(tok.start[0] - 1)
    return out


def _docstring_lines(text: str) -> set[int]:
    """Indices of the lines of triple-quoted plain string statements (docstrings)."""
    lines = text.split("\n")
    out: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            continue
        first, last = node.lineno - 1, node.end_lineno - 1
        opening = lines[first][node.col_offset: node.col_offset + 3]
        if opening in ('"""', "'''") and lines[last].rstrip().endswith(opening):
            out.update(range(first, last + 1))
    return out
