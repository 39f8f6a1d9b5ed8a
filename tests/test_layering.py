"""The core is pure: importing it must not pull in the UI, the CLI framework or SSH."""

import subprocess
import sys

HEAVY = ("textual", "typer", "paramiko", "rich", "sqlite3", "socket")


def test_importing_the_core_pulls_in_no_textual_typer_or_paramiko() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import gpuctl.core\n"
        "for m in pkgutil.walk_packages(gpuctl.core.__path__, 'gpuctl.core.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"gpuctl.core imports {out.stdout.strip()}"
