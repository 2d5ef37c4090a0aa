"""The durable store of the web tier: every accepted job's request, and finished results.

Redis is the queue and the hand-over from the workers (results expire after `ICL_RESULT_TTL_S`;
a restart without persistence loses everything); this store is the source of truth for finished
results (the web tier reads it first, and keeps a worker's result only once its signature holds,
model_worker.service.queue.signing), and keeps what a permalink needs: the request of
each accepted job (so a lost job is enqueued again, an evicted result recomputed on demand), its
failure reason, and the finished result's parts (model_worker.service.queue.result_parts). SQLite in
`ICL_DATA_DIR` by default (stdlib sqlite3); PostgreSQL (psycopg 3) when `ICL_DATABASE_URL` is
set, for several web replicas. Plain SQL both understand; calls are blocking (the backends run
them in a thread).

The store is bounded (`prune`): finished results older than `ICL_STORE_MAX_AGE_DAYS` go, then
the oldest until it holds at most `ICL_STORE_MAX_BYTES`; pinned permalinks (`pin`) and jobs still
pending stay. A pin has an owner (only they or an admin un-pin it) and pins are capped per owner
and in all (`ICL_PIN_MAX_BYTES_PER_USER`, `ICL_PIN_MAX_BYTES`, their own room within the store's
bound). Parts are written only under their job's row, and parts without one are swept. An
uploaded dataset is kept once, by the SHA-256 of its text, however many experiments use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.contracts.patching import PatchRequest
from model_worker.service.queue.result_parts import Parts, size

log = logging.getLogger(__name__)
SQLITE_FILE = "results.sqlite3"
PENDING, DONE, FAILED = "pending", "done", "failed"


class StoreError(Exception):
    """The store could not be reached or written (the web tier answers 503)."""


class PinRefused(Exception):
    """A pin or un-pin this client may not make: `status` 403 (someone else's pin) or 409
    (over a pin quota, the message names the knob)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class PinCaps(NamedTuple):
    """Bytes that pinned results may hold: per owner and in all (0: no cap)."""

    per_owner: int = 0
    total: int = 0


NO_CAPS = PinCaps()


def pin_caps(settings: Settings) -> PinCaps:
    """The pin quotas of the settings (ICL_PIN_MAX_BYTES_PER_USER, ICL_PIN_MAX_BYTES), pins
    holding at most half of a bounded store (ICL_STORE_MAX_BYTES)."""
    total, bound = settings.pin_max_bytes, settings.store_max_bytes
    if bound:
        total = min(total or bound // 2, bound // 2)
    return PinCaps(settings.pin_max_bytes_per_user, total)


class StoredStudy(NamedTuple):
    """A study as accepted: its request, who submitted it, the ids of its experiment jobs so
    far (None: not submitted yet), and its state (pending, done or failed, with the reason)."""

    id: str
    model: str
    fingerprint: str
    request: str
    client: str
    jobs: list[str | None]
    state: str
    error: str | None


class StoredJob(NamedTuple):
    id: str
    kind: str
    model: str
    fingerprint: str
    request: str
    state: str
    error: str | None
    created_at: float

    def parsed_request(self) -> AnalysisRequest | ExperimentRequest | PatchRequest:
        """The request as it was accepted."""
        if self.kind == "experiment":
            return ExperimentRequest.model_validate_json(self.request)
        if self.kind == "patching":
            return PatchRequest.model_validate_json(self.request)
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
        "CREATE TABLE IF NOT EXISTS icl_datasets (digest TEXT PRIMARY KEY, text TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS icl_studies (id TEXT PRIMARY KEY, model TEXT NOT NULL, "
        "fingerprint TEXT NOT NULL, request TEXT NOT NULL, client TEXT NOT NULL, "
        "jobs TEXT NOT NULL, state TEXT NOT NULL, error TEXT, "
        "created_at DOUBLE PRECISION NOT NULL)",
    ]


#: Columns added after the first release: (name, SQL type and default).
_ADDED_COLUMNS = (
    ("pinned", "INTEGER NOT NULL DEFAULT 0"),
    ("bytes", "BIGINT NOT NULL DEFAULT 0"),
    ("dataset_digest", "TEXT"),
    ("pinned_by", "TEXT"),
    ("pinned_at", "DOUBLE PRECISION"),
)
_JOB_COLUMNS = (
    "j.id, j.kind, j.model, j.fingerprint, j.request, j.state, j.error, j.created_at, "
    "j.dataset_digest, d.text"
)
_JOB_FROM = "icl_jobs j LEFT JOIN icl_datasets d ON d.digest = j.dataset_digest"


def _stored_job(row: Sequence[Any]) -> StoredJob:
    """A job row with its dataset's text put back into its request."""
    *fields, digest, text = row
    job = StoredJob(*fields)
    if digest is None:
        return job
    request = json.loads(job.request)
    request["dataset_text"] = text
    return job._replace(request=json.dumps(request, ensure_ascii=False))


def _split_dataset(kind: str, request: str) -> tuple[str, str | None, str | None]:
    """(the request without its dataset text, the text's SHA-256, the text) for an experiment
    with an uploaded dataset; else (request, None, None)."""
    if kind != "experiment":
        return request, None, None
    fields = json.loads(request)
    text = fields.get("dataset_text")
    if not isinstance(text, str):
        return request, None, None
    fields["dataset_text"] = None
    digest = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps(fields, ensure_ascii=False), digest, text


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
        self._add_columns()

    def _add_columns(self) -> None:
        """Columns a store made by an earlier version lacks (added once, defaults filled)."""
        present = self._run("SELECT * FROM icl_jobs WHERE 1 = 0", describe=True)
        for name, kind in _ADDED_COLUMNS:
            if name not in present:
                self._run(f"ALTER TABLE icl_jobs ADD COLUMN {name} {kind}")

    def _sql(self, statement: str) -> str:
        return statement.replace("?", self._mark)

    def _run(
        self,
        statement: str,
        params: Sequence[Any] = (),
        fetch: bool = False,
        describe: bool = False,
    ) -> list[Any]:
        """Execute and commit; reconnect once if the connection broke."""
        return self._transaction([(statement, params)], fetch, describe)

    def _transaction(
        self,
        statements: list[tuple[str, Sequence[Any]]],
        fetch: bool = False,
        describe: bool = False,
    ) -> list[Any]:
        """Execute `statements` in one transaction (the last one's rows if `fetch`, its column
        names if `describe`)."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._connection is None:
                        self._connection = self._connect()
                    cursor = self._connection.cursor()
                    for statement, params in statements:
                        cursor.execute(self._sql(statement), tuple(params))
                    rows = cursor.fetchall() if fetch else []
                    if describe:
                        rows = [column[0] for column in cursor.description or ()]
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
        """Keep an accepted job's request (a failed one submitted again is pending again); an
        uploaded dataset's text is kept once, by its SHA-256."""
        request, digest, text = _split_dataset(kind, request)
        statements: list[tuple[str, Sequence[Any]]] = []
        if digest is not None:
            statements.append(
                (
                    "INSERT INTO icl_datasets (digest, text) VALUES (?, ?) "
                    "ON CONFLICT (digest) DO NOTHING",
                    (digest, text),
                )
            )
        statements.append(
            (
                "INSERT INTO icl_jobs (id, kind, model, fingerprint, request, state, created_at, "
                "dataset_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
                "SET state = ?, error = NULL WHERE icl_jobs.state = ?",
                (job_id, kind, model, fingerprint, request, PENDING, time.time(), digest)
                + (PENDING, FAILED),
            )
        )
        self._transaction(statements)

    def job(self, job_id: str) -> StoredJob | None:
        rows = self._run(
            f"SELECT {_JOB_COLUMNS} FROM {_JOB_FROM} WHERE j.id = ?", (job_id,), fetch=True
        )
        return _stored_job(rows[0]) if rows else None

    def accepted_request(
        self, job_id: str
    ) -> AnalysisRequest | ExperimentRequest | PatchRequest | None:
        """The request accepted as `job_id` (None: none was, or it was pruned)."""
        stored = self.job(job_id)
        return None if stored is None else stored.parsed_request()

    def pending(self, limit: int = 100, since: float = 0.0) -> list[StoredJob]:
        """Accepted jobs (after `since`) without a result or a failure yet, newest first."""
        rows = self._run(
            f"SELECT {_JOB_COLUMNS} FROM {_JOB_FROM} WHERE j.state = ? AND j.created_at > ? "
            "ORDER BY j.created_at DESC LIMIT ?",
            (PENDING, since, limit),
            fetch=True,
        )
        return [_stored_job(row) for row in rows]

    def pin(
        self,
        job_id: str,
        pinned: bool = True,
        owner: str = "",
        admin: bool = True,
        caps: PinCaps = NO_CAPS,
    ) -> bool:
        """Keep (or stop keeping) `job_id` whatever `prune` removes, as `owner`; False if
        there is no such job. PinRefused when someone else pinned it and `owner` is no `admin`
        (un-pinning), or when pinning it would take `owner`'s pins or all pins over `caps`."""
        stored = self._run("SELECT pinned, pinned_by FROM icl_jobs WHERE id = ?", (job_id,), True)
        if not stored:
            return False
        was_pinned, pinned_by = bool(stored[0][0]), stored[0][1]
        theirs = was_pinned and pinned_by not in (None, owner)
        if theirs and not admin:
            if pinned:
                return True  # pinned already, and it stays theirs
            raise PinRefused(f"{job_id} was pinned by someone else: only they may un-pin it", 403)
        if not pinned:
            self._run(
                "UPDATE icl_jobs SET pinned = 0, pinned_by = NULL, pinned_at = NULL WHERE id = ?",
                (job_id,),
            )
            return True
        if was_pinned:
            return True
        self._check_pin_caps(job_id, owner, caps)
        self._run(
            "UPDATE icl_jobs SET pinned = 1, pinned_by = ?, pinned_at = ? WHERE id = ?",
            (owner or None, time.time(), job_id),
        )
        return True

    def _check_pin_caps(self, job_id: str, owner: str, caps: PinCaps) -> None:
        """PinRefused (409) when pinning `job_id` takes `owner`'s or all pins over `caps`."""
        rows = self._run(
            "SELECT (SELECT bytes + LENGTH(request) FROM icl_jobs WHERE id = ?), "
            "(SELECT COALESCE(SUM(bytes + LENGTH(request)), 0) FROM icl_jobs "
            "WHERE pinned = 1 AND pinned_by = ?), "
            "(SELECT COALESCE(SUM(bytes + LENGTH(request)), 0) FROM icl_jobs WHERE pinned = 1)",
            (job_id, owner),
            fetch=True,
        )
        held, mine, everyone = (int(value or 0) for value in rows[0])
        for cap, pinned, knob, whose in (
            (caps.per_owner, mine, "ICL_PIN_MAX_BYTES_PER_USER", "your pins"),
            (caps.total, everyone, "ICL_PIN_MAX_BYTES", "all pins"),
        ):
            if cap and pinned + held > cap:
                raise PinRefused(
                    f"pinning {job_id} ({held:,} bytes) would take {whose} to "
                    f"{pinned + held:,} bytes, over the {cap:,} of {knob}; un-pin another "
                    "result first",
                    409,
                )

    def _unpin_over(self, caps: PinCaps) -> list[str]:
        """Un-pin the most recent pins past `caps` (a pin made while its job was pending grows
        when the result arrives): the ids un-pinned."""
        if not (caps.per_owner or caps.total):
            return []
        rows = self._run(
            "SELECT id, COALESCE(pinned_by, ''), bytes + LENGTH(request) FROM icl_jobs "
            "WHERE pinned = 1 ORDER BY COALESCE(pinned_at, 0), id",
            fetch=True,
        )
        by_owner: dict[str, int] = {}
        total, over = 0, []
        for job_id, owner, held in rows:
            mine = by_owner.get(owner, 0) + int(held)
            if (caps.per_owner and mine > caps.per_owner) or (
                caps.total and total + int(held) > caps.total
            ):
                over.append(job_id)
                continue
            by_owner[owner], total = mine, total + int(held)
        for job_id in over:
            log.warning("un-pinned %s: its owner's pins are over their quota", job_id)
            self.pin(job_id, False)
        return over

    def pinned_bytes(self) -> int:
        rows = self._run(
            "SELECT COALESCE(SUM(bytes + LENGTH(request)), 0) FROM icl_jobs WHERE pinned = 1",
            fetch=True,
        )
        return int(rows[0][0])

    def size(self) -> int:
        """Bytes held: results' parts, requests and datasets (text lengths)."""
        rows = self._run(
            "SELECT (SELECT COALESCE(SUM(bytes + LENGTH(request)), 0) FROM icl_jobs) + "
            "(SELECT COALESCE(SUM(LENGTH(text)), 0) FROM icl_datasets)",
            fetch=True,
        )
        return int(rows[0][0])

    def prune(self, max_bytes: int, max_age_s: float = 0.0, caps: PinCaps = NO_CAPS) -> list[str]:
        """Delete finished (done or failed), unpinned jobs: those that ended over `max_age_s`
        ago (0: none for age), then the oldest until the store holds at most `max_bytes` (0:
        unbounded); then parts without a job row and the datasets no job uses. Pins past
        `caps` are un-pinned first; `caps.total` is the pins' own room, so pins never take the
        room of unpinned results. The ids deleted."""
        self._unpin_over(caps)
        rows = self._run(
            "SELECT id, COALESCE(finished_at, created_at), bytes + LENGTH(request) FROM icl_jobs "
            "WHERE state <> ? AND pinned = 0 ORDER BY COALESCE(finished_at, created_at), id",
            (PENDING,),
            fetch=True,
        )
        pin_room = max(0, caps.total - self.pinned_bytes()) if caps.total else 0
        excess = self.size() + pin_room - max_bytes if max_bytes else 0
        oldest = time.time() - max_age_s if max_age_s else None
        doomed: list[str] = []
        for job_id, ended_at, held in rows:
            if excess > 0 or (oldest is not None and ended_at < oldest):
                doomed.append(job_id)
                excess -= int(held)
        for start in range(0, len(doomed), 500):
            batch = doomed[start : start + 500]
            marks = ", ".join("?" for _ in batch)
            self._transaction(
                [
                    (f"DELETE FROM icl_parts WHERE job_id IN ({marks})", batch),
                    (f"DELETE FROM icl_jobs WHERE id IN ({marks})", batch),
                ]
            )
        self._run(  # orphans: parts of a job whose row is gone (a writer raced its pruning)
            "DELETE FROM icl_parts WHERE NOT EXISTS "
            "(SELECT 1 FROM icl_jobs WHERE icl_jobs.id = icl_parts.job_id)"
        )
        if doomed:
            self._run(
                "DELETE FROM icl_datasets WHERE digest NOT IN (SELECT dataset_digest FROM "
                "icl_jobs WHERE dataset_digest IS NOT NULL)"
            )
        return doomed

    def save(self, job_id: str, parts: Parts) -> bool:
        """Keep a finished result's parts, all at once (written once: results never change),
        only under the job's row: False (nothing written) when there is none (never accepted,
        or pruned meanwhile), so no part is ever outside what `size` and `prune` see."""
        live = "EXISTS (SELECT 1 FROM icl_jobs WHERE id = ?)"
        insert = (
            f"INSERT INTO icl_parts (job_id, name, data) SELECT ?, ?, ? WHERE {live} "
            "ON CONFLICT (job_id, name) DO NOTHING"
        )
        statements: list[tuple[str, Sequence[Any]]] = [
            (insert, (job_id, name, data, job_id)) for name, data in parts.items()
        ]
        statements.append(
            (
                "UPDATE icl_jobs SET state = ?, error = NULL, finished_at = ?, bytes = ? "
                "WHERE id = ? RETURNING id",
                (DONE, time.time(), size(parts), job_id),
            )
        )
        return bool(self._transaction(statements, fetch=True))

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

    # --- studies (app.studies): a plan of experiment jobs, kept beside the jobs ----------

    def remember_study(
        self, study: str, model: str, fingerprint: str, request: str, client: str, n_jobs: int
    ) -> None:
        """Keep an accepted study (one that failed or was cancelled starts afresh)."""
        jobs = json.dumps([None] * n_jobs)
        self._run(
            "INSERT INTO icl_studies (id, model, fingerprint, request, client, jobs, state, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "state = ?, error = NULL, client = ?, jobs = ? WHERE icl_studies.state = ?",
            (study, model, fingerprint, request, client, jobs, PENDING, time.time())
            + (PENDING, client, jobs, FAILED),
        )

    def study(self, study: str) -> StoredStudy | None:
        rows = self._run(
            "SELECT id, model, fingerprint, request, client, jobs, state, error FROM "
            "icl_studies WHERE id = ?",
            (study,),
            fetch=True,
        )
        if not rows:
            return None
        study_id, model, fingerprint, request, client, jobs, state, error = rows[0]
        return StoredStudy(
            study_id, model, fingerprint, request, client, json.loads(jobs), state, error
        )

    def pending_studies(self, limit: int = 100) -> list[str]:
        """The ids of studies not yet done or failed, oldest first."""
        rows = self._run(
            "SELECT id FROM icl_studies WHERE state = ? ORDER BY created_at LIMIT ?",
            (PENDING, limit),
            fetch=True,
        )
        return [row[0] for row in rows]

    def study_jobs(self, study: str, jobs: list[str | None]) -> None:
        """Record the ids of a pending study's experiment jobs submitted so far."""
        self._run(
            "UPDATE icl_studies SET jobs = ? WHERE id = ? AND state = ?",
            (json.dumps(jobs), study, PENDING),
        )

    def end_study(self, study: str, state: str, error: str | None = None) -> bool:
        """A pending study is done, or failed (cancelled) with `error`; False if it had ended."""
        rows = self._run(
            "UPDATE icl_studies SET state = ?, error = ? WHERE id = ? AND state = ? RETURNING id",
            (state, error, study, PENDING),
            fetch=True,
        )
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


class Retention:
    """`ResultStore.prune` with the bounds of the settings (`ICL_STORE_MAX_BYTES`,
    `ICL_STORE_MAX_AGE_DAYS`), at most once every PRUNE_EVERY_S (the backends' upkeep)."""

    PRUNE_EVERY_S = 60.0

    def __init__(self, store: ResultStore, settings: Settings) -> None:
        self._store, self._settings = store, settings
        self._last = float("-inf")

    def run(self) -> list[str]:
        """Prune if due; the ids of the jobs deleted."""
        now = time.monotonic()
        if now - self._last < self.PRUNE_EVERY_S:
            return []
        self._last = now
        max_age_s = self._settings.store_max_age_days * 86400
        caps = pin_caps(self._settings)
        pruned = self._store.prune(self._settings.store_max_bytes, max_age_s, caps)
        if pruned:
            log.info("the store dropped %d old results (retention)", len(pruned))
        return pruned
