"""`python -m icl_heads.cli`: the same as the installed `icl-heads` command."""

from icl_heads.cli import app

app()
