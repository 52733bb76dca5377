"""The offline stand-ins for public base images (``python -m osmosis_harbor base-images``, which runs the
packaged script ``scripts/base-images.sh`` wraps): checked against what the images really contain, a
Terminal-Bench style task run on one, an interrupted root file system build that must leave nothing
mounted, the command from any directory and the script in the wheel."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.support.common import FIXTURES, REPO, load_json, managed_containers, wait_until

SCRIPT = REPO / "scripts" / "base-images.sh"
UBUNTU_TASK = FIXTURES / "public-formats" / "ubuntu-task"
PRESENT = ("ubuntu:24.04", "python:3.13-slim")  # in base-images.sh's default list: bootstrap builds them

# What each stand-in is: Debian suite, and the Python it gets (bookworm 3.11, trixie 3.13; the
# closest to the tag's, Debian has no 3.12). The debian:*-slim ones have no Python, like the real ones.
EXPECTED = {
    "debian:bookworm-slim": ("debian/bookworm", "none"),
    "debian:trixie-slim": ("debian/trixie", "none"),
    "ubuntu:22.04": ("debian/bookworm", "3.11"),
    "ubuntu:jammy": ("debian/bookworm", "3.11"),
    "ubuntu:24.04": ("debian/trixie", "3.13"),
    "ubuntu:noble": ("debian/trixie", "3.13"),
    "python:3.11-slim": ("debian/bookworm", "3.11"),
    "python:3.11-slim-bookworm": ("debian/bookworm", "3.11"),
    "python:3.11-slim-trixie": ("debian/bookworm", "3.11"),
    "python:3.12-slim": ("debian/trixie", "3.13"),
    "python:3.12-slim-bookworm": ("debian/bookworm", "3.11"),
    "python:3.12-slim-trixie": ("debian/trixie", "3.13"),
    "python:3.13-slim": ("debian/trixie", "3.13"),
    "python:3.13-slim-bookworm": ("debian/trixie", "3.13"),
    "python:3.13-slim-trixie": ("debian/trixie", "3.13"),
}

# Run inside a stand-in: one JSON line of what it really has (uv only through the env file).
# `venv --without-pip` + ensurepip's bundled pip: a full `python3 -m venv` takes 15 s here.
INSPECT = r"""
set -u
. /etc/os-release
j() { printf '"%s": "%s", ' "$1" "$2"; }
printf '{'
j distribution "$ID/$VERSION_CODENAME"
j python "$(python3 -c 'import platform; print(platform.python_version())')"
j python_alias "$(command -v python || echo none)"
j pip "$(pip --version | cut -d' ' -f1-2)"
j venv "$(python3 -m venv --without-pip /tmp/v && /tmp/v/bin/python -c 'import sys; print(sys.prefix)')"
j ensurepip "$(python3 -c 'import ensurepip; print(ensurepip.version())')"
j curl "$(curl --version | head -1 | cut -d' ' -f1-2)"
j uv_before_env "$(command -v uv || echo none)"
. "$HOME/.local/bin/env"
j uv "$(uv --version)"
j uvx "$(uvx --version)"
j uv_pip_install "$(uv venv -q /tmp/u && uv pip install -q -p /tmp/u six==1.17.0 && /tmp/u/bin/python -c 'import six; print(six.__version__)')"
j system_pip_install "$(pip install -q six==1.17.0 >/dev/null 2>&1 && echo allowed || echo refused)"
j user_1000 "$(getent passwd 1000 | cut -d: -f1)"
j ssl_cert_file "${SSL_CERT_FILE:-}"
printf '"uv_system_certs": "%s"}\n' "${UV_SYSTEM_CERTS:-}"
"""


def base_images(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def list_rows(env: dict[str, str] | None = None) -> dict[str, tuple[str, str, str]]:
    proc = base_images("--list", env=env)
    assert proc.returncode == 0, proc.stderr
    header, *lines = proc.stdout.splitlines()
    assert header.split() == ["IMAGE", "REALLY", "PYTHON", "LOCAL"]
    rows = {}
    for line in lines:
        name, really, python, local = line.split(maxsplit=3)
        rows[name] = (really, python, local)
    return rows


@pytest.fixture(scope="session")
def stand_ins() -> tuple[str, ...]:
    """The stand-ins these tests inspect: already built by bootstrap (a no-op then); otherwise
    built here from the cached trixie root file system."""
    proc = base_images(*PRESENT)
    assert proc.returncode == 0, proc.stderr
    return PRESENT


@pytest.fixture(scope="session")
def inspected(stand_ins) -> dict[str, dict[str, str]]:
    """What each stand-in really has, asked of the image itself (not of the script)."""
    client = docker.from_env()
    found = {}
    for image in stand_ins:
        out = client.containers.run(image, ["bash", "-c", INSPECT], remove=True)
        found[image] = json.loads(out.decode().strip().splitlines()[-1])
    return found


def test_list_names_every_stand_in_and_what_a_present_one_really_is(inspected) -> None:
    rows = list_rows()
    assert set(rows) == set(EXPECTED)
    for image, found in inspected.items():
        really, python, local = rows[image]
        assert local == "present (stand-in)"
        assert (really, python) == (found["distribution"], found["python"])
        assert python.startswith(EXPECTED[image][1] + ".") and really == EXPECTED[image][0]


def test_list_gives_the_recipe_for_an_absent_stand_in(tmp_path: Path) -> None:
    """On an engine that has none of the stand-ins (a ``docker`` first on PATH that finds no image,
    every other command the real one's), each row says what its recipe would build."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\nif [ "$1 $2" = "image inspect" ]; then echo "Error: No such image" >&2; exit 1; fi\n'
        f'exec {shutil.which("docker")} "$@"\n'
    )
    fake.chmod(0o755)
    rows = list_rows(env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert rows == {name: (*EXPECTED[name], "absent") for name in EXPECTED}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["127.0.0.1:9/no-such/image:1"], "no recipe to build 127.0.0.1:9/no-such/image:1 offline"),
        (["--rootfs", "buster"], "unknown Debian suite 'buster'"),
        (["--bogus"], "unknown option --bogus"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], needle: str) -> None:
    proc = base_images(*args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[base-images] error:") and needle in lines[0], proc.stderr


def test_stand_ins_have_what_list_claims(inspected) -> None:
    rows = list_rows()
    ubuntu, python = inspected["ubuntu:24.04"], inspected["python:3.13-slim"]
    for image, found in inspected.items():
        assert found["python"] == rows[image][1]
        assert (
            found["pip"].startswith("pip ")
            and found["venv"] == "/tmp/v"
            and found["ensurepip"]
            and found["curl"].startswith("curl ")
        )
        # uv comes the way uv's installer leaves it: in ~/.local/bin, on PATH through its env file
        assert found["uv_before_env"] == "none"
        assert found["uv"].startswith("uv ") and found["uvx"].startswith("uvx ")
        assert found["uv_pip_install"] == "1.17.0"  # from PyPI, through the TLS proxy
        assert found["ssl_cert_file"] == "/etc/ssl/host-ca.crt" and found["uv_system_certs"] == "true"
    # the real images' differences that tasks notice
    assert python["python_alias"] == "/usr/local/bin/python" and python["system_pip_install"] == "allowed"
    assert ubuntu["python_alias"] == "none" and ubuntu["system_pip_install"] == "refused"  # PEP 668, as on noble
    assert ubuntu["user_1000"] == "ubuntu"


def run_validate(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "osmosis_harbor", "validate", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


@pytest.mark.slow
@pytest.mark.parametrize(("agent", "reward", "pytest_says"), [("oracle", 1.0, "3 passed"), ("nop", 0.0, "3 failed")])
def test_terminal_bench_style_ubuntu_task(
    stand_ins, tmp_path: Path, agent: str, reward: float, pytest_says: str
) -> None:
    """FROM ubuntu:24.04, and a verifier that installs uv with its installer and runs uvx pytest."""
    report_path = tmp_path / "report.json"
    # kept under tmp_path, so the test leaves no temp dir of its own behind
    proc, pid = run_validate(
        str(UBUNTU_TASK), "--agent", agent, "--trials-dir", str(tmp_path / "trials"), "--json", str(report_path)
    )
    assert report_path.exists(), proc.stdout + proc.stderr
    [task] = load_json(report_path)["tasks"]
    assert proc.returncode == 0 and task["passed"] and task["reward"] == reward, proc.stdout + proc.stderr
    # the verdict comes from pytest itself, not from a verifier that could not get uv
    assert pytest_says in (Path(task["trial_dir"]) / "verifier" / "test-stdout.txt").read_text()
    assert managed_containers(owner_pid=pid) == []


def mounts_under(path: Path) -> list[str]:
    prefix = str(path) + "/"
    return [
        line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if line.split()[1].startswith(prefix)
    ]


@pytest.fixture
def var_tmp_cache() -> Iterator[Path]:
    """A cache of its own, outside /tmp as the script's root file systems are."""
    path = Path(tempfile.mkdtemp(prefix="osmosis-harbor-test-", dir="/var/tmp"))
    yield path
    if not mounts_under(path):
        shutil.rmtree(path, ignore_errors=True)


# What debootstrap is doing when a build is interrupted in its second stage: its own session (the
# script starts it under setsid), /proc and /sys mounted in the target, and a process working in
# the target (dpkg there; here a reader of a file in it) beside it. The real debootstrap runs on
# every fresh machine's bootstrap; before it mounts anything it downloads and unpacks the whole
# package set (about 30 CPU-s), which the interruption's handling does not depend on.
DEBOOTSTRAP_MID_SECOND_STAGE = """#!/usr/bin/env bash
set -e
target="${@: -2:1}"
mkdir -p "$target/proc" "$target/sys" "$target/var/lib/dpkg"
mount -t proc proc "$target/proc"
mount -t sysfs sysfs "$target/sys"
: >"$target/var/lib/dpkg/status"
tail -f "$target/var/lib/dpkg/status" >/dev/null &
wait
"""


@pytest.fixture
def debootstrap_mid_second_stage(tmp_path: Path) -> dict[str, str]:
    """``PATH`` with :data:`DEBOOTSTRAP_MID_SECOND_STAGE` as ``debootstrap``, first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "debootstrap").write_text(DEBOOTSTRAP_MID_SECOND_STAGE)
    (bin_dir / "debootstrap").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.slow
def test_interrupted_rootfs_build_leaves_nothing_mounted(
    var_tmp_cache: Path, debootstrap_mid_second_stage: dict[str, str]
) -> None:
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--rootfs", "trixie"],
        cwd=REPO,
        start_new_session=True,
        env={**os.environ, **debootstrap_mid_second_stage, "OSMOSIS_HARBOR_CACHE": str(var_tmp_cache)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # debootstrap mounts /proc and /sys in the target when its second stage starts
        wait_until(
            lambda: len(mounts_under(var_tmp_cache)) == 2, timeout=120, what="debootstrap to mount in its target"
        )
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert mounts_under(var_tmp_cache) == []
    assert list((var_tmp_cache / "rootfs").glob("build-*")) == [] and not list((var_tmp_cache / "rootfs").glob("*.tar"))
    wait_until(
        lambda: not [p for p in Path("/proc").glob("[0-9]*") if str(var_tmp_cache).encode() in _cmdline(p)],
        timeout=30,
        what="no process left working in the interrupted build",
    )


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


# -- the command that runs from anywhere ---------------------------------------------------------


def verb(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_harbor", "base-images", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_command_runs_the_script_from_any_directory(tmp_path: Path) -> None:
    names = verb("--names", cwd=tmp_path)
    assert names.returncode == 0 and names.stdout == base_images("--names").stdout
    assert set(names.stdout.split()) == set(EXPECTED)
    listing = verb("--list", cwd=tmp_path)
    assert listing.returncode == 0 and listing.stdout.splitlines()[0].split() == ["IMAGE", "REALLY", "PYTHON", "LOCAL"]
    missing = verb("127.0.0.1:9/no-such/image:1", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        "[base-images] error: no recipe to build 127.0.0.1:9/no-such/image:1 offline "
        "(stand-ins: python -m osmosis_harbor base-images --list)"
    )
    mixed = verb("--list", "ubuntu:24.04", cwd=tmp_path)
    assert mixed.returncode == 2 and mixed.stderr == "error: base-images: --list takes no IMAGE (got ubuntu:24.04)\n"


def test_the_script_ships_in_the_wheel(tmp_path: Path) -> None:
    """Built from a copy of the project (a build writes into its source tree), then run from the
    unpacked wheel, far from any checkout."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "osmosis_harbor", source / "osmosis_harbor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("osmosis_harbor-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract("osmosis_harbor/sandbox/images/base-images.sh", tmp_path / "unpacked")
    script = tmp_path / "unpacked" / "osmosis_harbor" / "sandbox" / "images" / "base-images.sh"
    proc = subprocess.run(["bash", str(script), "--names"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and set(proc.stdout.split()) == set(EXPECTED)


@pytest.mark.slow
def test_a_stand_in_is_labelled_with_what_it_really_is(tmp_path: Path) -> None:
    """Built by the command (seconds once the suite's Python layer exists); the label the
    failure reports quote matches what the image itself says."""
    image = "python:3.13-slim-bookworm"
    proc = verb(image, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    labels = docker.from_env().images.get(image).labels
    found = docker.from_env().containers.run(
        image,
        ["sh", "-c", '. /etc/os-release; echo "$VERSION_ID $VERSION_CODENAME"; python3 -V; openssl version'],
        remove=True,
        network_mode="none",
    )
    release, python, openssl = found.decode().split("\n")[:3]
    version_id, codename = release.split()
    assert labels["osmosis-harbor.stand-in"] == image
    assert labels["osmosis-harbor.stand-in.really"] == (
        f"Debian {version_id} {codename}, Python {python.split()[1]}, OpenSSL {openssl.split()[1]}"
    )
    assert codename == "trixie"  # what makes a bookworm-checking task fail on it
