"""`trace rollout --ray` on the CLI's own fresh local cluster (not a test fixture's), with a busy core beside it.

Issue 58: the CLI's defaults (4 actors of 1 CPU) on a 2-CPU machine asked for more than Ray's local cluster
has; the chunks of the actors that could never start waited forever, and the rollout hung with 6 of 12
episodes written. Chunks now go only to actors that have started. Each run here starts its own cluster
(about 10 s on an idle 2-core machine, 30 s on a loaded one), so 20 runs take minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="pip install 'trace-rl[ray]'")

from trace_train.rollouts import read_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TAU = "trace/tau_airline-v0"
RUNS = 20


@pytest.mark.slow  # 20 fresh clusters: about 3.5 min on an idle 2-core machine, 10 min with a load average of 7
def test_cli_ray_rollouts_on_a_fresh_local_cluster_always_finish_with_every_episode_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # its own cluster, not one found here
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # one core taken beside the rollouts
    try:
        for run in range(RUNS):
            out = tmp_path / f"run{run}.jsonl"
            done = subprocess.run([sys.executable, "-m", "trace_train.cli", "rollout", "--env", TAU, "--agent", "oracle",
                                   "--seeds", "0:12", "--out", str(out), "--no-progress", "--ray"],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
            assert done.returncode == 0, (run, done.stdout[-2000:], done.stderr[-4000:])
            assert "12 episodes run on Ray" in done.stdout, (run, done.stdout)
            counts = Counter((r["env_id"], r["seed"], r["sample"]) for r in read_trajectories(out))
            assert counts == Counter({(TAU, s, 0): 1 for s in range(12)}), (run, counts)
    finally:
        busy.kill()
        busy.wait()
