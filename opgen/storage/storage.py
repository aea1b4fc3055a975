"""Where a campaign's optuna studies live, and how several processes open it safely.

- A journal file (the default) or an SQLite URL holds one campaign at a time: the process takes
  a lock file next to it (``<file>.tuner.lock``) for its whole life and a second one is refused,
  naming the holder's pid. The shares of one split (``--shard K/N``, as ``--devices`` starts
  them) work on disjoint buckets and share it: each holds its own share's lock, and shares of
  another N are refused.
- A PostgreSQL URL is shared by any number of processes (hosts): optuna's schema and opgen's own
  tables are created once, under a PostgreSQL advisory lock; each running trial beats optuna's
  heartbeat, and a trial whose process died is failed once its heartbeat is older than the grace
  period and queued again (``RetryHeartbeatStaleTrialCallback``). Buckets are claimed
  (``opgen.storage.claims``) and records are kept in the database (``opgen.storage.db_records``).
- Any other RDB URL is opened as it is: hosts sharing it must split the work with ``--shard``.

Uses ``db``, ``errors``, ``options`` (the SQLite file a URL names); ``claims`` and ``db_records``
for their tables.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator

from ..errors import OpgenError, StorageError
from ..options import sqlite_path
from . import claims, db_records
from .db import advisory_key, engine, first_line, is_postgres, is_url, shown

HEARTBEAT_SECONDS = 10
"""Seconds between two heartbeats of a running trial on a PostgreSQL storage (``--heartbeat``)."""
_GRACE = 3  # heartbeats a trial may miss before it counts as dead
_HELD: dict[Path, int] = {}  # lock files this process holds (path -> fd), kept until it exits


def open_storage(where: str, shard: tuple[int, int] | None = None,
                 heartbeat: int = HEARTBEAT_SECONDS) -> Any:
    """An optuna storage: a journal file, or an RDB URL (``sqlite:///x.db``, ``postgresql://...``).

    ``shard`` (K, N) is this process's share of the buckets, if any; ``heartbeat`` the seconds
    between heartbeats of a running trial on PostgreSQL.

    Raises:
        StorageError: the journal or SQLite file is in use by another campaign, or the database
            cannot be reached.
        OpgenError: a malformed journal (:func:`mend_journal`).
    """
    import optuna

    if is_postgres(where):
        return _open_postgres(where, heartbeat)
    if is_url(where):
        path = _sqlite_file(where)
        if path is None:
            return _rdb(where, optuna.storages.RDBStorage, where)
        hold_campaign_lock(path, shard)
        with _file_mutex(path.with_name(path.name + ".open.lock")):  # one schema creation at a time
            return _rdb(where, optuna.storages.RDBStorage, where)
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    Path(where).parent.mkdir(parents=True, exist_ok=True)
    hold_campaign_lock(Path(where), shard)
    lock = JournalFileSymlinkLock(where)  # the lock optuna's writers take
    lock.acquire()
    try:
        if mend_journal(Path(where)):
            print(f"opgen tune: {where}: cut its torn last line (a run died writing it); the trial it "
                  "belonged to is measured again", file=sys.stderr)
    finally:
        lock.release()
    return optuna.storages.JournalStorage(JournalFileBackend(where, lock))


def _rdb(where: str, make: Any, *args: Any, **kwargs: Any) -> Any:
    """``make(*args, **kwargs)``, an unreachable database or a missing driver named as a StorageError."""
    import sqlalchemy.exc

    try:
        return make(*args, **kwargs)
    except sqlalchemy.exc.OperationalError as exc:
        raise StorageError(f"cannot reach {shown(where)}: {first_line(exc)}") from None
    except sqlalchemy.exc.ArgumentError as exc:  # an unknown dialect, a malformed URL
        raise StorageError(f"{shown(where)} is not a database URL SQLAlchemy can open: {exc}") from None
    except ImportError as exc:
        hint = " (pip install 'psycopg[binary]')" if is_postgres(where) else ""
        raise StorageError(f"{shown(where)} needs a database driver this Python lacks{hint}: {exc}") from None


@contextlib.contextmanager
def storage_errors(where: str) -> Iterator[None]:
    """Turn a database failure inside (the server gone or restarting mid-campaign) into a
    StorageError that names the storage and says how to resume."""
    import optuna
    import sqlalchemy.exc

    try:
        yield
    except (sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError) as exc:
        raise StorageError(f"lost {shown(where)} mid-campaign ({first_line(exc)}); the campaign stopped: run "
                           "the same command again to resume it (every recorded trial is kept, the one cut "
                           "off is measured again)") from None


def _sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL (None for an in-memory or non-SQLite database), as the command
    line's check of the URL reads it (:func:`opgen.options.sqlite_path`)."""
    path = sqlite_path(url)
    return None if path in (None, "", ":memory:") else Path(path).resolve()


# --- journal and SQLite files: one campaign (or the shares of one split) at a time -------------
def hold_campaign_lock(target: Path, shard: tuple[int, int] | None = None) -> None:
    """Hold, until this process exits, the lock that keeps other campaigns off ``target`` (a
    journal or SQLite file): exclusive without ``shard``; with it, shared by the shares of one
    split, each share exclusive.

    Raises:
        StorageError: another process holds it, naming that process and what to do.
    """
    target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    main = target.with_name(target.name + ".tuner.lock")
    advice = ("one campaign at a time on a journal or SQLite file: wait for it to finish, or share "
              "the work between hosts through a PostgreSQL --storage")
    if shard is None:
        if not _lock(main, exclusive=True):
            held = _holders(target) or [_owner(main)]
            raise StorageError(f"{target} is in use by another opgen tune ({', '.join(held)}); {advice}")
        return
    k, n = shard
    if not _lock(main, exclusive=False):
        raise StorageError(f"{target} is in use by another opgen tune ({_owner(main)}); {advice}")
    others = [h for h in _holders(target) if f" of {n})" not in h]
    if others:
        raise StorageError(f"{target} is in use by shares of another split ({', '.join(others)}); "
                           f"--shard {k}/{n} would measure their buckets again: use their N")
    mine = target.with_name(f"{target.name}.shard-{k}-of-{n}.lock")
    if not _lock(mine, exclusive=True):
        raise StorageError(f"share {k}/{n} of {target} is already being tuned ({_owner(mine)})")


def _lock(path: Path, exclusive: bool) -> bool:
    """Take ``path``'s flock without waiting (kept until exit) and write this process into it."""
    if path in _HELD:
        return True
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    if exclusive:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    _HELD[path] = fd
    return True


def _owner(path: Path) -> str:
    """Who holds a lock file, as it wrote itself in."""
    try:
        return path.read_text().strip() or "a process starting up"
    except OSError:
        return "a process"


def _holders(target: Path) -> list[str]:
    """The shares holding their locks on ``target``: ``pid P on H (share K of N)``."""
    out = []
    for path in sorted(target.parent.glob(f"{target.name}.shard-*-of-*.lock")):
        if path in _HELD:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            k, _, n = path.name[len(target.name) + len(".shard-"):-len(".lock")].partition("-of-")
            out.append(f"{_owner(path)} (share {k} of {n})")
        finally:
            os.close(fd)
    return out


@contextlib.contextmanager
def _file_mutex(path: Path) -> Iterator[None]:
    """A short critical section between processes (waits for the holder)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def mend_journal(path: Path) -> bool:
    """Check an optuna journal file before it is opened (under its lock): end it with a newline,
    cutting a torn last line, as :func:`opgen.storage.records.append` does for records. Optuna's reader
    skips such a line, but its next append would join it and leave a malformed line for good.

    Returns:
        Whether a torn line was cut.

    Raises:
        OpgenError: a malformed line before the last, naming the file and what to do.
    """
    if not path.exists():
        return False
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty unless the last line is torn
    for n, line in enumerate(lines, 1):
        try:
            json.loads(line)
        except ValueError as exc:
            raise OpgenError(f"{path}:{n}: not a journal line ({exc}); optuna cannot resume from it: move "
                             "it aside to start the studies afresh (the records keep every measured trial)") from None
    if not tail:
        return False
    with open(path, "r+b") as f:
        try:
            json.loads(tail)
        except ValueError:
            f.truncate(len(data) - len(tail))
            cut = True
        else:
            f.seek(0, 2)
            f.write(b"\n")
            cut = False
        f.flush()
        os.fsync(f.fileno())
    return cut


# --- PostgreSQL: shared by hosts ---------------------------------------------------------------
def _open_postgres(url: str, heartbeat: int) -> Any:
    """Optuna's RDB storage on PostgreSQL with heartbeats, every table created once."""
    import optuna
    import sqlalchemy

    if heartbeat < 1:
        raise StorageError(f"--heartbeat must be a whole number of seconds >= 1, got {heartbeat}")
    schema = _rdb(url, engine, url)
    key = {"k": advisory_key("opgen schema")}
    try:
        # the first to come creates the tables, the others wait
        with schema.connect() as conn, warnings.catch_warnings():
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), key)
            conn.commit()
            try:
                warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats
                storage = optuna.storages.RDBStorage(
                    url, engine_kwargs={"pool_pre_ping": True}, heartbeat_interval=heartbeat,
                    grace_period=_GRACE * heartbeat,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3))
                claims.create_table(conn)
                db_records.create_table(conn)
                conn.commit()
            finally:
                conn.rollback()
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), key)
                conn.commit()
    except sqlalchemy.exc.OperationalError as exc:
        raise StorageError(f"cannot reach {shown(url)}: {first_line(exc)}") from None
    finally:
        schema.dispose()
    return storage


def heartbeat_seconds(storage: Any) -> int | None:
    """The storage's heartbeat interval (None: no heartbeat, as on a journal)."""
    interval = getattr(storage, "get_heartbeat_interval", None)
    return interval() if interval is not None else None


class Heartbeat:
    """Beats the heartbeat of the trials a process runs, from a thread of its own, every interval.

    A beat that fails (the server restarting) is tried again at the next interval; a trial stops
    beating when it is told, or when the process dies.
    """

    def __init__(self, storage: Any, seconds: int) -> None:
        self.storage, self.seconds = storage, seconds
        self.trials: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="opgen-heartbeat", daemon=True)
        self._thread.start()

    def add(self, trial_id: int) -> None:
        """Beat for ``trial_id`` now, then every interval."""
        self.trials.add(trial_id)
        self._beat(trial_id)

    def discard(self, trial_id: int) -> None:
        self.trials.discard(trial_id)

    def _beat(self, trial_id: int) -> None:
        try:
            self.storage.record_heartbeat(trial_id)
        except Exception:  # the next beat tries again; a trial missing too many is retried elsewhere
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            for trial_id in list(self.trials):
                self._beat(trial_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
