"""Shared-server hardening: access control, same-origin checks, limits, headers, error pages.

`install(app, settings)` adds the whole stack; the order (outermost first) is: guard (security
headers, 500 page), refusals sent late (every 429, ICL_REFUSAL_DELAY_S), Host check, body
limit, same-origin check, authentication (sessions, login guessing limits, named users),
requests in flight and rate limit (per named user, else per address), JSON bodies (no lone
surrogates, bounded nesting), HTML-only answers to htmx. It also makes every log line of the
process safe (model_worker.common.log_safety).
"""

from __future__ import annotations

from fastapi import FastAPI

from app.security.auth import AuthMiddleware
from app.security.body_limit import BodyLimitMiddleware
from app.security.errors import install_error_handlers
from app.security.guard import GuardMiddleware
from app.security.hosts import HostCheckMiddleware
from app.security.htmx import HtmlOnlyForHtmxMiddleware
from app.security.in_flight import InFlightLimitMiddleware
from app.security.json_input import JsonInputMiddleware
from app.security.limit_storage import ClientLimiter
from app.security.login_limit import LoginLimiter
from app.security.openapi import document_errors
from app.security.origin import SameOriginMiddleware
from app.security.rate_limit import RateLimitMiddleware
from app.security.refusal_delay import RefusalDelayMiddleware
from app.security.sessions import session_store
from app.security.shared_slots import REUSE_S, SharedSlots
from model_worker.common.log_safety import install_log_hygiene
from model_worker.common.settings import Settings


def install(app: FastAPI, settings: Settings) -> None:
    """Add the security middleware and the JSON/HTML error handlers to `app`; the session store,
    the login limiter and the per-client rate counters go to `app.state.sessions`,
    `app.state.login_limiter` and `app.state.rate_limiter`."""
    install_log_hygiene()
    install_error_handlers(app)
    document_errors(app)
    app.state.sessions = session_store(settings)
    app.state.rate_limiter = ClientLimiter(settings)  # (also the figure files' pace)
    app.state.login_limiter = LoginLimiter(
        app.state.rate_limiter,
        settings.login_failures_per_client,
        settings.login_failures_per_account,
    )
    # add_middleware puts each new layer outside the previous ones: innermost first.
    app.add_middleware(HtmlOnlyForHtmxMiddleware)
    app.add_middleware(JsonInputMiddleware)
    app.add_middleware(  # inside authentication: a named user's requests count as theirs
        RateLimitMiddleware,
        limiter=app.state.rate_limiter,
        per_minute=settings.rate_limit_per_minute,
        writes_per_minute=settings.write_rate_limit_per_minute,
    )
    app.state.requests_in_flight = (  # shared by replicas with Redis
        SharedSlots.of(settings, settings.client_requests, "requests", reuse_s=REUSE_S)
        if settings.client_requests
        else None
    )
    app.add_middleware(InFlightLimitMiddleware, slots=app.state.requests_in_flight)
    app.add_middleware(
        AuthMiddleware,
        settings=settings,
        sessions=app.state.sessions,
        limiter=app.state.login_limiter,
    )
    app.add_middleware(SameOriginMiddleware, trusted_origins=settings.trusted_origins)
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_upload_bytes,
    )
    app.add_middleware(HostCheckMiddleware, settings=settings)
    app.add_middleware(RefusalDelayMiddleware, delay_s=settings.refusal_delay_s)
    app.add_middleware(GuardMiddleware)
