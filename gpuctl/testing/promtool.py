"""Prometheus' own checker in tests: `promtool check metrics` on an exposition, `promtool check
rules` / `promtool test rules` on rule files. `make sysdeps` installs it (Debian's `prometheus`);
a machine without it fails the test with a line saying so, never skips it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def promtool(*args: str | Path, stdin: str | None = None, cwd: Path | None = None) -> str:
    """Run promtool; its output. An AssertionError naming the command and what promtool said
    when it exits non-zero, or when it is not installed."""
    exe = shutil.which("promtool")
    if exe is None:
        raise AssertionError("promtool not found: `make sysdeps` installs it (Debian: prometheus)")
    done = subprocess.run(
        [exe, *map(str, args)], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=60
    )
    said = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise AssertionError(
            f"promtool {' '.join(map(str, args))} exited {done.returncode}: {said}"
        )
    return said


def check_metrics(text: str | bytes) -> None:
    """`promtool check metrics` passes on `text` (its lint included)."""
    promtool("check", "metrics", stdin=text.decode() if isinstance(text, bytes) else text)
