"""What the command line takes: argument types that refuse a value before any work begins.

Each type turns the option's text into its value or raises ``argparse.ArgumentTypeError`` saying
what it expected; argparse prints that after the option's name (``opgen tune: error: argument
--trials: expected an integer >= 0, got '-5'``) and exits with status 2, on a dry run too. Paths
are checked for their kind before anything opens them: a file to read must be a regular file, a
file to write must be one or not exist yet, in a folder that can be made and written, and a link
that loops or leads nowhere is named as such. Every message masks the password of an URL
(:func:`masked`), argparse's own too (:class:`Parser`). Imports nothing from opgen.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import stat
from pathlib import Path
from typing import Callable

# The password of an URL runs to its last '@' (one holding a raw '@' is masked whole), and a
# ``password=`` parameter of its query to the next separator. An URL taken for a path has one slash
# after its scheme (``postgresql:/user:password@host``): masked too.
_CREDENTIALS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*:/+[^\s:/@'\"]*:)[^\s'\"]*@")
_QUERY_PASSWORD = re.compile(r"([?&;]password=)[^\s&;'\"]*", re.IGNORECASE)


def masked(text: str) -> str:
    """``text`` with the password of every URL in it shown as ``***``, in its user part or its
    query (``?password=``)."""
    return _QUERY_PASSWORD.sub(r"\1***", _CREDENTIALS.sub(r"\1***@", text))


class Parser(argparse.ArgumentParser):
    """argparse's parser, its error messages (which quote the values given) masked."""

    def error(self, message: str):  # type: ignore[override]
        super().error(masked(message))


