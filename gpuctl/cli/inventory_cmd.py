"""`gpuctl inventory ...`."""

from __future__ import annotations

import typer

app = typer.Typer(help="inventory commands.", no_args_is_help=True)
