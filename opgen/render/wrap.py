"""Long lines of generated Python wrapped within a width, token by token, so a module built
from long formulas and argument lists still reads as hand-written.

A line breaks only between tokens inside brackets (where Python allows a newline), its
continuation lines indented four spaces past the statement; a long string literal inside brackets
is split at a space into adjacent literals (an f-string only outside its braces); the value of a
long ``return`` or assignment with no brackets to break in is put in parentheses first. Comments
and docstrings are left to the templates. Pure text in, text out; uses nothing from opgen.
"""
from __future__ import annotations

import io
import textwrap
import re
import tokenize

_OPEN, _CLOSE = "([{", ")]}"
_STATEMENT = re.compile(r"^(\s*)(return |[A-Za-z_][A-Za-z0-9_, ]* = )(.*)$")


def wrap_module(text: str, width: int = 100) -> str:
    """``text`` with every code line longer than ``width`` wrapped (lines in triple-quoted
    strings left as they are)."""
    out: list[str] = []
    in_string = False
    for line in text.split("\n"):
        quotes = line.count('"""') % 2 == 1
        if in_string or quotes or len(line) <= width or line.lstrip().startswith("#"):
            out.append(line)
        else:
            out.extend(wrap_line(line, width))
        in_string ^= quotes
    return "\n".join(out)


def wrap_line(line: str, width: int = 100) -> list[str]:
    """One logical line as lines of at most ``width`` where its brackets allow (else unchanged)."""
    indent = line[: len(line) - len(line.lstrip())]
    found = _STATEMENT.match(line)
    source = f"{found.group(2)}({found.group(3)})" if found else line.strip()
    tokens = _tokens(source)
    if tokens is None:
        return [line]
    lines, current, depth = [], indent, 0
    more = indent + "    "
    for token in _keyword_units(tokens):
        for piece in _pieces(token, width - len(more)) if depth > 0 else [token]:
            glue = "" if not current.strip() or _tight(current, piece, depth) else " "
            if depth > 0 and len(current) + len(glue) + len(piece) > width and current.strip():
                lines.append(current)
                current, glue = more, ""
            current += glue + piece
        depth += (token in _OPEN) - (token in _CLOSE)
    lines.append(current)
    return lines if all(len(x) <= width for x in lines) or len(lines) > 1 else [line]


def _keyword_units(tokens: list[str]) -> list[str]:
    """``tokens`` with each keyword argument's ``name=`` joined to the token after it (a line
    never breaks between a name and its value)."""
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if (depth > 0 and i + 2 < len(tokens) and tokens[i + 1] == "=" and t.isidentifier()
                and tokens[i + 2] not in _OPEN + _CLOSE):
            out.append(t + "=" + tokens[i + 2])
            i += 3
            continue
        depth += (t in _OPEN) - (t in _CLOSE)
        if t == "," and out:
            out[-1] += ","  # a line never starts with a comma
        else:
            out.append(t)
        i += 1
    return out


