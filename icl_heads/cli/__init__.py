"""`icl-heads`, the installed command: one package that composes the engine's commands
(analyze, models, experiment, worker) and `serve`, the web app. Bad input prints one line and
exits with code 2."""

from __future__ import annotations

from icl_heads.cli import experiments, patch, serve, study, towers, worker
from icl_heads.cli.commands import app

worker.register(app)
experiments.register(app)
towers.register(app)
patch.register(app)
study.register(app)
serve.register(app)

__all__ = ["app"]
