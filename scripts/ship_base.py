"""Ship a warmed-up tiny base with the project: ``trace_train/tiny/bases/<name>/`` (maintainers' tool).

    python scripts/ship_base.py                       # warm up the embedded default's recipe, measure, ship
    python scripts/ship_base.py --model DIR           # ship a base already warmed up with that recipe
    python scripts/ship_base.py --config CONFIG --name NAME [--model DIR]   # another run config's base
    python scripts/ship_base.py --config lab/X/config.yaml --dest lab/X/base  # an experiment's base, beside it

A base only one experiment uses goes beside that experiment's config (``--dest``), which names it with
``base.shipped``; only the embedded default's base ships in the package.

1. Warms up (or takes ``--model``) the base that the run config's ``base.bootstrap`` recipe gives (default: the
   embedded default's).
2. Copies the model folder (weights, tokenizer, ``trace_model.json``, ``loss.json``, ``loss_curve.png``) to
   ``trace_train/tiny/bases/<name>/`` with ``recipe.json``: the recipe, the cache name it gives, the build
   version, the CPU it was built on, and the warm-up's steps, seconds and final loss.
3. Measures what it solves exactly as ``trace run`` would see it: ``trace run --until rollout`` of the
   same config in a scratch run directory (which installs the shipped copy into an empty model cache),
   and records the diagnosis episodes solved, per request family, in ``recipe.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

COPIED = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "chat_template.jinja", "trace_model.json", "loss.json", "loss_curve.png")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a base warmed up with the config's recipe (default: warm one up)")
    ap.add_argument("--config", help="the run config whose base.bootstrap recipe to ship (default: the embedded "
                                     "default's); its rollout stage measures what the base solves")
    ap.add_argument("--name", help="folder name under trace_train/tiny/bases/ (default: embedded-default; "
                                   "required with --config)")
    ap.add_argument("--dest", help="the folder to write the base to (default: trace_train/tiny/bases/NAME); an "
                                   "experiment's base goes beside its config, e.g. lab/X/base")
    args = ap.parse_args()
    if args.config and not (args.name or args.dest):
        ap.error("--config needs --name or --dest: the embedded default's base keeps its folder")
    args.name = args.name or "embedded-default"

    from trace_train.tiny.bootstrap import bootstrap_model
    from trace_train.tiny.build import BUILD_VERSION
    from trace_train.tiny.metadata import model_metadata
    from trace_train.pipeline.config import embedded_default, load_config
    from trace_train.pipeline.stages.base import tiny_base_cache_dir, tiny_bootstrap_config

    cfg = load_config(args.config) if args.config else embedded_default()
    if cfg.base.kind != "tiny":
        raise SystemExit(f"{args.config}: base.kind is {cfg.base.kind!r}, not a tiny model warmed up by "
                         "base.bootstrap: nothing to ship")
    bcfg = tiny_bootstrap_config(cfg.base, cfg.rollout.targets[0])
    cache_name = tiny_base_cache_dir(bcfg).name
    model = Path(args.model) if args.model else None
    if model is None:
        model = Path(tempfile.mkdtemp(prefix="trace-ship-")) / "base"
        bcfg.out = str(model)
        bootstrap_model(bcfg, progress=True)
        bcfg.out = None
    meta = model_metadata(model).get("bootstrap", {})
    recipe_fields = {k: v for k, v in asdict(bcfg).items() if k != "out"}
    if meta.get("steps") != bcfg.steps:
        raise SystemExit(f"{model} ran {meta.get('steps')} warm-up steps, the recipe {bcfg.steps}: not this recipe")

    dest = Path(args.dest).resolve() if args.dest else ROOT / "trace_train" / "tiny" / "bases" / args.name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in COPIED:
        if (model / name).exists():
            shutil.copy2(model / name, dest / name)
    recipe = {"cache_name": cache_name, "build_version": BUILD_VERSION, "bootstrap": recipe_fields,
              "built_on": {"cpu": cpu_model(), "machine": platform.machine(), "threads": bcfg.threads},
              "warmup": {"steps": meta.get("steps"), "train_seconds": meta.get("train_seconds"),
                         "final_loss": meta.get("final_loss"), "examples": meta.get("examples"),
                         "scenario_counts": meta.get("scenario_counts")}}
    (dest / "recipe.json").write_text(json.dumps(recipe, indent=1, default=list) + "\n")

    # What it solves, as `trace run` sees it: the shipped copy installed into an empty cache.
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TRACE_CACHE": str(Path(tmp) / "cache"), "PYTHONPATH": str(ROOT)}
        config = [str(Path(args.config).resolve())] if args.config else []
        subprocess.run([sys.executable, "-m", "trace_train.cli", "run", *config, "--out", str(Path(tmp) / "run"),
                        "--until", "rollout"], check=True, env=env, cwd=ROOT)
        records = [json.loads(line) for line in
                   (Path(tmp) / "run" / "rollouts" / "trajectories.jsonl").read_text().splitlines() if line.strip()]
        base_summary = json.loads((Path(tmp) / "run" / "stages.json").read_text())
    solved = Counter()
    seen = Counter()
    for r in records:
        family = ((r.get("task") or {}).get("families") or ["?"])[0]
        seen[family] += 1
        solved[family] += int(bool(r.get("success")))
    recipe["solve_rate"] = {"episodes": len(records), "solved": sum(solved.values()),
                            "seeds": cfg.rollout.seeds, "target": cfg.rollout.targets[0],
                            "by_family": {f: f"{solved[f]}/{seen[f]}" for f in sorted(seen)},
                            "installed_from_shipped": base_summary["stages"]["base"].get("summary", {}).get("shipped")}
    (dest / "recipe.json").write_text(json.dumps(recipe, indent=1, default=list) + "\n")
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"shipped {dest} ({size / 2**20:.1f} MB): solves {recipe['solve_rate']['solved']}/{len(records)} "
          f"diagnosis episodes, {recipe['solve_rate']['by_family']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
