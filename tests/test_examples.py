"""Every example runs as its docstring says, from the repository root of a clone, with no arguments (issue 56).

Each file in ``examples/`` either does something useful with no arguments (and says so in its docstring) or
prints how to run it; none needs ``TRACE_REGISTRY`` for the worked example env. Run here as a newcomer would: a
fresh process, nothing on ``sys.path`` but the repository, and the cheap documented command of each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))

#: What each example's run with no arguments must print (its last words), and whether it needs the train extra.
EXPECTED = {
    "custom_env.py": ("oracle, seed 0: reward 1.0", False),
    "other_trainer.py": ("examples/warehouse_stock-v0: mean reward", False),
    "quickstart.py": ("environments registered", False),
    "train_grpo.py": ("trace model bootstrap", False),  # needs a warmed-up base: prints how to make one and run
    "train_trl.py": ("LoRA adapter in", True),
}


def test_every_example_is_covered():
    assert sorted(EXPECTED) == EXAMPLES


def _run(name: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRACE_REGISTRY"}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               TRACE_CACHE=os.environ.get("TRACE_CACHE", str(tmp_path / "cache")))
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_an_example_with_no_arguments_runs_or_says_how(name, tmp_path):
    expected, needs_train = EXPECTED[name]
    if needs_train:
        pytest.importorskip("trl")
    out = _run(name, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert expected in out.stdout, out.stdout[-2000:]
    doc = (ROOT / "examples" / name).read_text(encoding="utf-8").split('"""')[1]
    assert f"python examples/{name}" in doc, f"{name}'s docstring must say how to run it"


def test_the_documented_other_trainer_run_learns_the_worked_example(tmp_path):
    """The documented run (no arguments) climbs from near 0 to near 1 on the worked example env."""
    out = _run("other_trainer.py", tmp_path)
    last = out.stdout.strip().splitlines()[-1]
    first, final = (float(x.split()[0]) for x in last.split("mean reward ")[1].split(" -> "))
    assert first < 0.3 and final > 0.8, last
