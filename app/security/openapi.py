"""Document in the OpenAPI schema the error answers the security layer adds to every route
(400, 401, 403, 413, 429, 500, ...), so clients and the fuzzer know every status they can get."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

ERROR_SCHEMA = {
    "title": "ErrorDetail",
    "type": "object",
    "properties": {"detail": {"type": "string", "title": "Detail"}},
    "required": ["detail"],
}
ERROR_REF = {"$ref": "#/components/schemas/ErrorDetail"}
WRITE_METHODS = frozenset({"post", "put", "patch", "delete"})

COMMON = {
    "401": "Access token missing or wrong (when ICL_AUTH_TOKEN is set)",
    "429": "Too many requests from this client; see Retry-After",
    "500": "Internal error (a reference to the server log, never a stack trace)",
}
FOR_WRITES = {
    "400": "Malformed request body (e.g. not UTF-8) or Content-Length",
    "403": "Cross-origin request refused",
    "413": "Request body too large",
}
FOR_PATH_PARAMS = {"404": "Unknown or expired id"}
FOR_API = {"503": "The job queue or the model is not available; retry later"}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_REF}}}


def add_error_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """Add the common error answers to every operation (keeping any a route declared itself)."""
    schema.setdefault("components", {}).setdefault("schemas", {})["ErrorDetail"] = ERROR_SCHEMA
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            extra = dict(COMMON)
            if method in WRITE_METHODS:
                extra |= FOR_WRITES
            if "{" in path:
                extra |= FOR_PATH_PARAMS
            if path.startswith("/api/"):
                extra |= FOR_API
            responses = operation.setdefault("responses", {})
            for code, description in extra.items():
                responses.setdefault(code, _error(description))
    return schema


def document_errors(app: FastAPI) -> None:
    """Wrap `app.openapi` so the generated schema carries the common error answers."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_error_responses(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
