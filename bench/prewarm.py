"""Prewarm of a dataset whose tasks share environments: builds once per environment, and
a second prewarm (a new process) builds nothing.

Why: a dataset of N tasks usually has far fewer distinct environments K; prewarm must
build each environment image once (not once per task), and a restarted server must
reuse what exists instead of rebuilding. The first prewarm's time is what a cold start
costs; the second prewarm is the baseline a restart pays (existence checks plus the
per-environment agent-setup proof), so first / second is what the image reuse saves.

How: N copies of ``tasks/template`` whose Dockerfiles differ only in a unique marker per
environment (``FROM`` the template's own prewarmed image, so the builds are real docker
builds that need no network), in dataset mode. The second prewarm uses a fresh backend
and a fresh build coordinator, as a new process would. ``PrewarmReport.built`` must equal
K the first time and 0 the second; anything else prints a MISMATCH line. The images
built here are removed at the end of each repeat.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from .common import BenchResult, stopwatch
from .env import TEMPLATE, dispose, make_backend, remove_images, workdir

NAME = "prewarm"
TITLE = "prewarm of N tasks sharing K environments, then again from a new process"


@dataclass(frozen=True)
class Sizes:
    tasks: int
    environments: int
    repeats: int


def sizes(quick: bool) -> Sizes:
    return Sizes(tasks=8, environments=2, repeats=1) if quick else Sizes(tasks=8, environments=2, repeats=3)


def make_dataset(root: Path, base_image: str, tasks: int, environments: int) -> list[str]:
    """``tasks`` template copies over ``environments`` distinct Dockerfiles; returns task ids."""
    markers = [uuid.uuid4().hex for _ in range(environments)]
    ids = []
    for i in range(tasks):
        task_id = f"t{i:02d}"
        task = shutil.copytree(TEMPLATE, root / task_id)
        (task / "environment" / "Dockerfile").write_text(
            f"FROM {base_image}\nRUN echo {markers[i % environments]} > /bench-marker\nWORKDIR /workspace\n"
        )
        ids.append(task_id)
    return ids


async def template_image(work: Path) -> str:
    """The template task's prewarmed image (reused if present, else built once)."""
    backend = make_backend(work)
    try:
        image = (await backend.prewarm()).groups_detail[0].image
    finally:
        await dispose(backend)
    assert image, "the template prewarm produced no image"
    return image


async def run(quick: bool) -> BenchResult:
    size = sizes(quick)
    n, k = size.tasks, size.environments
    result = BenchResult(NAME, f"{TITLE} (N={n}, K={k})")
    work = workdir(NAME)
    first: list[float] = []
    second: list[float] = []
    build_sec: list[float] = []
    setup_first: list[float] = []
    setup_second: list[float] = []
    check_second: list[float] = []
    builds: list[int] = []
    rebuilds: list[int] = []
    try:
        base = await template_image(work / "template")
        result.info["base image"] = base
        for r in range(size.repeats):
            dataset = work / f"dataset-{r}"
            ids = make_dataset(dataset, base, n, k)
            built_images: list[str] = []
            try:
                cold = make_backend(work / f"cold-{r}", tasks_dir=dataset, task_mode="dataset")
                try:
                    with stopwatch() as t:  # a new backend: it knows no image, as a new process
                        report = await cold.prewarm(ids)
                finally:
                    await dispose(cold)
                built_images = [g.image for g in report.groups_detail if g.built and g.image]
                first.append(t[0])
                builds.append(report.built)
                build_sec += [g.timings_sec.get("image", 0.0) for g in report.groups_detail if g.built]
                setup_first += [g.timings_sec.get("setup", 0.0) for g in report.groups_detail]
                if report.built != k or report.groups != k or report.failed:
                    result.warn(
                        f"MISMATCH: first prewarm built {report.built} image(s) in {report.groups} "
                        f"group(s), {report.failed} failed; expected {k} builds in {k} groups"
                    )

                warm = make_backend(work / f"warm-{r}", tasks_dir=dataset, task_mode="dataset")
                try:
                    with stopwatch() as t:
                        again = await warm.prewarm(ids)
                finally:
                    await dispose(warm)
                second.append(t[0])
                rebuilds.append(again.built)
                setup_second += [g.timings_sec.get("setup", 0.0) for g in again.groups_detail]
                check_second += [g.timings_sec.get("image", 0.0) for g in again.groups_detail]
                if again.built != 0 or again.reused != k:
                    result.warn(
                        f"MISMATCH: second prewarm built {again.built} and reused {again.reused} "
                        f"image(s); expected 0 builds and {k} reused"
                    )
            finally:
                for problem in remove_images(built_images):
                    result.warn(f"image not removed: {problem}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    f_first = result.add(f"first prewarm ({n} tasks, {k} environments)", "s", first)
    f_second = result.add("second prewarm, new backend + coordinator", "s", second, baseline=True)
    result.ratio("first / second", f_first, f_second)
    result.add("  first: image build per environment", "s", build_sec, "docker build, in parallel")
    result.add("  first: agent-setup proof per environment", "s", setup_first, "sandbox + bundle install")
    result.add("  second: image existence check per environment", "s", check_second)
    result.add("  second: agent-setup proof per environment", "s", setup_second)
    result.info["builds performed, first prewarm (expected K each)"] = builds
    result.info["builds performed, second prewarm (expected 0)"] = rebuilds
    result.info["builds per run, first / second (median)"] = (
        f"{sorted(builds)[len(builds) // 2] if builds else '-'} / "
        f"{sorted(rebuilds)[len(rebuilds) // 2] if rebuilds else '-'}"
    )
    return result