# Python 3.12 tokenizes an f-string into parts (PEP 701); earlier versions give one STRING token
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _tokens(source: str) -> list[str] | None:
    """The tokens of one line of code (an f-string as one token, on every Python version), or None
    if it does not tokenize on its own or its brackets do not balance (a line of a longer
    statement: Python 3.12 tokenizes a closing bracket without its opening one)."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    rows = source.splitlines(True)
    offset = [sum(len(r) for r in rows[:i]) for i in range(len(rows) + 1)]
    out: list[str] = []
    depth, start = 0, 0
    for t in toks:
        if t.type == _FSTRING_START:
            depth += 1
            start = offset[t.start[0] - 1] + t.start[1] if depth == 1 else start
        elif t.type == _FSTRING_END:
            depth -= 1
            if depth == 0:
                out.append(source[start:offset[t.end[0] - 1] + t.end[1]])
        elif depth == 0 and t.string and t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER,
                                                        tokenize.INDENT, tokenize.DEDENT):
            out.append(t.string)
    level = 0
    for t in out:
        level += (t in _OPEN) - (t in _CLOSE)
        if level < 0:
            return None
    return out if level == 0 else None


_KEYWORDS = ("in", "and", "or", "not", "if", "else", "is", "return", "for", "lambda")
# a sign that follows an operator, a bracket, a comma or a keyword: unary, written tight
_UNARY = re.compile(r"(^|[(\[{,=+\-*/%<>:]|\b(?:return|and|or|not|in|if|else|is))\s*[-+~]$")


def _tight(current: str, piece: str, depth: int) -> bool:
    """Whether ``piece`` follows the text so far without a space (as a formatter writes it);
    ``=`` is tight only as a keyword argument (inside brackets)."""
    last = current[-1]
    word = re.search(r"[A-Za-z_]+$", current)
    if piece == ":" and last == ",":
        return False
    if last in "-+~" and _UNARY.search(current):
        return True
    if piece[0] in ",:)]}" or last in "([{" or piece == ".":
        return True
    if piece in "([" and word is not None and word.group(0) in _KEYWORDS:
        return False
    if last == "." or (piece in "([" and (last.isalnum() or last in "_)]'\"")):
        return True
    if depth == 0:
        return False
    return (last == "=" and not current.endswith((" =", "==", "<=", ">=", "!="))) \
        or (piece == "=" and (last.isalnum() or last == "_"))


def _pieces(token: str, room: int) -> list[str]:
    """A string literal longer than ``room`` as adjacent literals split at spaces (an f-string
    only outside braces); any other token whole."""
    match = re.match(r"^([rRbBfF]*)(['\"])(.*)\2$", token, re.S)
    if match is None or len(token) <= room or match.group(2) * 3 in token:
        return [token]
    prefix, quote, body = match.groups()
    parts, start, depth, cut = [], 0, 0, None
    for i, ch in enumerate(body):
        depth += (ch == "{") - (ch == "}") if "f" in prefix.lower() else 0
        if len(prefix) + 2 + i + 1 - start > room - 1 and cut is not None:
            parts.append(body[start:cut])
            start, cut = cut, None
        if ch == " " and depth == 0:
            cut = i + 1
    parts.append(body[start:])
    return [f"{prefix}{quote}{p}{quote}" for p in parts if p]


def wrap_prose(text: str, width: int = 100) -> str:
    """``text`` with long comments and docstring lines filled within ``width`` words at a time:
    a comment line in place, a trailing comment moved onto its own lines above its code (then
    wrapped as :func:`wrap_line` does), a docstring line at its own indentation. A word longer
    than the room is left whole."""
    out: list[str] = []
    in_string = False
    for line in text.split("\n"):
        quotes = line.count('"""') % 2 == 1
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if len(line) <= width:
            out.append(line)
        elif in_string and not quotes:
            out.extend(_fill(indent, "", stripped, width))
        elif in_string and stripped.endswith('"""') and stripped.count('"""') == 1:
            body = _fill(indent, "", stripped[:-3], width - 3)
            out.extend(body[:-1] + [body[-1] + '"""'])
        elif not in_string and quotes and stripped.startswith('"""'):
            body = _fill(indent, "", stripped[3:], width - 3)
            out.extend([indent + '"""' + body[0].lstrip()] + body[1:])
        elif not in_string and stripped.startswith('"""') and stripped.endswith('"""') and len(stripped) > 6:
            body = _fill(indent, "", stripped[3:-3], width - 6)
            body[0] = indent + '"""' + body[0].lstrip()
            out.extend(body[:-1] + [body[-1] + '"""'])
        elif not in_string and stripped.startswith("#"):
            out.extend(_fill(indent, "# ", stripped.lstrip("#").strip(), width))
        elif not in_string and not quotes and (split := _trailing_comment(line)) is not None:
            code, comment = split
            out.extend(_fill(indent, "# ", comment, width))
            out.extend([code] if len(code) <= width else wrap_line(code, width))
        else:
            out.append(line)
        in_string ^= quotes
    return "\n".join(out)


def _fill(indent: str, marker: str, words: str, width: int) -> list[str]:
    """``words`` as lines of ``indent + marker + text`` within ``width``."""
    room = max(width - len(indent) - len(marker), 20)
    pieces = textwrap.wrap(words, room, break_long_words=False, break_on_hyphens=False) or [""]
    return [(indent + marker + p).rstrip() for p in pieces]


def _trailing_comment(line: str) -> tuple[str, str] | None:
    """(code, comment text) of a line of code that ends in a comment, or None."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    comments = [t for t in toks if t.type == tokenize.COMMENT]
    if len(comments) != 1:
        return None
    start = len(line) - len(line.lstrip()) + comments[0].start[1]
    code = line[:start].rstrip()
    return (code, comments[0].string.lstrip("#").strip()) if code.strip() else None


def wrap_statements(text: str, width: int = 100) -> str:
    """``text`` with every statement that spans several lines, one of them longer than ``width``,
    joined and wrapped again as :func:`wrap_line` does (statements with comments, backslashes
    or multi-line strings left as they are)."""
    lines = text.split("\n")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text
    spans: list[tuple[int, int]] = []
    first, clean, fstring_row = None, True, 0
    for tok in tokens:
        if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENCODING, tokenize.ENDMARKER) and first is None:
            continue
        if first is None:
            first, clean = tok.start[0], True
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start[0] != tok.end[0]):
            clean = False
        if tok.type == _FSTRING_START:
            fstring_row = tok.start[0]
        if tok.type == _FSTRING_END and tok.end[0] != fstring_row:  # an f-string over several lines
            clean = False
        if tok.type == tokenize.NEWLINE:
            last = tok.start[0]
            rows = range(first - 1, last)
            if (clean and last > first and any(len(lines[r]) > width for r in rows)
                    and not any(lines[r].rstrip().endswith("\\") for r in rows)):
                spans.append((first - 1, last))
            first = None
    for start, end in reversed(spans):
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        joined = indent + " ".join(lines[r].strip() for r in range(start, end))
        lines[start:end] = wrap_line(joined, width)
    return "\n".join(lines)


def wrap_source(text: str, width: int = 100) -> str:
    """A generated module with every line within ``width``: code lines, then statements that
    span lines, then comments and docstrings."""
    return wrap_prose(wrap_statements(wrap_module(text, width), width), width)
