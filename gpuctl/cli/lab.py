"""`gpuctl lab ...`."""

from __future__ import annotations

import typer

app = typer.Typer(help="lab commands.", no_args_is_help=True)