def _refuse(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(masked(f"expected {expected}, got {text!r}"))


def integer(low: int, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An integer of ``[low, high]`` (``high`` None: no upper bound); ``why`` tells, in the
    message, why the bound is there."""
    expected = (f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]") + (
        f" ({why})" if why else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _refuse(expected, text) from None
        if value < low or (high is not None and value > high):
            raise _refuse(expected, text)
        return value
    parse.__name__ = "integer"
    return parse


def number(low: float, high: float = math.inf, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float]:
    """A finite number of the range from ``low`` to ``high``, each end closed unless ``*_open``."""
    if high == math.inf:
        expected = f"a finite number {'>' if low_open else '>='} {low:g}"
    else:
        expected = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _refuse(expected, text) from None
        if (not math.isfinite(value) or value < low or value > high or (low_open and value == low)
                or (high_open and value == high)):
            raise _refuse(expected, text)
        return value
    parse.__name__ = "number"
    return parse


positive_int = integer(1)
non_negative_int = integer(0)
seconds = number(0.0, low_open=True)
"""A finite number of seconds > 0."""
non_negative = number(0.0)
share = number(0.0, 1.0)
"""A share in [0, 1]."""
part = number(0.0, 1.0, high_open=True)
"""A share split off the whole, in [0, 1)."""
fraction = number(0.0, 1.0, low_open=True)
"""A fraction of a whole that leaves some, in (0, 1]."""


def date(text: str) -> str:
    """A date as records stamp it: ``YYYY-MM-DD``, a day of the calendar."""
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        raise _refuse("a date YYYY-MM-DD", text) from None
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise _refuse("a date YYYY-MM-DD", text)
    return text


_DEVICE = re.compile(r"[a-z][a-z0-9_]*(:\d{1,6})?")


def device(text: str) -> str:
    """A torch device name as written: a type and optionally ``:`` and an index (``cuda:0``, ``cpu``)."""
    if not _DEVICE.fullmatch(text.strip()):
        raise _refuse("a device name (cuda:0, npu:1, cpu)", text)
    return text.strip()


def device_list(text: str) -> str:
    """Comma-separated device names, none empty and none twice (``cuda:0,cuda:1``): two shards on
    one device would time each other's kernels."""
    if not text.strip() or any(not _DEVICE.fullmatch(d.strip()) for d in text.split(",")):
        raise _refuse("comma-separated device names (cuda:0,cuda:1), none empty", text)
    return _once([d.strip() for d in text.split(",")], text)


def names(text: str) -> str:
    """Comma-separated names, none empty and none twice (``good,wrong``): an empty list is no
    shorthand for all of them."""
    items = [n.strip() for n in text.split(",")]
    if not all(items):
        raise _refuse("comma-separated names, none empty", text)
    return _once(items, text)


def _once(items: list[str], text: str) -> str:
    """``items`` joined by commas; refused where one is given twice."""
    twice = sorted({n for n in items if items.count(n) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} given twice in {text!r}")
    return ",".join(items)


def _kinds(mode: int) -> str:
    """What a file is, as a message names it."""
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "no file nor folder"


def _stat(text: str) -> os.stat_result | None:
    """What is at ``text`` (links followed), or None where nothing is.

    Raises:
        ArgumentTypeError: a link that loops or leads nowhere, a path through a file, no permission.
    """
    try:
        return os.stat(text)
    except FileNotFoundError:
        if os.path.islink(text):
            raise argparse.ArgumentTypeError(f"{text} is a link to nothing ({os.readlink(text)})") from None
        return None
    except OSError as exc:  # a loop of links, a file where a folder should be, no permission
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror.lower()}") from None


def _path(text: str, folder: bool, access: int, new: bool) -> str:
    """``text`` where it names a regular file (``folder``: a folder) this process may ``access``,
    or (``new``) nothing yet, in a folder where it can be made."""
    found = _stat(text)
    want = "a folder" if folder else "a file"
    if found is None:
        if not new:
            raise argparse.ArgumentTypeError(f"no such {want[2:]}: {text}")
        _can_make(text)
    elif not (stat.S_ISDIR if folder else stat.S_ISREG)(found.st_mode):
        raise argparse.ArgumentTypeError(f"{text} is {_kinds(found.st_mode)}, not {want}")
    elif not os.access(text, access):
        raise argparse.ArgumentTypeError(f"{text}: no permission to {'read' if access == os.R_OK else 'write'} it")
    return text


def file_to_read(text: str) -> str:
    """An existing regular file (a link to one will do)."""
    return _path(text, False, os.R_OK, new=False)


def file_to_write(text: str) -> str:
    """A regular file that can be written, or a path where one can be made."""
    return _path(text, False, os.W_OK, new=True)


def folder_to_write(text: str) -> str:
    """A folder that can be written in, or a path where one can be made."""
    return _path(text, True, os.W_OK | os.X_OK, new=True)


def _can_make(text: str) -> None:
    """Refuse a path whose nearest existing folder above it is a file or cannot be written."""
    above = Path(text).absolute().parent
    while (found := _stat(str(above))) is None:
        above = above.parent
    if not stat.S_ISDIR(found.st_mode):
        raise argparse.ArgumentTypeError(f"cannot make {text}: {above} is {_kinds(found.st_mode)}")
    if not os.access(above, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot make {text}: no permission to write in {above}")


def database_url(text: str) -> str:
    """A database URL (``postgresql://user:password@host/db``): one '@' at most before its query
    (an '@' of a user or password written ``%40``, else the driver would take part of the
    password for the host and print it)."""
    if "://" not in text:
        raise _refuse("a database URL (postgresql://user:password@host/db)", text)
    if text.split("?", 1)[0].count("@") > 1:
        raise argparse.ArgumentTypeError(masked(f"{text}: more than one '@' before the host (write an '@' of "
                                                "the user or password as %40)"))
    return text


def storage(text: str) -> str:
    """An optuna storage to tune in: a database URL (:func:`database_url`; an SQLite one naming a
    file that can be written or made), or a journal file to write (:func:`file_to_write`)."""
    if "://" not in text:
        return file_to_write(text)
    database_url(text)
    if (path := sqlite_path(text)) not in (None, "", ":memory:"):
        file_to_write(path)
    return text


def sqlite_path(url: str) -> str | None:
    """The file an SQLite URL names ("" or ":memory:" for an in-memory database; None for another
    database); the storage opens the same file (``opgen.storage.storage``)."""
    if url.split("+", 1)[0].split("://", 1)[0] != "sqlite":
        return None
    return url.split("://", 1)[1].split("?", 1)[0].removeprefix("/")


def storage_to_read(text: str) -> str:
    """An optuna storage to read: a database URL (:func:`database_url`; an SQLite one naming an
    existing file, which it would otherwise make empty), or an existing journal file
    (:func:`file_to_read`)."""
    if "://" not in text:
        return file_to_read(text)
    database_url(text)
    if (path := sqlite_path(text)) is not None:
        if path in ("", ":memory:"):
            raise _refuse("an SQLite URL naming a database file (sqlite:///path)", text)
        file_to_read(path)
    return text
