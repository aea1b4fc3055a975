"""Buckets claimed by the processes (hosts) sharing a campaign through a PostgreSQL storage: one
process searches a bucket at a time, and the bucket of a process that died is taken over.

A claim is a PostgreSQL advisory lock (``pg_try_advisory_lock``) held by a connection of its
own, which the server drops the moment the process dies: no timeout to wait for. A row of
``opgen_claims`` says whether the last holder finished the bucket (``done``, and when) or was
still at it (``running``, and where the records table stood then). A process skips a bucket
finished since it started (by a process of the same campaign); one that finds a bucket claimed
comes back to it after its own buckets, waits for the claim, and searches the bucket only if its
holder stopped before finishing; its studies then resume what the holder measured. A holder that
stopped between recording the bucket's winner and saying so finished it. The winner is written
only while the claim holds (the records table checks the lock in the writing transaction): a
holder whose claim went with its connection (a server restart) writes none, so the process that
takes the bucket over decides it alone. A lost connection loses the claims with it, so it ends
the campaign with a :class:`~opgen.errors.StorageError` (running the command again resumes it).
Uses ``db``, ``db_records``, ``errors``.
"""
from __future__ import annotations

import time
from typing import Any

from ..errors import StorageError
from .db import advisory_key, first_line, shown, worker_id
from .db_records import TABLE as RECORDS

TABLE = "opgen_claims"


def create_table(conn: Any) -> None:
    """Create the claims table (under the caller's schema lock)."""
    import sqlalchemy

    conn.execute(sqlalchemy.text(
        f"CREATE TABLE IF NOT EXISTS {TABLE} (bucket TEXT PRIMARY KEY, state TEXT NOT NULL, "
        "worker TEXT NOT NULL, since TIMESTAMPTZ NOT NULL DEFAULT now(), records_from BIGINT NOT NULL DEFAULT 0)"))


class Claims:
    """This process's claims on the buckets of a campaign on the PostgreSQL storage ``url``.

    Args:
        url: the storage's URL.
        heartbeat: seconds between heartbeats: over TCP, the server probes this connection as
            often and drops it (and the claims) after three unanswered probes, so the buckets of
            a host that vanished without closing it (power, network) are taken over too.
        poll: seconds between two attempts while waiting for a claim.
    """

    def __init__(self, url: str, heartbeat: int = 10, poll: float = 0.5) -> None:
        import sqlalchemy
        from sqlalchemy.pool import NullPool

        self.url, self.poll = url, poll
        self._engine = sqlalchemy.create_engine(url, poolclass=NullPool)
        self._conn = self._run(lambda: self._engine.connect())
        for name in ("tcp_keepalives_idle", "tcp_keepalives_interval"):  # no effect on a local socket
            self._sql(f"SET {name} = {int(heartbeat)}")
        self._sql("SET tcp_keepalives_count = 3")
        self.started = self._sql("SELECT now()")[0][0]  # the server's clock, as the rows'
        self.pid = self._sql("SELECT pg_backend_pid()")[0][0]  # the server process holding the claims

    def _run(self, fn: Any) -> Any:
        """``fn()``; a database error means the claims are gone: a StorageError says so."""
        import sqlalchemy.exc

        try:
            return fn()
        except sqlalchemy.exc.DBAPIError as exc:
            raise StorageError(
                f"lost the connection to {shown(self.url)} that holds this process's claims on its "
                f"buckets ({first_line(exc)}); the campaign stopped: run the same command again to resume "
                "it (every measured trial is recorded, the one cut off is measured again)") from None

    def _sql(self, statement: str, **params: Any) -> Any:
        import sqlalchemy

        def go() -> Any:
            result = self._conn.execute(sqlalchemy.text(statement), params)
            rows = result.all() if result.returns_rows else []
            self._conn.commit()
            return rows
        return self._run(go)

    def take(self, bucket: str, wait: bool = False) -> bool:
        """Claim ``bucket`` (kept until :meth:`close` or the process's end); with ``wait``,
        wait while another process holds it. Returns whether this process holds it."""
        key = advisory_key(f"opgen claim {bucket}")
        while not self._sql("SELECT pg_try_advisory_lock(:k)", k=key)[0][0]:
            if not wait:
                return False
            time.sleep(self.poll)
        return True

    def holder(self, bucket: str) -> tuple[int, int]:
        """The claim on ``bucket`` as the records table checks it before a write that only its
        holder may make (``RecordTable.append``): (the server process of this connection, the
        advisory lock's key)."""
        return self.pid, advisory_key(f"opgen claim {bucket}")

    def release(self, bucket: str) -> None:
        """Give the claim on ``bucket`` back."""
        self._sql("SELECT pg_advisory_unlock(:k)", k=advisory_key(f"opgen claim {bucket}"))

    def left(self, bucket: str) -> str | None:
        """How the last holder of ``bucket`` (claimed now by this process) left it: ``finished``
        since this process started (a peer in this campaign), ``stopped`` before finishing it, or
        None (never claimed, or finished by an earlier campaign)."""
        rows = self._sql(f"SELECT state, since FROM {TABLE} WHERE bucket = :b", b=bucket)
        if not rows:
            return None
        state, since = rows[0]
        if state == "running":
            return "stopped"
        return "finished" if since >= self.started else None

    def mark(self, bucket: str, state: str) -> None:
        """Say that this process is at ``bucket`` (``running``: the records from now on are its)
        or finished it (``done``)."""
        self._sql(f"INSERT INTO {TABLE} (bucket, state, worker, records_from) VALUES (:b, :s, :w, "
                  f"(SELECT coalesce(max(id), 0) FROM {RECORDS})) ON CONFLICT (bucket) DO UPDATE SET "
                  "state = EXCLUDED.state, worker = EXCLUDED.worker, since = now(), records_from = CASE "
                  f"WHEN EXCLUDED.state = 'running' THEN EXCLUDED.records_from ELSE {TABLE}.records_from END",
                  b=bucket, s=state, w=worker_id())

    def decided(self, bucket: str, study: str) -> bool:
        """Whether the last holder of ``bucket`` recorded a winner for it (the winner's ``study``)
        after it claimed the bucket: it stopped between that record and saying so."""
        return bool(self._sql(
            f"SELECT 1 FROM {RECORDS} r JOIN {TABLE} c ON c.bucket = :b AND r.id > c.records_from "
            "WHERE r.line::jsonb ->> 'kind' = 'winner' AND r.line::jsonb ->> 'study' = :s LIMIT 1",
            b=bucket, s=study))

    def check(self) -> None:
        """Raise StorageError if the connection holding the claims was lost."""
        self._sql("SELECT 1")

    def close(self) -> None:
        """Give every claim back."""
        try:
            self._conn.close()
        finally:
            self._engine.dispose()
