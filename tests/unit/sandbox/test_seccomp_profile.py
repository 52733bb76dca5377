"""``seccomp-profile``: the operator's base profile, with ``fallocate`` and io_uring taken out of
its rules and the restricting rules added, everything else kept; a file that is not a profile is
refused with the setting (or the command) named. The profiles' effect in real sandboxes is in
``test_layer_floods.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.cli import main
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.sdk.privileges import SandboxPrivileges
from osmosis_harbor.sandbox.sdk.seccomp import RULES, restrict_preallocation

BASE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 1,
    "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": []}],
    "syscalls": [
        {"names": ["read", "fallocate", "io_uring_setup", "io_uring_enter", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["io_uring_register"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "5.1"}},
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}],
        },
        {"name": "fallocate", "action": "SCMP_ACT_ALLOW"},
    ],
}


def test_the_restriction_replaces_only_fallocate_and_io_uring() -> None:
    restricted = restrict_preallocation(BASE)
    assert {k: v for k, v in restricted.items() if k != "syscalls"} == {
        k: v for k, v in BASE.items() if k != "syscalls"
    }
    kept, added = restricted["syscalls"][: -len(RULES)], restricted["syscalls"][-len(RULES) :]
    assert kept == [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
        BASE["syscalls"][
            2
        ],  # the clone rule, untouched; the emptied io_uring_register rule and the old-format one gone
    ]
    assert added == RULES
    assert BASE["syscalls"][0]["names"][1] == "fallocate"  # the base itself is not changed


def test_the_command_writes_the_restricted_profile_and_names_a_bad_base(tmp_path: Path, capsys) -> None:
    base, out = tmp_path / "default.json", tmp_path / "restricted.json"
    base.write_text(json.dumps(BASE))
    assert main(["seccomp-profile", str(base), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == restrict_preallocation(BASE)
    base.write_text('["not", "a", "profile"]')
    assert main(["seccomp-profile", str(base)]) == 2
    assert f"seccomp-profile '{base}' is not a seccomp profile in Docker's format" in capsys.readouterr().err


def test_the_setting_gives_every_sandbox_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "restricted.json"
    path.write_text(json.dumps(restrict_preallocation(BASE)))
    monkeypatch.setenv("OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE", str(path))
    options = SandboxPrivileges.of(settings.current()).host_config()["security_opt"]
    assert options[0] == "no-new-privileges" and json.loads(options[1].removeprefix("seccomp=")) == json.loads(
        path.read_text()
    )
    path.write_text("{")
    with pytest.raises(ConfigError, match=r"OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE='.*' cannot be read as JSON"):
        SandboxPrivileges.of(settings.current())
    monkeypatch.delenv("OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE")
    assert SandboxPrivileges.of(settings.current()).host_config()["security_opt"] == ["no-new-privileges"]
