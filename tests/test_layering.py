"""The layers hold: the core is pure, imports run one way, each heavy library stays in its room.

import-linter's contracts and ruff's banned-api (both in pyproject.toml, run by `make lint`) are
checked here on the real package and shown to fail on a deliberate bad import.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
HEAVY = ("textual", "typer", "paramiko", "rich", "sqlite3", "socket")
LINT_IMPORTS = (
    sys.executable,
    "-c",
    "from importlinter.cli import lint_imports_command; lint_imports_command()",
)


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts on the `gpuctl` package found in `cwd`
    (`python -c` puts the working directory first on sys.path)."""
    return subprocess.run(
        [*LINT_IMPORTS, "--no-cache", "--no-logo", str(PYPROJECT)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def ruff(path: str, source: str) -> subprocess.CompletedProcess[str]:
    """ruff as `make lint` runs it, on `source` as if it were the file at `path`."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", path, "-"],
        cwd=ROOT,
        input=source,
        capture_output=True,
        text=True,
        check=False,
    )


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


def test_gpuctl_keeps_its_import_contracts() -> None:
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


# A bad import added to a copy of the package, the contract it breaks, the import it names.
BAD_IMPORTS = [
    pytest.param(
        "gpuctl/core/units.py",
        "from gpuctl.ops import gather\n",
        "gpuctl: cli | tui | testing > ops",
        "gpuctl.core.units -> gpuctl.ops.gather",
        id="core-imports-ops",
    ),
    pytest.param(
        "gpuctl/adapters/ssh/_transport.py",
        "from gpuctl.config import paths\n",
        "gpuctl: cli | tui | testing > ops",
        "gpuctl.adapters.ssh._transport -> gpuctl.config.paths",
        id="adapter-reads-config",
    ),
    pytest.param(
        "gpuctl/tui/format.py",
        "def _bad() -> None:\n    from gpuctl.cli import render\n",
        "gpuctl: cli | tui | testing > ops",
        "gpuctl.tui.format -> gpuctl.cli.render",
        id="tui-imports-cli-lazily",
    ),
    pytest.param(
        "gpuctl/tui/format.py",
        "from gpuctl.adapters import clock\n",
        "tui imports no cli, adapters or config",
        "gpuctl.tui.format -> gpuctl.adapters.clock",
        id="tui-imports-an-adapter",
    ),
    pytest.param(
        "gpuctl/core/placement/fit.py",
        "def _bad() -> None:\n    import subprocess\n",
        "core and errors are pure",
        "gpuctl.core.placement.fit -> subprocess",
        id="core-runs-a-process",
    ),
    pytest.param(
        "gpuctl/ops/report.py",
        "from gpuctl.core.consolidation._search import search\n",
        "a private module (_name.py) is imported only inside its package",
        "gpuctl.ops.report -> gpuctl.core.consolidation._search",
        id="private-piece-imported-from-outside-its-package",
    ),
    pytest.param(
        "gpuctl/core/placement/fit.py",
        "def _bad() -> None:\n    from gpuctl.core.fleet import numbers\n",
        "core: the fleet rules > consolidation, health, playbooks > jobs > placement",
        "gpuctl.core.placement.fit -> gpuctl.core.fleet.numbers",
        id="placement-imports-the-fleet-rules",
    ),
    pytest.param(
        "gpuctl/core/consolidation/model.py",
        "def _bad() -> None:\n    from gpuctl.core.consolidation import _plan\n",
        "core.consolidation: planning > the search and drain-and-refill",
        "gpuctl.core.consolidation.model -> gpuctl.core.consolidation._plan",
        id="consolidation-values-import-the-planner",
    ),
    pytest.param(
        "gpuctl/checkpoint.py",
        "from gpuctl.errors import GpuctlError\n",
        "gpuctl: cli | tui | testing > ops",
        "gpuctl.checkpoint -> gpuctl.errors",
        id="checkpoint-imports-gpuctl",
    ),
    pytest.param(
        "gpuctl/checkpoint.py",
        "def _bad() -> None:\n    import yaml\n",
        "checkpoint (and the package __init__ it loads) use the standard library only",
        "gpuctl.checkpoint -> yaml",
        id="checkpoint-needs-a-dependency",
    ),
    pytest.param(
        "gpuctl/ops/report.py",
        "import paramiko\n",
        "paramiko only in the ssh adapter",
        "gpuctl.ops.report -> paramiko",
        id="paramiko-outside-ssh",
    ),
    pytest.param(
        "gpuctl/tui/format.py",
        "import sqlite3\n",
        "sqlite3 only in the state store",
        "gpuctl.tui.format -> sqlite3",
        id="sqlite3-outside-the-store",
    ),
]


@pytest.mark.parametrize(("module", "line", "contract", "named"), BAD_IMPORTS)
def test_a_bad_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str, named: str
) -> None:
    shutil.copytree(
        ROOT / "gpuctl", tmp_path / "gpuctl", ignore=shutil.ignore_patterns("__pycache__")
    )
    with (tmp_path / module).open("a") as f:
        f.write("\n" + line)
    out = lint_imports(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, out.stdout
    assert named in broken, out.stdout


@pytest.mark.parametrize(
    ("path", "source", "library"),
    [
        ("gpuctl/core/placement/fit.py", "import paramiko\n", "paramiko"),
        ("gpuctl/ops/gather.py", "def f():\n    from paramiko import SSHClient\n", "paramiko"),
        ("gpuctl/adapters/probe/x.py", "import paramiko.client\n", "paramiko"),
        ("gpuctl/ops/report.py", "from textual.app import App\n", "textual"),
        ("gpuctl/ops/place.py", "import typer\n", "typer"),
        ("gpuctl/ops/report.py", "import sqlite3\n", "sqlite3"),
        ("tests/unit/core/test_x.py", "import sqlite3\n", "sqlite3"),
    ],
)
def test_ruff_bans_a_heavy_library_outside_its_room(path: str, source: str, library: str) -> None:
    out = ruff(path, source)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"TID251 `{library}` is banned" in out.stdout


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("gpuctl/adapters/ssh/_x.py", "import paramiko\n"),
        ("gpuctl/tui/widgets/x.py", "from textual.widget import Widget\n"),
        ("gpuctl/cli/x.py", "import typer\n"),
        ("gpuctl/adapters/store/x.py", "import sqlite3\n"),
    ],
)
def test_ruff_lets_each_library_into_its_room(path: str, source: str) -> None:
    out = ruff(path, source.replace("\n", "  # noqa: F401\n"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_still_refuses_autoaddpolicy_in_the_ssh_adapter() -> None:
    source = (
        "import paramiko\n\n\n"
        "def connect() -> paramiko.SSHClient:\n"
        "    client = paramiko.SSHClient()\n"
        "    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())\n"
        "    return client\n"
    )
    out = ruff("gpuctl/adapters/ssh/_connect.py", source)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "S507" in out.stdout
