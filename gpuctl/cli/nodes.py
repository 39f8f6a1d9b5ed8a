"""`gpuctl nodes ...`."""

from __future__ import annotations

import typer

app = typer.Typer(help="nodes commands.", no_args_is_help=True)
