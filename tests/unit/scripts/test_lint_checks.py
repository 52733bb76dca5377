"""The lint's own checks in scripts/: each finds what it is there to refuse, and names where."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import grimp

from tests.support.common import REPO


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_way_of_reading_the_environment_is_found(tmp_path: Path) -> None:
    check = _script("check_environ")
    source = tmp_path / "reader.py"
    source.write_text(
        "import os\n"
        "import os as o\n"
        "from os import getenv\n"
        "a = os.environ.get('X')\n"
        "b = os.getenv('Y')\n"
        "c = o.environ['Z']\n"
        "os.environ['W'] = '1'\n"
        "d = os.path.join('a', 'b')\n"  # not the environment
    )
    assert check.offences(source) == [
        (3, "from os import getenv"),
        (4, "os.environ"),
        (5, "os.getenv"),
        (6, "o.environ"),
        (7, "os.environ"),
    ]


def test_the_package_reads_the_environment_only_in_settings() -> None:
    proc = subprocess.run([sys.executable, "scripts/check_environ.py"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_every_import_of_a_harbor_private_name_is_found(tmp_path: Path) -> None:
    check = _script("check_harbor_private")
    source = tmp_path / "user.py"
    source.write_text(
        "from harbor.environments.skypilot import _sanitize_dns_name, SkypilotEnvironment\n"
        "from harbor import __version__\n"  # a dunder is public
        "from harborx.y import _z\n"  # not Harbor
        "from .harbor import _local\n"  # relative: ours
        "from harbor.cli.lint import _selected_rules as rules\n"
    )
    assert check.offences(source) == [
        (1, "from harbor.environments.skypilot import _sanitize_dns_name"),
        (5, "from harbor.cli.lint import _selected_rules"),
    ]


def test_harbors_private_names_are_imported_only_in_harbor_compat() -> None:
    proc = subprocess.run([sys.executable, "scripts/check_harbor_private.py"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_an_import_circle_is_reported_with_its_modules() -> None:
    check = _script("check_cycles")
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c", "p.d"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b", line_number=3, line_contents="import p.b")
    graph.add_import(importer="p.b", imported="p.c", line_number=4, line_contents="import p.c")
    graph.add_import(importer="p.c", imported="p.a", line_number=5, line_contents="import p.a")
    graph.add_import(importer="p.d", imported="p.a", line_number=6, line_contents="import p.a")
    assert check.strongly_connected(graph) == [["p.a", "p.b", "p.c"]]
    assert check.closing_chain(graph, ["p.a", "p.b", "p.c"]) == ["p.a", "p.b", "p.c", "p.a"]
    graph.remove_import(importer="p.c", imported="p.a")
    assert check.strongly_connected(graph) == []
