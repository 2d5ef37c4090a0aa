"""`icl-heads worker`: load a model once and serve its jobs from Redis (`serve`, the other
long-running process, is the web app's: icl_heads.cli)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from icl_heads.cli.common import quietly, settings_with, user_errors
from model_worker.common.defaults import DType


def worker(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="HF id, local folder or .gguf (default ICL_MODEL)."),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto (all GPUs via device_map), cpu, cuda:0 …")
    ] = None,
    dtype: Annotated[DType | None, typer.Option(help="Weight dtype (default ICL_DTYPE).")] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Redis URL (default ICL_REDIS_URL).")
    ] = None,
    burst: Annotated[bool, typer.Option(help="Exit when the queue is empty.")] = False,
    threads: Annotated[
        int,
        typer.Option(
            min=0,
            envvar="ICL_THREADS",
            help="Torch threads of this worker (0: the CPU quota ÷ --workers-per-host).",
        ),
    ] = 0,
    workers_per_host: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="ICL_WORKERS_PER_HOST",
            help="How many workers share this host's CPUs (sizes the default --threads).",
        ),
    ] = 1,
    nice: Annotated[
        int,
        typer.Option(
            min=0,
            max=19,
            envvar="ICL_WORKER_NICE",
            help="CPU priority of this worker (nice 0–19): above 0, a web tier on the same host "
            "answers before the worker's batches.",
        ),
    ] = 10,
) -> None:
    """Load a model once, then serve its analysis and experiment jobs from Redis."""
    from redis.exceptions import RedisError

    from model_worker.common.errors import UserInputError
    from model_worker.common.log_safety import install_log_hygiene, redact
    from model_worker.resources.threads import lower_priority, set_threads
    from model_worker.service.jobs import load_served_model
    from model_worker.service.worker import ModelWorker, redis_for_worker

    settings = settings_with(model=model, device=device, dtype=dtype, redis_url=redis_url)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    install_log_hygiene()
    set_threads(threads, workers_per_host)
    lower_priority(nice)
    with user_errors():
        if not settings.redis_url:
            raise UserInputError("a worker needs Redis: set ICL_REDIS_URL or pass --redis-url")
        connection = redis_for_worker(settings.redis_url)
        try:
            connection.ping()
        except RedisError as exc:
            message = redact(f"cannot reach Redis at {settings.redis_url}: {exc}")
            raise UserInputError(message) from exc
        loaded = quietly(lambda: load_served_model(settings))
    ModelWorker(loaded, settings, connection, device=settings.device).run(burst=burst)


def register(app: typer.Typer) -> None:
    """Add `worker` to the `icl-heads` command."""
    app.command()(worker)
