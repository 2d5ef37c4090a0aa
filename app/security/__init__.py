"""Shared-server hardening: access control, same-origin checks, limits, headers, error pages.

`install(app, settings)` adds the whole stack; the order (outermost first) is: guard (security
headers, 500 page), body limit, rate limit, same-origin check, authentication.
"""

from __future__ import annotations

from fastapi import FastAPI

from app.security.auth import AuthMiddleware
from app.security.body_limit import BodyLimitMiddleware
from app.security.errors import install_error_handlers
from app.security.guard import GuardMiddleware
from app.security.openapi import document_errors
from app.security.origin import SameOriginMiddleware
from app.security.rate_limit import RateLimitMiddleware
from app.settings import Settings


def install(app: FastAPI, settings: Settings) -> None:
    """Add the security middleware and the JSON/HTML error handlers to `app`."""
    install_error_handlers(app)
    document_errors(app)
    # add_middleware puts each new layer outside the previous ones: innermost first.
    app.add_middleware(AuthMiddleware, settings=settings)
    app.add_middleware(SameOriginMiddleware, trusted_origins=settings.trusted_origins)
    app.add_middleware(
        RateLimitMiddleware,
        per_minute=settings.rate_limit_per_minute,
        writes_per_minute=settings.write_rate_limit_per_minute,
    )
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_upload_bytes,
    )
    app.add_middleware(GuardMiddleware)
