"""The bundler: project -> reproducible, content-addressed bundle wheel.

Real builds (setuptools through the PyPA ``build`` frontend) of a copy of
``examples/calc_agent``; the built wheel is installed into a clean venv and its
console scripts are run, once against a local fake chat-completions endpoint.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import functools
import hashlib
import importlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.bundle import BundleError, BundleInfo, build, build_bundle, inspect_bundle
from osmosis_harbor.bundle import builder as bundle_mod
from osmosis_harbor.bundle import cache as cache_mod
from osmosis_harbor.bundle.project import load_project
from osmosis_harbor.bundle.shim import Shim, load_shim
from osmosis_harbor.bundle.targets import resolve_targets
from osmosis_harbor.cli.bundle import cli_main
from tests.support.common import run_cli

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "calc_agent"
WORKFLOW = "calc_agent.workflow:CalcWorkflow"
WORKFLOW_CONFIG = "calc_agent.workflow:calc_config"
GRADER = "calc_agent.grader:CalcGrader"
GRADER_CONFIG = "calc_agent.grader:calc_grader_config"
FULL = dict(workflow=WORKFLOW, workflow_config=WORKFLOW_CONFIG, grader=GRADER, grader_config=GRADER_CONFIG)
PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
dependencies = [{deps}]
"""
WORKFLOW_SRC = """\
from osmosis_ai.rollout import AgentWorkflow

class Flow(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]
"""


def copy_example(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    shutil.copytree(EXAMPLE, dest, ignore=ignore)
    return dest


def make_project(root: Path, package: str = "tiny_agent", *, deps: str = '"osmosis-ai>=0.3.8"', **modules: str) -> Path:
    """A minimal project: pyproject + one package with the given modules."""
    (root / package).mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT.format(name=package.replace("_", "-"), deps=deps))
    (root / package / "__init__.py").write_text("")
    for name, source in {"flow": WORKFLOW_SRC, **modules}.items():
        (root / package / f"{name}.py").write_text(source)
    return root


def key_of(code_dir: Path, shim: Shim | None = None, **targets) -> str:
    """The cache key, computed the way build() does, without building."""
    project = load_project(code_dir)
    resolved = resolve_targets(
        project.package,
        workflow=targets.get("workflow"),
        workflow_config=targets.get("workflow_config"),
        grader=targets.get("grader"),
        grader_config=targets.get("grader_config"),
    )
    return cache_mod.compute_key(project, resolved, shim or load_shim())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_example(tmp_path / "calc_agent")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> BundleInfo:
    """One cold build of the full example, shared by the read-only tests."""
    root = tmp_path_factory.mktemp("built")
    return build_bundle(copy_example(root / "calc_agent"), **FULL, cache_dir=root / "cache")


# --------------------------------------------------------------------------- the wheel


def test_bundle_contents(built: BundleInfo) -> None:
    assert built.package == "calc_agent"
    assert built.distribution == "calc-agent" and built.version == "0.1.0"
    assert built.agent_script == "calc-agent-agent" and built.grade_script == "calc-agent-grade"
    assert (built.workflow, built.workflow_config, built.grader, built.grader_config) == (
        WORKFLOW,
        WORKFLOW_CONFIG,
        GRADER,
        GRADER_CONFIG,
    )
    assert built.dependencies == ["osmosis-ai<0.4,>=0.3.8"]
    assert built.shim_version == load_shim().version
    assert built.wheel.parent.name == built.key[:16] and len(built.key) == 64

    with zipfile.ZipFile(built.wheel) as zf:
        names = zf.namelist()
        infos = zf.infolist()
        module = zf.read("_osmosis_bundle_calc_agent.py").decode()
        entry_points = zf.read("calc_agent-0.1.0.dist-info/entry_points.txt").decode()
        record = zf.read("calc_agent-0.1.0.dist-info/RECORD").decode()
        files = {n: zf.read(n) for n in names}
    assert {"osmosis_harbor_shim/agent.py", "osmosis_harbor_shim/verifier.py", "calc_agent/workflow.py"} <= set(names)
    assert names[-1] == "calc_agent-0.1.0.dist-info/RECORD"
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) and i.external_attr >> 16 == 0o100644 for i in infos)
    assert f"WORKFLOW = {WORKFLOW!r}" in module and f"GRADER_CONFIG = {GRADER_CONFIG!r}" in module
    assert "calc-agent-agent = _osmosis_bundle_calc_agent:agent_main" in entry_points
    assert "calc-agent-grade = _osmosis_bundle_calc_agent:grade_main" in entry_points
    # RECORD covers every other file with its real hash and size.
    rows = {row[0]: row[1:] for row in csv.reader(record.splitlines())}
    assert set(rows) == set(names)
    for name, data in files.items():
        if not name.endswith("RECORD"):
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert rows[name] == [f"sha256={digest}", str(len(data))], name
    # The shim refers to itself under its new name only.
    assert all(b"osmosis_harbor.shim" not in d for n, d in files.items() if n.startswith("osmosis_harbor_shim/"))


