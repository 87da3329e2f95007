"""The bookkeeping of a ``trace run`` directory that both the runner and the report read.

``stages.json`` (written by :mod:`trace_train.pipeline.runner`) names files inside the run directory in the stages'
summaries; :func:`rebase_summaries` keeps those names right when the directory is reached another way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def rebase_summaries(state: dict, run_dir: str | Path) -> dict:
    """Point the paths in the stages' summaries at ``run_dir`` when the run directory was reached another way.

    A stage's summary names its files as the run saw them (``runs/x/train/...`` from the directory it was started
    in, or an absolute path). Resumed from another working directory, or with the run directory moved or copied,
    those paths would name nothing, or the old run's files. Each summary string that is a path inside the
    recorded run directory (``state["run_dir"]`` as given, or ``state["run_dir_abs"]``) and names a file that
    exists under ``run_dir`` is rebased onto ``run_dir`` as given now (the check keeps an env id such as
    ``trace/x-v0`` from a run directory named ``trace``), and both records are updated. ``outputs`` need nothing:
    they are relative to the run directory already. Returns ``state``, changed in place.
    """
    new = Path(run_dir)
    olds = [Path(o) for o in (state.get("run_dir_abs"), state.get("run_dir")) if o]
    # A recorded run directory of no components (".") would claim every relative string: skip it.
    olds = [o for o in dict.fromkeys(olds) if o.parts and o != new]

    def rebase(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: rebase(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rebase(v) for v in value]
        if isinstance(value, str) and "/" in value:
            parts = Path(value).parts
            for old in olds:
                if parts[:len(old.parts)] == old.parts:
                    moved = new.joinpath(*parts[len(old.parts):])
                    if moved.exists():
                        return str(moved)
        return value

    if olds:
        for entry in state.get("stages", {}).values():
            if "summary" in entry:
                entry["summary"] = rebase(entry["summary"])
    state["run_dir"], state["run_dir_abs"] = str(new), str(new.resolve())
    return state
