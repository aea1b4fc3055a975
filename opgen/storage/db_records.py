"""Records of a campaign whose studies live in PostgreSQL: kept in the same database, then exported
to the records file the build reads.

The hosts sharing a campaign append every trial, winner and cross-check to one table,
``opgen_records`` (a row per record line, with its op and chip; a serial id orders the rows,
committed one writer at a time, so a reader never sees a row without those before it). So the
records of a campaign are one sequence, in the order one host measuring the same points would
have written them, and no host's file needs merging: what one host freezes from it is what any
other would. :func:`export` appends to a records file the lines of the table it does not hold
yet, in table order and under the file's lock: run on any host, any number of times, it loses
nothing and adds nothing twice. A trial is in the table only once measured (a process killed
mid-trial leaves nothing), and once (the studies never measure a recorded point again).
Uses ``db``, ``errors``, ``records``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..errors import StorageError
from .db import advisory_key, engine, first_line, shown
from .records import Record, append_missing, from_line

TABLE = "opgen_records"


def create_table(conn: Any) -> None:
    """Create the records table (under the caller's schema lock)."""
    import sqlalchemy

    conn.execute(sqlalchemy.text(
        f"CREATE TABLE IF NOT EXISTS {TABLE} (id BIGSERIAL PRIMARY KEY, op TEXT NOT NULL, "
        "chip TEXT NOT NULL, line TEXT NOT NULL)"))
    conn.execute(sqlalchemy.text(f"CREATE INDEX IF NOT EXISTS {TABLE}_op_chip ON {TABLE} (op, chip, id)"))


def _holds(conn: Any, pid: int, key: int) -> bool:
    """Whether the server process ``pid`` holds the connection-level advisory lock ``key``
    (pg_try_advisory_lock's; pg_locks shows a bigint key as its high and low 32 bits, unsigned,
    with objsubid 1)."""
    import sqlalchemy

    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return bool(conn.execute(sqlalchemy.text(
        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = :pid AND objsubid = 1 "
        "AND classid::bigint = :hi AND objid::bigint = :lo"),
        {"pid": pid, "hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF}).first())


class RecordTable:
    """The records table of the PostgreSQL storage ``url``."""

    def __init__(self, url: str, campaign: bool = True) -> None:
        """``campaign``: a tuning campaign's table (a failure stops it: the message says how to
        resume), else a reader's (``records --pull``: the message says nothing was read)."""
        self.url = url
        self.campaign = campaign
        self._engine = engine(url)

    def _run(self, fn: Any) -> Any:
        import sqlalchemy.exc

        try:
            with self._engine.begin() as conn:
                return fn(conn)
        except sqlalchemy.exc.DBAPIError as exc:
            then = ("the campaign stopped: run the same command again to resume it (every recorded trial "
                    "is kept, the one cut off is measured again)" if self.campaign else
                    "nothing was read (check that the server is up and the URL names it)")
            raise StorageError(f"the records table of {shown(self.url)}: {first_line(exc)}; {then}") from None

    def append(self, records: Iterable[Record], holder: tuple[int, int] | None = None) -> None:
        """Append records, in order, in one transaction; with ``holder`` (a claim's server process
        and advisory key, ``Claims.holder``) only while that process holds that lock, else
        StorageError and nothing written."""
        import sqlalchemy

        rows = [{"op": r.op, "chip": r.chip, "line": r.line()} for r in records]

        def insert(conn: Any) -> None:  # one writer at a time: ids are committed in their order, so
            # a reader never sees a later row without the earlier ones
            conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(TABLE)})
            if holder is not None and not _holds(conn, *holder):
                raise StorageError(f"{shown(self.url)}: this process's claim on the bucket was lost before its "
                                   "winner was recorded (nothing written); the campaign stopped: run the same "
                                   "command again to resume it")
            conn.execute(sqlalchemy.text(f"INSERT INTO {TABLE} (op, chip, line) VALUES (:op, :chip, :line)"), rows)
        if rows:
            self._run(insert)

    def read(self, op: str, chip: str) -> list[Record]:
        """Every record of ``op`` on ``chip``, in the order they were committed (none in a
        database no campaign has opened: it has no records table)."""
        import sqlalchemy

        rows = self._run(lambda conn: conn.execute(sqlalchemy.text(
            f"SELECT id, line FROM {TABLE} WHERE op = :op AND chip = :chip ORDER BY id"),
            {"op": op, "chip": chip}).all() if _exists(conn) else [])
        return [from_line(line, f"{shown(self.url)} {TABLE} row {id_}", op=op, chip=chip) for id_, line in rows]

    def held(self) -> list[tuple[str, str, int]]:
        """(op, chip, how many records) of each op and chip the table holds records of, in name
        order (none without the table)."""
        import sqlalchemy

        return [tuple(row) for row in self._run(lambda conn: conn.execute(sqlalchemy.text(
            f"SELECT op, chip, count(*) FROM {TABLE} GROUP BY op, chip ORDER BY op, chip")).all()
            if _exists(conn) else [])]

    def trial(self, op: str, chip: str, study: str, number: int) -> list[Record]:
        """The trial records of trial ``number`` of ``study`` (one per case; none if unrecorded):
        a trial recorded by a process that died before marking it measured in its study."""
        import sqlalchemy

        rows = self._run(lambda conn: conn.execute(sqlalchemy.text(
            f"SELECT id, line FROM {TABLE} WHERE op = :op AND chip = :chip AND line::jsonb ->> 'kind' = 'trial' "
            "AND line::jsonb ->> 'study' = :study AND (line::jsonb ->> 'trial')::bigint = :n ORDER BY id"),
            {"op": op, "chip": chip, "study": study, "n": number}).all())
        return [from_line(line, f"{shown(self.url)} {TABLE} row {id_}", op=op, chip=chip) for id_, line in rows]

    def close(self) -> None:
        self._engine.dispose()


def _exists(conn: Any) -> bool:
    """Whether the database holds the records table (a campaign on it created it)."""
    import sqlalchemy

    return conn.execute(sqlalchemy.text("SELECT to_regclass(:t)"), {"t": TABLE}).scalar() is not None


def export(url: str, path: Path, op: str, chip: str, required: bool = False) -> tuple[int, int]:
    """Append to the records file ``path`` the records of ``op`` on ``chip`` that the storage
    holds and the file does not, in the storage's order.

    Returns:
        (records in the storage, records appended).

    Raises:
        StorageError: with ``required``, where the storage holds no record of ``op`` on ``chip``
            (nothing appended), naming the ops and chips it holds records of.
    """
    table = RecordTable(url, campaign=False)
    try:
        found = table.read(op, chip)
        if required and not found:
            held = table.held()
            what = ("; it holds records of " + ", ".join(f"{o} on {c} ({n})" for o, c, n in held) if held
                    else "; no campaign has recorded any there")
            raise StorageError(f"{shown(url)} holds no records of {op} on {chip}{what}: nothing to pull "
                               "(check the URL, the op and --chip)")
    finally:
        table.close()
    return len(found), append_missing(path, found)