def test_inspect_round_trip(built: BundleInfo, tmp_path: Path) -> None:
    assert inspect_bundle(built.wheel) == built
    moved = tmp_path / built.wheel.name  # a prebuilt wheel passed as bundle= may live anywhere
    shutil.copy(built.wheel, moved)
    assert inspect_bundle(moved).model_dump(exclude={"wheel"}) == built.model_dump(exclude={"wheel"})
    assert built.console_scripts == {
        "calc-agent-agent": "_osmosis_bundle_calc_agent:agent_main",
        "calc-agent-grade": "_osmosis_bundle_calc_agent:grade_main",
    }


def test_inspect_rejects_non_bundles(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="does not exist"):
        inspect_bundle(tmp_path / "missing-0.1-py3-none-any.whl")
    plain = tmp_path / "plain-0.1-py3-none-any.whl"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("plain/__init__.py", "")
        zf.writestr("plain-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: plain\nVersion: 0.1\n")
    with pytest.raises(BundleError, match="not an Osmosis bundle"):
        inspect_bundle(plain)
    junk = tmp_path / "junk-0.1-py3-none-any.whl"
    junk.write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="not a readable wheel"):
        inspect_bundle(junk)


def test_reproducible_bytes(built: BundleInfo, tmp_path: Path) -> None:
    # Another copy of the project, elsewhere, into another cache: the same bytes.
    again = build_bundle(copy_example(tmp_path / "elsewhere" / "calc_agent"), **FULL, cache_dir=tmp_path / "c2")
    assert again.key == built.key
    assert again.wheel != built.wheel
    assert again.wheel.read_bytes() == built.wheel.read_bytes()


def test_grader_only_bundle(project: Path, tmp_path: Path) -> None:
    info = build_bundle(project, workflow=None, grader=GRADER, cache_dir=tmp_path / "cache")
    assert info.agent_script is None and info.grade_script == "calc-agent-grade"
    with zipfile.ZipFile(info.wheel) as zf:
        assert "calc-agent-agent" not in zf.read("calc_agent-0.1.0.dist-info/entry_points.txt").decode()


# --------------------------------------------------------------------------- the cache


