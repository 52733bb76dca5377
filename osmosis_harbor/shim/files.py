"""Reading the host's inputs and writing the shim's outputs.

Outputs are written atomically (temp file + rename) so that a sandbox killed
mid-write leaves either a whole file or none -- the host treats a missing file
as "phase failed", which is the truth; a truncated one would be a confusing
parse error. Every output passes through the ``Redactor``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.types import RolloutSample
from pydantic import BaseModel, ValidationError

from .errors import AgentSampleError, InputError, Redactor

logger: logging.Logger = logging.getLogger(__name__)

OUTPUT_FILE_MODE = 0o644


def write_json(path: Path, data: Any, redactor: Redactor) -> None:
    """Atomically write *data* as JSON (strict: NaN/inf are refused)."""
    text = json.dumps(redactor.data(data), indent=2, allow_nan=False) + "\n"
    write_text(path, text)


def write_text(path: Path, text: str) -> None:
    """Atomic write, world-readable like a plain ``open`` would leave it.

    ``mkstemp`` creates 0600 files; the verifier may run as another user than
    the agent, and the host may read the logs through a mount.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, OUTPUT_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_model(path: Path, model: BaseModel, redactor: Redactor) -> None:
    write_json(path, model.model_dump(mode="json"), redactor)


def remove_stale(*paths: Path) -> None:
    """Drop outputs of an earlier run so only this run's verdict is visible."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            logger.warning("could not remove stale %s", path)


def read_input[M: BaseModel](path: Path, model: type[M]) -> M:
    """Parse a host-staged input file; any problem is the host's (``InputError``)."""
    try:
        return model.model_validate_json(path.read_bytes())
    except FileNotFoundError as exc:
        raise InputError(f"{model.__name__} file not found: {path}") from exc
    except (OSError, ValidationError) as exc:
        raise InputError(f"invalid {model.__name__} file {path}: {exc}") from exc


def read_inline_input[M: BaseModel](text: str, model: type[M], name: str) -> M:
    """Parse an input the host passed inline in ``name``; any problem is the host's."""
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise InputError(f"invalid {model.__name__} in ${name}: {exc}") from exc


def sample_payload(sample: RolloutSample) -> dict[str, Any]:
    """``RolloutSample`` as JSON data that ``RolloutSample.model_validate`` restores.

    Every field is written, ``trajectory_messages`` included even when it is
    ``None``: on the way back an explicit ``None`` keeps trajectory
    persistence disabled, while an absent field would re-default it to a copy
    of ``messages``. ``json_safe_copy`` (osmosis_ai's own wire sanitizer)
    normalizes NumPy scalars and drops non-finite telemetry in ``metrics`` /
    ``extra_fields``; a message that pydantic cannot encode is stringified
    rather than costing the rollout its sample.
    """
    safe = sample.json_safe_copy()
    try:
        return safe.model_dump(mode="json")
    except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
        logger.warning("sample not JSON-encodable (%s); degrading odd values", exc)
    trajectory = safe.trajectory_messages
    degraded = safe.model_copy(
        update={
            "messages": _degrade(list(safe.messages)),
            "trajectory_messages": None if trajectory is None else _degrade(list(trajectory)),
        }
    )
    return degraded.model_dump(mode="json", fallback=repr)


def _degrade(value: Any) -> Any:
    """Make message content encodable: bytes that are not UTF-8 become base64.

    Framework-native histories (Strands image blocks, for one) may carry raw
    bytes, which pydantic can only encode as UTF-8. Unknown objects are left
    to ``model_dump``'s ``fallback=repr``.
    """
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): _degrade(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_degrade(v) for v in value]
    return value


def read_sample(path: Path) -> RolloutSample:
    """Rebuild the agent's sample; missing or invalid means nothing to grade."""
    try:
        return RolloutSample.model_validate_json(path.read_bytes())
    except FileNotFoundError as exc:
        raise AgentSampleError(
            f"the agent phase left no sample at {path}"
            + (" (see agent/error.json)" if path.with_name("error.json").exists() else "")
        ) from exc
    except (OSError, ValidationError) as exc:
        raise AgentSampleError(f"invalid agent sample {path}: {exc}") from exc


def usable_dir(path: Path) -> Path | None:
    """Create *path* and return it if writable, else ``None``.

    Mirrors ``create_rollout_artifacts_dir``: ``ctx.artifacts_dir`` is
    documented as ``None`` when the environment cannot provide a writable
    directory, and artifact problems must never fail a rollout.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        logger.warning("artifacts dir %s unusable", path)
        return None
    return path if os.access(path, os.W_OK | os.X_OK) else None
