"""A failed image build, told on one screen: the failing step, its exit code, its output's tail
(bounded, the builder's colouring stripped, host secrets redacted), from either builder's output."""

from __future__ import annotations

import pytest

from osmosis_harbor.sandbox.images.build_failure import TAIL_BYTES, TAIL_LINES, parse_build_failure
from osmosis_harbor.shim.errors import REDACTED

REF = "osmosis-harbor/env:43944b0000000000"
# The bundle-dependency patch's RUN step is kilobytes long: the old one-line error showed only it.
PATCH_RUN = "{ command -v python3 >/dev/null && python3 -c 'import sys' ; } || exit 90; " + "x" * 2000
LEGACY = f"""Sending build context to Docker daemon  4.096kB
Step 1/4 : FROM python:3.12-slim
 ---> f1885a79b220
Step 2/4 : COPY osmosis-requirements.txt /opt/osmosis/requirements.txt
 ---> 1386ea34ab73
Step 3/4 : RUN {PATCH_RUN}
 ---> Running in 2841e33c39db
Collecting osmosis-ai>=0.3.8
\x1b[91mERROR: Could not find a version that satisfies the requirement mylib==9.9 (from versions: none)
ERROR: No matching distribution found for mylib==9.9
\x1b[0mThe command '/bin/sh -c {PATCH_RUN}' returned a non-zero code: 1
"""
BUILDKIT = """#5 [2/3] RUN echo one
#5 0.211 one
#5 DONE 0.3s
#6 [3/3] RUN pip install mylib==9.9
#6 0.501 Collecting mylib==9.9
#6 1.020 ERROR: No matching distribution found for mylib==9.9
#6 ERROR: process "/bin/sh -c pip install mylib==9.9" did not complete successfully: exit code: 2
------
 > [3/3] RUN pip install mylib==9.9:
------
ERROR: failed to solve: process "/bin/sh -c pip install mylib==9.9" did not complete successfully: exit code: 2
"""


def test_legacy_builder_output() -> None:
    failure = parse_build_failure(REF, LEGACY, f"The command '/bin/sh -c {PATCH_RUN}' returned a non-zero code: 1")
    assert failure.exit_code == 1
    assert failure.step is not None and failure.step.startswith("3/4 (RUN { command -v python3")
    assert len(failure.step) < 200 and failure.step.endswith("…)")  # the long command, shortened
    assert failure.tail.splitlines() == [
        "Collecting osmosis-ai>=0.3.8",
        "ERROR: Could not find a version that satisfies the requirement mylib==9.9 (from versions: none)",
        "ERROR: No matching distribution found for mylib==9.9",
    ]  # the step's own output: no builder colouring or bookkeeping, no repeat of the command
    head, header, *tail = failure.message().splitlines()
    assert head == f"docker build failed for {REF} at step {failure.step}, exit code 1"
    assert header == "--- build output (last lines) ---" and tail == failure.tail.splitlines()


def test_buildkit_output() -> None:
    failure = parse_build_failure(REF, BUILDKIT)
    assert failure.step == "3/3 (RUN pip install mylib==9.9)" and failure.exit_code == 2
    assert failure.tail.splitlines() == [
        "Collecting mylib==9.9",
        "ERROR: No matching distribution found for mylib==9.9",
    ]


def test_tail_is_bounded_and_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hunter2-" + "s" * 24
    monkeypatch.setenv("MY_REGISTRY_TOKEN", secret)
    noise = "".join(f"line {i} {'y' * 300}\n" for i in range(5000))
    output = f"Step 1/2 : FROM debian\nStep 2/2 : RUN make\n{noise}token is {secret}\n"
    failure = parse_build_failure(REF, output, "The command '/bin/sh -c make' returned a non-zero code: 2")
    assert failure.exit_code == 2 and failure.step == "2/2 (RUN make)"
    assert len(failure.tail.splitlines()) <= TAIL_LINES and len(failure.tail.encode()) <= TAIL_BYTES
    assert failure.tail.splitlines()[-1] == f"token is {REDACTED}" and secret not in failure.message()


def test_the_builds_own_control_characters_stay_for_the_display_to_escape() -> None:
    output = "Step 1/1 : RUN printf '\\033[31mred'\n\x1b[91m\x1b[31mred\n\x1b[0m"
    failure = parse_build_failure(REF, output, "The command '/bin/sh -c x' returned a non-zero code: 1")
    assert failure.tail == "\x1b[31mred"


def test_unrecognised_output_keeps_the_engine_error_and_the_end() -> None:
    failure = parse_build_failure(REF, "something odd\nlast words\n", "no space left on device")
    assert failure.step is None and failure.exit_code is None
    assert failure.message().splitlines() == [
        f"docker build failed for {REF}",
        "--- build output (last lines) ---",
        "no space left on device",
        "something odd",
        "last words",
    ]
