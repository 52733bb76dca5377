"""The backend's temporary work root: per-rollout task copies, and the trials unless a
``trials_dir`` was given."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

from osmosis_harbor.key_custody import default_trials_dirs

__all__ = ["Workspace"]


class Workspace:
    """The backend's temporary work root (per-rollout task copies, and the trials unless
    ``trials_dir`` was given), made on first use: a backend that only prewarms, or fails to
    construct, leaves no directory behind."""

    def __init__(self, trials_dir: Path | None, *, root: Path | None = None) -> None:
        # A worker process is given its root inside the front's (``backend/workers/``), so that
        # the front removes it if the worker dies; else the root is made on first use.
        self._given_root = root
        self._root: Path | None = None
        self._lock = threading.Lock()
        self._trials_dir = trials_dir
        self._trials_made = False

    @property
    def root(self) -> Path:
        with self._lock:
            if self._root is None:
                if self._given_root is not None:
                    self._given_root.mkdir(parents=True, exist_ok=True)
                    self._root = self._given_root
                else:
                    self._root = Path(tempfile.mkdtemp(prefix="osmosis-harbor-"))
            return self._root

    @property
    def trials_dir(self) -> Path:
        """Made on first use too: a backend whose other options fail leaves no directory."""
        if self._trials_dir is None:
            self._trials_dir = self.root / "trials"
        if not self._trials_made:
            self._trials_dir.mkdir(parents=True, exist_ok=True)
            self._trials_made = True
        return self._trials_dir

    def given_trials_dir(self) -> Path | None:
        return self._trials_dir

    def rollout_dir(self, trial_name: str) -> Path:
        """Where one rollout's task copy is made (removed when the rollout ends)."""
        return self.root / "rollouts" / trial_name

    def prepared_copies_dir(self) -> Path:
        """Where the task copies shared by rollouts are prepared: beside the rollouts' own
        copies, removed with them (no rollout is named ``.*``)."""
        return self.root / "rollouts" / ".prepared"

    def sandbox_output_dirs(self) -> list[Path]:
        """Where sandboxes' products land: this backend's trials and work root (once made) and
        every backend's default trials directory. No task ref may point into them."""
        return [*(d for d in (self._trials_dir, self._root) if d is not None), *default_trials_dirs()]

    def remove(self) -> None:
        """Remove the temporary root, except retained (failed) trials in it."""
        root = self._root  # never made when no rollout ran: nothing to remove
        if root is not None:
            shutil.rmtree(root / "rollouts", ignore_errors=True)
        for directory in (self._trials_dir, root):
            try:
                if directory is not None:
                    directory.rmdir()  # only when empty: retained trials stay for inspection
            except OSError:
                pass
