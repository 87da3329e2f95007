"""``import trace_envs`` (and the CLI's command modules) stay light: no torch, transformers or docker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "docker", "trl", "peft", "vllm")


def _modules_after(code: str) -> dict:
    probe = code + f"\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRACE_REGISTRY": str(ROOT / "examples")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import trace_envs",
    "import trace_envs, gymnasium as gym; gym.make('examples/warehouse_stock-v0').reset(seed=0)",
    "import trace_envs; trace_envs.rollout('examples/warehouse_stock-v0', trace_envs.OracleAgent(), seed=0)",
], ids=["import", "make+reset", "rollout"])
def test_trace_envs_is_light(code: str) -> None:
    assert _modules_after(code) == []


def test_cli_parser_is_light() -> None:
    """Building the full ``trace`` parser imports every command module; none may import heavy packages."""
    assert _modules_after("import trace_train, trace_train.cli as c; c.build_parser()") == []