def test_cache_hit_builds_nothing(built: BundleInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes a hit fast (it only hashes files) is what is asserted: no build, no import.
    How fast it is belongs to ``bench`` (``--only bundle``)."""

    def boom(*_a, **_k):
        raise AssertionError("a cache hit must not build or import anything")

    monkeypatch.setattr(bundle_mod, "build_wheel", boom)
    monkeypatch.setattr(bundle_mod, "verify_targets", boom)
    code_dir = built.wheel.parents[2] / "calc_agent"
    result = build(code_dir, **FULL, cache_dir=built.wheel.parents[1])
    assert result.cached and result.info == built


def test_cache_miss_on_every_input(project: Path) -> None:
    base = key_of(project, **FULL)
    assert key_of(project, **FULL) == base

    seen = {base}

    def changed(key: str) -> None:
        assert key not in seen
        seen.add(key)

    # A selected class, a config, a grader.
    changed(key_of(project, **{**FULL, "workflow": "calc_agent.variants:ListWorkflow"}))
    changed(key_of(project, **{**FULL, "workflow_config": None}))
    changed(key_of(project, **{**FULL, "grader": None, "grader_config": None}))
    # The shim: its version, and any byte of it.
    shim = load_shim()
    changed(key_of(project, shim=dataclasses.replace(shim, version=shim.version + ".1"), **FULL))
    files = {**shim.files, "agent.py": shim.files["agent.py"] + b"\n"}
    changed(key_of(project, shim=dataclasses.replace(shim, files=files), **FULL))
    # One byte of a source file, pyproject.toml, a new data file.
    source = project / "calc_agent" / "workflow.py"
    original = source.read_bytes()
    source.write_bytes(original.replace(b"temperature: float = 1.0", b"temperature: float = 0.5"))
    changed(key_of(project, **FULL))
    source.write_bytes(original)
    assert key_of(project, **FULL) == base
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.1.1"'))
    changed(key_of(project, **FULL))
    (project / "calc_agent" / "prompts.txt").write_text("x")
    changed(key_of(project, **FULL))


def test_new_shim_version_rebuilds(built: BundleInfo, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shim = load_shim()
    monkeypatch.setattr(bundle_mod, "load_shim", lambda: dataclasses.replace(shim, version="999"))
    result = build(project, **FULL, cache_dir=built.wheel.parents[1])
    assert not result.cached and result.info.key != built.key and result.info.shim_version == "999"


def test_cache_ignores_build_noise(project: Path) -> None:
    base = key_of(project, **FULL)
    for noise in (
        "__pycache__/x.pyc",
        "calc_agent/__pycache__/w.cpython-312.pyc",
        ".git/HEAD",
        "build/lib/x.py",
        "dist/old.whl",
        "calc_agent.egg-info/PKG-INFO",
        ".venv/pyvenv.cfg",
        ".pytest_cache/v",
    ):
        (project / noise).parent.mkdir(parents=True, exist_ok=True)
        (project / noise).write_text("noise")
    assert key_of(project, **FULL) == base


def test_changed_byte_rebuilds(built: BundleInfo, project: Path) -> None:
    cache = built.wheel.parents[1]  # the module's cache: a fresh copy of the project hits it
    first = build(project, **FULL, cache_dir=cache)
    assert first.cached and first.info.wheel == built.wheel
    source = project / "calc_agent" / "workflow.py"
    source.write_text(source.read_text() + "\n# changed\n")
    second = build(project, **FULL, cache_dir=cache)
    assert not second.cached and second.info.key != first.info.key
    with zipfile.ZipFile(second.info.wheel) as zf:
        assert zf.read("calc_agent/workflow.py").decode().endswith("# changed\n")
    assert built.wheel.is_file()  # the old entry stays valid for whoever holds it
    assert {first.info.key[:16], second.info.key[:16]} <= {p.name for p in cache.iterdir()}


def test_cache_dir_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The default is the user cache, never the working directory (a run inside a project must
    leave the project's files as they were)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cache_mod.ENV_CACHE_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_mod.cache_root(None) == tmp_path / "xdg" / "osmosis-harbor" / "bundles"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_mod.cache_root(None) == tmp_path / "home" / ".cache" / "osmosis-harbor" / "bundles"
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "env"))
    assert cache_mod.cache_root(None) == tmp_path / "env"
    assert cache_mod.cache_root(Path("explicit")) == tmp_path / "explicit"


def test_cache_inside_project_is_excluded(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, "bundles")  # a cache inside the project, chosen
    first = build_bundle(project, workflow=WORKFLOW)
    assert first.wheel.is_relative_to(project / "bundles")
    assert build(project, workflow=WORKFLOW).cached  # its own output did not change the key
    with pytest.raises(BundleError, match="project directory itself"):
        build_bundle(project, workflow=WORKFLOW, cache_dir=project)
    # Built later with another cache, the old one inside the project (CACHEDIR.TAG) is still skipped.
    monkeypatch.chdir(project.parent)
    assert (project / "bundles" / "CACHEDIR.TAG").is_file()
    assert key_of(project, workflow=WORKFLOW) == first.key


def test_publish_loser_discards_its_result(tmp_path: Path) -> None:
    key = "ab" * 32
    winner = tmp_path / key[:16]
    winner.mkdir()
    (winner / "w-1-py3-none-any.whl").write_bytes(b"winner")
    staged = tmp_path / ".tmp-x" / "entry"
    staged.mkdir(parents=True)
    (staged / "w-1-py3-none-any.whl").write_bytes(b"loser")
    assert cache_mod.publish(staged, tmp_path, key).read_bytes() == b"winner"


def test_concurrent_builders(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("spawn")
    worker = functools.partial(build, workflow=WORKFLOW, grader=GRADER, cache_dir=cache)
    barrier = ctx.Barrier(4)  # every worker starts only when all four are up
    with ctx.Pool(4, initializer=barrier.wait) as pool:
        outcomes = pool.map(worker, [project] * 4, chunksize=1)
    assert sum(not o.cached for o in outcomes) >= 2  # they really raced: several built a wheel
    results = [o.info for o in outcomes]
    assert len({r.wheel for r in results}) == 1
    assert len({r.key for r in results}) == 1
    entries = [p for p in cache.iterdir() if p.name != "CACHEDIR.TAG"]  # no scratch dirs, no partial files
    assert [e.name for e in entries] == [results[0].key[:16]]
    assert [p.name for p in entries[0].iterdir()] == [results[0].wheel.name]
    assert inspect_bundle(results[0].wheel) == results[0]


# --------------------------------------------------------------------------- objects as targets


@pytest.fixture
def calc_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple]:
    """The example's modules imported into this process (as a user script would)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield importlib.import_module("calc_agent.workflow"), importlib.import_module("calc_agent.grader")
    for name in [m for m in sys.modules if m == "calc_agent" or m.startswith("calc_agent.")]:
        del sys.modules[name]


def test_objects_become_import_paths(calc_modules, project: Path, tmp_path: Path) -> None:
    workflow, grader = calc_modules
    info = build_bundle(
        project,
        workflow=workflow.CalcWorkflow,
        workflow_config=workflow.calc_config,
        grader=grader.CalcGrader,
        grader_config=grader.calc_grader_config,
        cache_dir=tmp_path / "cache",
    )
    assert (info.workflow, info.workflow_config, info.grader, info.grader_config) == (
        WORKFLOW,
        WORKFLOW_CONFIG,
        GRADER,
        GRADER_CONFIG,
    )
    assert key_of(project, **FULL) == info.key


def test_config_object_must_be_module_level(calc_modules, project: Path, tmp_path: Path) -> None:
    workflow, _ = calc_modules
    with pytest.raises(BundleError, match="config must be a module-level object"):
        build_bundle(
            project,
            workflow=workflow.CalcWorkflow,
            workflow_config=workflow.CalcConfig(name="local"),
            cache_dir=tmp_path / "cache",
        )


class OutsideWorkflow:  # defined in the test module, not in the project's package
    pass


def test_class_outside_package(project: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="outside the project's package 'calc_agent'"):
        build_bundle(project, workflow=OutsideWorkflow, cache_dir=tmp_path / "cache")

    def factory():
        class Local:
            pass

        return Local

    with pytest.raises(BundleError, match="inside a function"):
        build_bundle(project, workflow=factory(), cache_dir=tmp_path / "cache")


# --------------------------------------------------------------------------- user errors


def test_error_no_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    with pytest.raises(BundleError, match="no pyproject.toml"):
        build_bundle(tmp_path, workflow="pkg.flow:Flow", cache_dir=tmp_path / "cache")


def test_error_package_count(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    (root / "other_pkg").mkdir()
    (root / "other_pkg" / "__init__.py").write_text("")
    (root / "tests").mkdir()  # never counted as a package
    (root / "tests" / "__init__.py").write_text("")
    with pytest.raises(BundleError, match=r"several top-level packages \(other_pkg, tiny_agent\)"):
        build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "pyproject.toml").write_text(PYPROJECT.format(name="empty", deps='"osmosis-ai"'))
    with pytest.raises(BundleError, match="no import package found"):
        build_bundle(empty, workflow="x.y:Z", cache_dir=tmp_path / "cache")


def test_src_layout(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    (root / "src").mkdir()
    shutil.move(root / "tiny_agent", root / "src" / "tiny_agent")
    info = build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    with zipfile.ZipFile(info.wheel) as zf:
        assert "tiny_agent/flow.py" in zf.namelist()


def test_error_missing_osmosis_dependency(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", deps='"httpx"')
    with pytest.raises(BundleError, match=r"osmosis-ai is missing from \[project\].dependencies"):
        build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    root2 = make_project(tmp_path / "p2", deps='"osmosis-ai[server]>=0.3.8; python_version >= \\"3.12\\""')
    assert build_bundle(root2, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache").wheel.is_file()


def test_error_dynamic_dependencies_without_osmosis(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    pyproject = (
        (root / "pyproject.toml")
        .read_text()
        .replace('dependencies = ["osmosis-ai>=0.3.8"]', 'dynamic = ["dependencies"]')
    )
    (root / "pyproject.toml").write_text(
        pyproject + '\n[tool.setuptools.dynamic]\ndependencies = {file = ["requirements.txt"]}\n'
    )
    (root / "requirements.txt").write_text("httpx\n")
    with pytest.raises(BundleError, match="osmosis-ai is missing from the dependencies .*dynamic"):
        build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")


def test_host_only_dependencies_stay_out_of_the_sandbox(tmp_path: Path) -> None:
    """osmosis-harbor, harbor and docker (any extras, any source, a local wheel included) serve
    trials on the host: the wheel's METADATA and the requirements the image installs leave them
    out, and keep everything else as declared."""
    local_wheel = (tmp_path / "wheels" / "osmosis_harbor-0.1.0-py3-none-any.whl").as_uri()
    deps = ", ".join(
        f'"{d}"'
        for d in (
            "osmosis-ai>=0.3.8",
            f"osmosis-harbor @ {local_wheel}",
            "Harbor[skypilot]>=0.25",
            "docker>=7; python_version >= '3.8'",
            "httpx>=0.27",
        )
    )
    root = make_project(tmp_path / "p", deps=deps)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + '\n[tool.uv.sources]\nosmosis-harbor = { path = "/x", editable = true }\n'
    )
    info = build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    assert info.dependencies == ["osmosis-ai>=0.3.8", "httpx>=0.27"]
    with zipfile.ZipFile(info.wheel) as zf:
        metadata = zf.read("tiny_agent-0.1.0.dist-info/METADATA").decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires == ["Requires-Dist: osmosis-ai>=0.3.8", "Requires-Dist: httpx>=0.27"]
    assert "Name: tiny-agent" in metadata and "Version: 0.1.0" in metadata  # the rest as built


@pytest.mark.parametrize(
    ("deps", "sources", "message"),
    [
        (
            '"osmosis-ai>=0.3.8", "mylib @ file:///home/me/mylib"',
            "",
            r"'mylib @ file:///home/me/mylib' points at file:///home/me/mylib, a path on this machine .*"
            r"published version .*\[dependency-groups\] dev",
        ),
        (
            '"osmosis-ai>=0.3.8", "mylib"',
            'mylib = { path = "../mylib", editable = true }',
            r"\[tool.uv.sources\] .* takes mylib from the local path ../mylib.*\[dependency-groups\] dev",
        ),
        (
            '"osmosis-ai>=0.3.8", "mylib"',
            "mylib = { workspace = true }",
            r"takes mylib from a uv workspace member",
        ),
        (
            '"osmosis-ai>=0.3.8", "mylib"',
            'mylib = { git = "https://example.com/mylib.git" }',
            r"takes mylib from git https://example.com/mylib.git.*direct reference",
        ),
    ],
)
def test_local_dependencies_refused_before_any_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deps: str, sources: str, message: str
) -> None:
    root = make_project(tmp_path / "p", deps=deps)
    if sources:
        (root / "pyproject.toml").write_text(
            (root / "pyproject.toml").read_text() + f"\n[tool.uv.sources]\n{sources}\n"
        )
    monkeypatch.setattr(bundle_mod, "build_wheel", lambda *a, **k: pytest.fail("built despite the refusal"))
    with pytest.raises(BundleError, match=message):
        build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")


def test_local_dependency_of_a_build_backend_refused(tmp_path: Path) -> None:
    """A dynamic dependency (or a backend's path dependency) shows only in the built METADATA:
    refused there, before an image installs it; a host-only one is left out there too."""
    root = make_project(tmp_path / "p")
    pyproject = (
        (root / "pyproject.toml")
        .read_text()
        .replace('dependencies = ["osmosis-ai>=0.3.8"]', 'dynamic = ["dependencies"]')
    )
    (root / "pyproject.toml").write_text(
        pyproject + '\n[tool.setuptools.dynamic]\ndependencies = {file = ["requirements.txt"]}\n'
    )
    (root / "requirements.txt").write_text("osmosis-ai>=0.3.8\nosmosis-harbor @ file:///opt/oh.whl\n")
    info = build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    assert info.dependencies == ["osmosis-ai>=0.3.8"]
    (root / "requirements.txt").write_text("osmosis-ai>=0.3.8\nmylib @ file:///opt/mylib\n")
    with pytest.raises(BundleError, match=r"the wheel built from .* requires 'mylib @ file:///opt/mylib'"):
        build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")


def test_error_symlinked_directory(project: Path, tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (project / "calc_agent" / "shared").symlink_to(tmp_path / "shared", target_is_directory=True)
    with pytest.raises(BundleError, match="symlinked directory"):
        build_bundle(project, workflow=WORKFLOW, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workflow": "calc_agent.workflow"}, "not an import path"),
        ({"workflow": "calc_agent.nope:Flow"}, "there is no module 'calc_agent.nope' in the project"),
        ({"workflow": "calc_agent.workflow:Nope"}, "has no attribute 'Nope'"),
        ({"workflow": GRADER}, "not a subclass of osmosis_ai AgentWorkflow"),
        ({"workflow": WORKFLOW, "grader": WORKFLOW}, "not a subclass of osmosis_ai Grader"),
        (
            {"workflow": WORKFLOW, "workflow_config": GRADER_CONFIG},
            "a config must be a module-level osmosis_ai AgentWorkflowConfig",
        ),
        ({"workflow": WORKFLOW, "workflow_config": WORKFLOW}, "a config must be"),
        ({"workflow": "os.path:join"}, "outside the project's package"),
        ({"workflow": None}, "nothing to bundle"),
        ({"workflow": None, "workflow_config": WORKFLOW_CONFIG, "grader": GRADER}, "without workflow="),
    ],
)
def test_error_targets(project: Path, tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(BundleError, match=message):
        build_bundle(project, **kwargs, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_error_import_time_failure_shows_traceback(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", broken="import json\n\ndef helper():\n    return 1 / 0\n\nVALUE = helper()\n")
    with pytest.raises(BundleError, match=r"(?s)not importable.*tiny_agent/broken.py.*ZeroDivisionError"):
        build_bundle(root, workflow="tiny_agent.broken:Flow", cache_dir=tmp_path / "cache")


def test_error_abstract_workflow(tmp_path: Path) -> None:
    root = make_project(
        tmp_path / "p",
        abstract="from osmosis_ai.rollout import AgentWorkflow\n\nclass Half(AgentWorkflow):\n    pass\n",
    )
    with pytest.raises(BundleError, match=r"abstract \(unimplemented: run\)"):
        build_bundle(root, workflow="tiny_agent.abstract:Half", cache_dir=tmp_path / "cache")


def test_user_code_never_imported_into_host(tmp_path: Path) -> None:
    marker = tmp_path / "imported-in"
    side_effect = f"import os\nopen({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
    root = make_project(tmp_path / "p", "host_probe_pkg", flow=side_effect + WORKFLOW_SRC)
    build_bundle(root, workflow="host_probe_pkg.flow:Flow", cache_dir=tmp_path / "cache")
    assert "host_probe_pkg" not in sys.modules
    pids = marker.read_text().split()
    assert pids and str(os.getpid()) not in pids  # imported, but in a subprocess


def test_missing_third_party_module_only_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_project(
        tmp_path / "p", deps='"osmosis-ai", "not-installed-here"', flow="import not_installed_here\n" + WORKFLOW_SRC
    )
    info = build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    assert info.dependencies == ["osmosis-ai", "not-installed-here"]
    assert "module 'not_installed_here' is not installed here" in caplog.text


def test_error_build_backend_failure(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    with (root / "pyproject.toml").open("a") as fh:
        fh.write('\n[tool.setuptools]\npackages = ["tiny_agent", "no_such_dir"]\n')
    with pytest.raises(BundleError, match=r"(?s)build backend of .* failed.*output tail.*no_such_dir"):
        build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["CACHEDIR.TAG"]  # nothing published, no scratch


def test_error_script_name_taken(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    with (root / "pyproject.toml").open("a") as fh:
        fh.write('\n[project.scripts]\ntiny-agent-agent = "tiny_agent.flow:main"\n')
    with pytest.raises(BundleError, match="already defines the console script 'tiny-agent-agent'"):
        build_bundle(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")


def test_isolated_build_when_backend_not_importable(tmp_path: Path) -> None:
    pytest.importorskip("build")
    try:
        importlib.import_module("flit_core")
        pytest.skip("flit_core is importable here: the build would not be isolated")
    except ImportError:
        pass
    root = make_project(tmp_path / "p")
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml")
        .read_text()
        .replace('requires = ["setuptools>=69"]', 'requires = ["flit_core>=3.9,<4"]')
        .replace('"setuptools.build_meta"', '"flit_core.buildapi"')
        .replace('version = "0.1.0"', 'version = "0.1.0"\ndescription = "tiny"')
    )
    result = build(root, workflow="tiny_agent.flow:Flow", cache_dir=tmp_path / "cache")
    assert result.isolated is True
    with zipfile.ZipFile(result.info.wheel) as zf:
        assert "tiny_agent/flow.py" in zf.namelist()
        assert "flit" in zf.read("tiny_agent-0.1.0.dist-info/WHEEL").decode()


# --------------------------------------------------------------------------- CLI


def test_cli_json(built: BundleInfo, capsys: pytest.CaptureFixture) -> None:
    code_dir, cache = built.wheel.parents[2] / "calc_agent", built.wheel.parents[1]
    argv = [
        str(code_dir),
        "--workflow",
        WORKFLOW,
        "--workflow-config",
        WORKFLOW_CONFIG,
        "--grader",
        GRADER,
        "--grader-config",
        GRADER_CONFIG,
        "--out",
        str(cache),
        "--json",
    ]
    assert cli_main(argv, settings.current()) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["wheel"] == str(built.wheel) and payload["key"] == built.key and payload["cached"] is True
    assert payload["console_scripts"] == {
        "calc-agent-agent": "_osmosis_bundle_calc_agent:agent_main",
        "calc-agent-grade": "_osmosis_bundle_calc_agent:grade_main",
    }
    assert payload["dependencies"] == ["osmosis-ai<0.4,>=0.3.8"]
    assert {k: payload[k] for k in ("workflow", "grader_config", "shim_version", "package")} == built.model_dump(
        include={"workflow", "grader_config", "shim_version", "package"}
    )


def test_cli_human_and_errors(built: BundleInfo, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code_dir, cache = built.wheel.parents[2] / "calc_agent", built.wheel.parents[1]
    argv = [
        str(code_dir),
        "--workflow",
        WORKFLOW,
        "--workflow-config",
        WORKFLOW_CONFIG,
        "--grader",
        GRADER,
        "--grader-config",
        GRADER_CONFIG,
        "--out",
        str(cache),
    ]
    assert cli_main(argv, settings.current()) == 0
    out = capsys.readouterr().out
    assert "cache hit" in out and "calc-agent-agent" in out and "calc-agent-grade" in out
    assert cli_main([str(tmp_path), "--workflow", WORKFLOW, "--out", str(tmp_path / "cache")], settings.current()) == 2
    assert "no pyproject.toml" in capsys.readouterr().err
    assert cli_main([str(code_dir), "--out", str(tmp_path / "cache"), "--json"], settings.current()) == 2
    assert "nothing to bundle" in json.loads(capsys.readouterr().out)["error"]
    assert cli_main(["--help"], settings.current()) == 0
    assert cli_main(["--bogus"], settings.current()) == 2


@pytest.mark.parametrize(
    "pyproject", [None, '[build-system]\nrequires = ["setuptools"]\n'], ids=["no-pyproject", "no-project-table"]
)
def test_cli_errors_keep_their_brackets_and_exit_2(tmp_path: Path, pyproject: str | None) -> None:
    """rich markup would eat ``[build-system]`` and ``[project]`` from the one-line error."""
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    if pyproject is not None:
        (project / "pyproject.toml").write_text(pyproject)
    proc = run_cli("bundle", str(project), "--workflow", "pkg.flow:Flow", "--out", str(tmp_path / "cache"), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "[project]" in proc.stderr
    if pyproject is None:
        assert "[build-system]" in proc.stderr


# --------------------------------------------------------------------------- installed and run


@pytest.fixture(scope="module")
def installed(built: BundleInfo, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The bundle pip-installed (no deps) into a clean venv; osmosis_ai/pydantic come from PYTHONPATH."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(built.wheel),
        ],
        check=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "PYTHON"))}
    env["PYTHONPATH"] = sysconfig.get_path("purelib")  # the host's site-packages, no .pth processing
    return venv / "bin", env


def test_installed_scripts_resolve(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bin_dir, env = installed
    env = {**env, "OSMOSIS_LOGS_DIR": str(tmp_path / "logs"), "OSMOSIS_ROLLOUT_INPUT": str(tmp_path / "none.json")}
    proc = subprocess.run([bin_dir / "calc-agent-agent"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    error = json.loads((tmp_path / "logs" / "agent" / "error.json").read_text())
    assert error["phase"] == "agent" and "RolloutInput" in error["message"]
    # The shim ran from the wheel, not from this checkout.
    assert "site-packages/osmosis_harbor_shim/" in error["traceback"]


class FakeChat(BaseHTTPRequestHandler):
    """A chat-completions endpoint that always proposes the same shell command."""

    reply = "Let me compute it.\n```sh\necho $((6 * 7))\n```"
    streaming = True  # answer stream=True requests with server-sent events
    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        if body.get("stream") and self.streaming:
            chunks = [self.reply[:10], self.reply[10:]]
            payload = (
                "".join(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': c}}]})}\n\n" for c in chunks)
                + "data: [DONE]\n\n"
            )
            content_type = "text/event-stream"
        else:
            payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply}}]})
            content_type = "application/json"
        data = payload.encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def fake_chat() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeChat.requests = []
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1/rollouts/r-1"
    finally:
        server.shutdown()
        server.server_close()


def test_installed_example_runs_end_to_end(installed, fake_chat: str, tmp_path: Path) -> None:
    """calc-agent-agent asks the (fake) policy, runs its command, and calc-agent-grade rewards it."""
    bin_dir, env = installed
    workdir = tmp_path / "work"  # /workspace does not exist here: the example falls back to its cwd
    workdir.mkdir()
    (tmp_path / "rollout.json").write_text(
        json.dumps({"rollout_id": "r-1", "prompt": [{"role": "user", "content": "What is 6 times 7?"}]})
    )
    (tmp_path / "grading.json").write_text(json.dumps({"rollout_id": "r-1", "label": "42"}))
    env = {
        **env,
        "OSMOSIS_LOGS_DIR": str(tmp_path / "logs"),
        "OSMOSIS_ROLLOUT_INPUT": str(tmp_path / "rollout.json"),
        "OSMOSIS_GRADING_INPUT": str(tmp_path / "grading.json"),
        "OSMOSIS_CHAT_COMPLETIONS_URL": fake_chat,
        "OSMOSIS_API_KEY": "sk-test-key-0123456789",
    }
    agent = subprocess.run(
        [bin_dir / "calc-agent-agent"], cwd=workdir, env=env, capture_output=True, text=True, timeout=60
    )
    assert agent.returncode == 0, agent.stdout + agent.stderr
    assert (workdir / "answer.txt").read_text() == "42\n"
    sample = json.loads((tmp_path / "logs" / "agent" / "sample.json").read_text())
    assert sample["messages"][-1]["content"].startswith("$ echo $((6 * 7))\n42\n")
    assert sample["metrics"]["exit_code"] == 0.0
    assert FakeChat.requests[0]["path"] == "/v1/rollouts/r-1/chat/completions"
    assert FakeChat.requests[0]["auth"] == "Bearer sk-test-key-0123456789"

    grade = subprocess.run(
        [bin_dir / "calc-agent-grade"], cwd=workdir, env=env, capture_output=True, text=True, timeout=60
    )
    assert grade.returncode == 0, grade.stdout + grade.stderr
    assert json.loads((tmp_path / "logs" / "verifier" / "reward.json").read_text()) == {"reward": 1.0}


async def test_example_workflow_in_process(fake_chat: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example against a non-streaming endpoint, with an artifacts dir, and its grader."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    try:
        from calc_agent.grader import CalcGrader, calc_grader_config
        from calc_agent.workflow import CalcConfig, CalcWorkflow, to_command
        from osmosis_ai.rollout import AgentWorkflowContext, GraderContext, RolloutContext, RolloutSample

        (tmp_path / "art").mkdir()
        config = CalcConfig(workdir=str(tmp_path))
        monkeypatch.setattr(FakeChat, "reply", "(6 * 7)")  # a bare expression this time
        monkeypatch.setattr(FakeChat, "streaming", False)  # and a plain JSON response
        ctx = AgentWorkflowContext(
            prompt=[{"role": "user", "content": "6*7?"}], config=config, artifacts_dir=tmp_path / "art"
        )
        with RolloutContext(chat_completions_url=fake_chat, api_key=None, rollout_id="r-1"):
            output = await CalcWorkflow(config).run(ctx)
        assert (tmp_path / "answer.txt").read_text() == "42\n"
        assert (tmp_path / "art" / "stdout.txt").read_text() == "42\n"
        assert output.metrics["exit_code"] == 0.0 and FakeChat.requests[0]["auth"] is None

        grader_config = calc_grader_config.model_copy(update={"workdir": str(tmp_path)})
        gctx = GraderContext(label="42.0", sample=RolloutSample(messages=output.messages))
        assert await CalcGrader(grader_config).grade(gctx) == 1.0 and gctx.sample.reward == 1.0
        gctx = GraderContext(label="41", sample=RolloutSample(messages=output.messages))
        assert await CalcGrader(grader_config).grade(gctx) == 0.0

        assert to_command("```bash\nls -l\n```") == "ls -l"
        assert to_command("I think it's 7").startswith("echo ")
    finally:
        for name in [m for m in sys.modules if m == "calc_agent" or m.startswith("calc_agent.")]:
            del sys.modules[name]
