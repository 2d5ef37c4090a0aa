"""The durable store of the web tier: every accepted job's request, and finished results.

Redis is the queue and the hot cache (results expire after `ICL_RESULT_TTL_S`; a restart without
persistence loses everything); this store keeps what a permalink needs for good: the request of
each accepted job (so a lost job is enqueued again, an evicted result recomputed on demand), its
failure reason, and the finished result's parts (model_worker.queue.result_parts). SQLite in
`ICL_DATA_DIR` by default (stdlib sqlite3); PostgreSQL (psycopg 3) when `ICL_DATABASE_URL` is
set, for several web replicas. Plain SQL both understand; calls are blocking (the backends run
them in a thread).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from model_worker.contracts import AnalysisRequest, ExperimentRequest
from model_worker.queue.result_parts import Parts
from model_worker.settings import Settings

SQLITE_FILE = "results.sqlite3"
PENDING, DONE, FAILED = "pending", "done", "failed"


class StoreError(Exception):
    """The store could not be reached or written (the web tier answers 503)."""


class StoredJob(NamedTuple):
    id: str
    kind: str
    model: str
    fingerprint: str
    request: str
    state: str
    error: str | None
    created_at: float

    def parsed_request(self) -> AnalysisRequest | ExperimentRequest:
        """The request as it was accepted."""
        if self.kind == "experiment":
            return ExperimentRequest.model_validate_json(self.request)
        return AnalysisRequest.model_validate_json(self.request)


def _schema(blob: str) -> list[str]:
    return [
        "CREATE TABLE IF NOT EXISTS icl_jobs (id TEXT PRIMARY KEY, kind TEXT NOT NULL, "
        "model TEXT NOT NULL, fingerprint TEXT NOT NULL, request TEXT NOT NULL, "
        "state TEXT NOT NULL, error TEXT, created_at DOUBLE PRECISION NOT NULL, "
        "finished_at DOUBLE PRECISION)",
        "CREATE INDEX IF NOT EXISTS icl_jobs_state ON icl_jobs (state, created_at)",
        f"CREATE TABLE IF NOT EXISTS icl_parts (job_id TEXT NOT NULL, name TEXT NOT NULL, "
        f"data {blob} NOT NULL, PRIMARY KEY (job_id, name))",
    ]


class ResultStore:
    """Jobs and result parts in SQL; one connection, used under a lock, reopened if it broke."""

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        placeholder: str,
        blob: str,
        errors: tuple[type[Exception], ...],
    ) -> None:
        self._connect, self._mark, self._errors = connect, placeholder, errors
        self._lock = threading.Lock()
        self._connection: Any = None
        for statement in _schema(blob):
            self._run(statement)

    def _sql(self, statement: str) -> str:
        return statement.replace("?", self._mark)

    def _run(self, statement: str, params: Sequence[Any] = (), fetch: bool = False) -> list[Any]:
        """Execute and commit; reconnect once if the connection broke."""
        return self._transaction([(statement, params)], fetch)

    def _transaction(
        self, statements: list[tuple[str, Sequence[Any]]], fetch: bool = False
    ) -> list[Any]:
        """Execute `statements` in one transaction (the last one's rows if `fetch`)."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._connection is None:
                        self._connection = self._connect()
                    cursor = self._connection.cursor()
                    for statement, params in statements:
                        cursor.execute(self._sql(statement), tuple(params))
                    rows = cursor.fetchall() if fetch else []
                    self._connection.commit()
                    return rows
                except self._errors as exc:
                    self._drop_connection()
                    if attempt == 2:
                        raise StoreError(f"the result store is unreachable: {exc}") from exc
        raise AssertionError("unreachable")

    def _drop_connection(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):  # already broken
                self._connection.close()
            self._connection = None

    def remember(self, job_id: str, kind: str, model: str, fingerprint: str, request: str) -> None:
        """Keep an accepted job's request (a failed one submitted again is pending again)."""
        self._run(
            "INSERT INTO icl_jobs (id, kind, model, fingerprint, request, state, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = ?, error = NULL "
            "WHERE icl_jobs.state = ?",
            (job_id, kind, model, fingerprint, request, PENDING, time.time(), PENDING, FAILED),
        )

    def job(self, job_id: str) -> StoredJob | None:
        rows = self._run(
            "SELECT id, kind, model, fingerprint, request, state, error, created_at "
            "FROM icl_jobs WHERE id = ?",
            (job_id,),
            fetch=True,
        )
        return StoredJob(*rows[0]) if rows else None

    def pending(self, limit: int = 100, since: float = 0.0) -> list[StoredJob]:
        """Accepted jobs (after `since`) without a result or a failure yet, newest first."""
        rows = self._run(
            "SELECT id, kind, model, fingerprint, request, state, error, created_at "
            "FROM icl_jobs WHERE state = ? AND created_at > ? ORDER BY created_at DESC LIMIT ?",
            (PENDING, since, limit),
            fetch=True,
        )
        return [StoredJob(*row) for row in rows]

    def save(self, job_id: str, parts: Parts) -> None:
        """Keep a finished result's parts, all at once (written once: results never change)."""
        insert = (
            "INSERT INTO icl_parts (job_id, name, data) VALUES (?, ?, ?) "
            "ON CONFLICT (job_id, name) DO NOTHING"
        )
        statements: list[tuple[str, Sequence[Any]]] = [
            (insert, (job_id, name, data)) for name, data in parts.items()
        ]
        statements.append(
            (
                "UPDATE icl_jobs SET state = ?, error = NULL, finished_at = ? WHERE id = ?",
                (DONE, time.time(), job_id),
            )
        )
        self._transaction(statements)

    def fail(self, job_id: str, error: str) -> None:
        """Record why a pending job failed."""
        self._run(
            "UPDATE icl_jobs SET state = ?, error = ?, finished_at = ? WHERE id = ? AND state = ?",
            (FAILED, error, time.time(), job_id, PENDING),
        )

    def parts(self, job_id: str, names: Iterable[str] | None = None) -> Parts | None:
        """The stored parts of a finished result (all, or `names`); None when there is none."""
        statement, params = "SELECT name, data FROM icl_parts WHERE job_id = ?", [job_id]
        wanted = list(names) if names is not None else None
        if wanted is not None:
            statement += f" AND name IN ({', '.join('?' for _ in wanted)})"
            params += wanted
        rows = self._run(statement, params, fetch=True)
        if not rows:
            return None
        return {name: bytes(data) for name, data in rows}

    def has_result(self, job_id: str) -> bool:
        rows = self._run("SELECT 1 FROM icl_parts WHERE job_id = ? LIMIT 1", (job_id,), True)
        return bool(rows)

    def close(self) -> None:
        with self._lock:
            self._drop_connection()


def sqlite_store(path: str) -> ResultStore:
    """A store in the SQLite file `path` (write-ahead log: readers never wait for a writer)."""

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, timeout=10, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    return ResultStore(connect, placeholder="?", blob="BLOB", errors=(sqlite3.Error,))


def postgres_store(url: str, connect_timeout_s: float = 5.0) -> ResultStore:
    """A store in the PostgreSQL database `url` (psycopg 3)."""
    import psycopg

    def connect() -> Any:
        return psycopg.connect(url, connect_timeout=max(1, round(connect_timeout_s)))

    return ResultStore(connect, placeholder="%s", blob="BYTEA", errors=(psycopg.Error,))


def open_store(settings: Settings) -> ResultStore:
    """The store the settings ask for: PostgreSQL at `database_url`, else SQLite in `data_dir`."""
    if settings.database_url:
        return postgres_store(settings.database_url)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return sqlite_store(str(settings.data_dir / SQLITE_FILE))
