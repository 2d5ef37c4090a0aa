"""A fresh PostgreSQL database for a test (created, then dropped), on the local server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

SERVER = "postgresql://postgres@127.0.0.1:5432"


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """The URL of a new, empty database; dropped afterwards (with its connections)."""
    import psycopg

    name = f"icl_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{SERVER}/{name}"
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
