"""`icl-heads serve`: the dashboard and JSON API under uvicorn.

Imports no torch when ICL_REDIS_URL is set (the web image has none).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from icl_heads.cli.common import settings_with
from model_worker.common.settings import Settings


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How uvicorn serves: forwarded headers (X-Forwarded-For/-Proto) believed only from
    ICL_TRUSTED_PROXIES (uvicorn's own default believes them from 127.0.0.1, so any local user
    could pick a client address), no Server header."""
    proxies = settings.trusted_proxies
    return {
        "host": settings.host,
        "port": settings.port,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        "server_header": False,
        "log_level": "info",
    }


def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (default ICL_HOST).")] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Port (default ICL_PORT).")
    ] = None,
    insecure: Annotated[
        bool, typer.Option(help="Allow a non-loopback address without ICL_AUTH_TOKEN.")
    ] = False,
    threads: Annotated[
        int,
        typer.Option(
            min=0,
            envvar="ICL_THREADS",
            help="Torch threads of the embedded engine (0: the CPU quota ÷ --workers-per-host); "
            "unused with ICL_REDIS_URL (the workers run the engine).",
        ),
    ] = 0,
    workers_per_host: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="ICL_WORKERS_PER_HOST",
            help="How many engines share this host's CPUs (sizes the default --threads).",
        ),
    ] = 1,
) -> None:
    """Serve the dashboard and JSON API (embedded worker unless ICL_REDIS_URL is set)."""
    import uvicorn

    from app.main import create_app
    from app.security.bind import enforce_bind
    from app.timeouts import server_config
    from icl_heads.study import study_document

    settings = settings_with(host=host, port=port)
    enforce_bind(settings.host, settings, insecure)
    if settings.redis_url:
        web_app = create_app(settings, study_document=study_document)
    else:
        from icl_heads.serving import embedded_backend
        from model_worker.resources.threads import set_threads

        set_threads(threads, workers_per_host)  # before the engine's thread loads the model
        web_app = create_app(settings, embedded_backend(settings), study_document)
    uvicorn.Server(server_config(web_app, settings, **uvicorn_options(settings))).run()


def register(app: typer.Typer) -> None:
    """Add `serve` to the `icl-heads` command."""
    app.command()(serve)
