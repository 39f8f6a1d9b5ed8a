"""`gpuctl hosts ...`."""

from __future__ import annotations

import typer

app = typer.Typer(help="hosts commands.", no_args_is_help=True)
