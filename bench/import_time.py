"""How long ``import trace_envs`` takes, against ``import gymnasium`` measured in the same run.

Every sample is a fresh interpreter (``python -c``), so nothing is cached in
``sys.modules``; the time is measured inside the child around the import
statement alone (interpreter start-up is reported separately). The anchor is
``import gymnasium``, which ``trace_envs`` cannot avoid; the ratio shows what
the suite adds on top. The child also reports whether torch, transformers or
docker ended up in ``sys.modules`` (they must not: docs/design.md, "Layout").

    python bench/import_time.py            # 15 samples each
    python bench/import_time.py -n 30 --registry examples --profile

Goal: median ``import trace_envs`` < 0.3 s. This script prints the numbers;
it never fails CI on wall time (it exits 1 only if a heavy module is imported).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_S = 0.3
HEAVY = ("torch", "transformers", "docker")
ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import sys, time, json
t0 = time.perf_counter()
import {module}
t1 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "heavy": [m for m in {heavy!r} if m in sys.modules],
                   "modules": len(sys.modules)}}))
"""


def sample(module: str, env: dict) -> dict:
    """One fresh interpreter importing ``module``: import time, process wall time, heavy modules seen."""
    code = CHILD.format(module=module, heavy=HEAVY)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"`python -c 'import {module}'` failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def profile(module: str, env: dict, top: int = 12) -> list[tuple[int, str]]:
    """The modules with the largest cumulative import time (``python -X importtime``)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative_us, name = line[len("import time:"):].split("|")
        rows.append((int(cumulative_us), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--samples", type=int, default=15, help="fresh interpreters per module (default 15)")
    parser.add_argument("--registry", help="also load this workspace registry (TRACE_REGISTRY) during the import")
    parser.add_argument("--profile", action="store_true", help="show the slowest imports under trace_envs")
    args = parser.parse_args()

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("TRACE_REGISTRY", None)
    if args.registry:
        env["TRACE_REGISTRY"] = str(Path(args.registry).resolve())

    results: dict[str, list[dict]] = {"gymnasium": [], "trace_envs": [], "sys": []}
    for i in range(args.samples):  # interleaved, so drifts in machine load hit both alike
        for module in results:
            results[module].append(sample(module, env))
        if sys.stderr.isatty():
            print(f"\r  sample {i + 1}/{args.samples}", end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)

    def stats(module: str, key: str) -> tuple[float, float]:
        values = [r[key] for r in results[module]]
        return statistics.median(values), min(values)

    startup = stats("sys", "wall_s")
    print(f"Python {sys.version.split()[0]}, {args.samples} fresh interpreters each"
          + (f", TRACE_REGISTRY={env['TRACE_REGISTRY']}" if args.registry else ""))
    print(f"{'':24}{'median':>10}{'min':>10}{'process wall (median)':>25}{'modules':>9}")
    for module in ("gymnasium", "trace_envs"):
        median, best = stats(module, "import_s")
        wall, _ = stats(module, "wall_s")
        modules = results[module][-1]["modules"]
        print(f"{'import ' + module:24}{median:>9.3f}s{best:>9.3f}s{wall:>24.3f}s{modules:>9}")
    print(f"{'(interpreter start-up)':24}{'':>20}{startup[0]:>24.3f}s")

    trace_median, trace_min = stats("trace_envs", "import_s")
    gym_median, gym_min = stats("gymnasium", "import_s")
    print(f"ratio trace_envs / gymnasium: {trace_median / gym_median:.2f}x (median), "
          f"{trace_min / gym_min:.2f}x (min)")
    print(f"goal: import trace_envs < {GOAL_S:.1f} s (median) -> "
          f"{'met' if trace_median < GOAL_S else 'NOT met'} ({trace_median:.3f} s)")

    heavy = sorted({m for r in results["trace_envs"] for m in r["heavy"]})
    print(f"heavy modules after `import trace_envs`: {', '.join(heavy) if heavy else 'none'} "
          f"(checked: {', '.join(HEAVY)})")

    if args.profile:
        print("\nslowest imports (cumulative, one run of python -X importtime):")
        for us, name in profile("trace_envs", env):
            print(f"  {us / 1e6:7.3f}s  {name}")
    return 1 if heavy else 0


if __name__ == "__main__":
    sys.exit(main())
