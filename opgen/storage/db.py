"""What the campaign storage (``storage``) and its PostgreSQL tables (``claims``, ``db_records``)
share: how a storage URL is told apart and shown, how a process and a database error are named,
the advisory lock key of a name and an engine that survives a server restart.

Uses ``options`` (to mask passwords).
"""
from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

from ..options import masked


def is_url(where: str) -> bool:
    """Whether ``where`` is an RDB URL rather than a journal file."""
    return "://" in where


def is_postgres(where: str) -> bool:
    """Whether ``where`` is a PostgreSQL URL (a storage several hosts may share)."""
    return where.split("://", 1)[0].split("+", 1)[0] == "postgresql"


def shown(where: str) -> str:
    """``where`` as messages print it: an URL without its password."""
    if not is_url(where):
        return where
    from sqlalchemy.engine import make_url

    try:  # a password in the URL's query too
        return masked(make_url(where).render_as_string(hide_password=True))
    except Exception:  # an URL SQLAlchemy cannot parse is shown as given, up to its password
        return masked(where.split("@")[-1])


def worker_id() -> str:
    """This process as trials and claims name it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def first_line(exc: BaseException) -> str:
    """The first line of a database error's message (the driver's own words)."""
    cause = getattr(exc, "orig", None) or exc.__cause__ or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


def advisory_key(name: str) -> int:
    """A PostgreSQL advisory lock key (a signed 64-bit integer) for ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def engine(url: str) -> Any:
    """An SQLAlchemy engine on ``url`` that checks a pooled connection before using it, so the
    first statement after a server restart reconnects instead of failing."""
    import sqlalchemy

    return sqlalchemy.create_engine(url, pool_pre_ping=True)
