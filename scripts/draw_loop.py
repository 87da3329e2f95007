"""Draw the TRACE loop for the README: ``python scripts/draw_loop.py`` writes ``docs/figures/loop.png``."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

STAGES = [
    ("target env", "τ² airline,\nretail,\nSWE repair", "trace_envs/"),
    ("rollout", "the base\nagent's\ntrajectories", "trace rollout"),
    ("diagnose", "successes vs.\nfailures: the\nmissing skills", "trace diagnose"),
    ("generate", "one seeded env\nper capability,\nsandboxed", "trace generate"),
    ("train", "one LoRA per\ncapability\n(GRPO)", "trace train"),
    ("compose", "token-level\ntop-1 MoE of\nthe adapters", "trace compose"),
    ("evaluate", "every method\non held-out\ntarget seeds", "trace eval"),
]


def main() -> Path:
    fig, ax = plt.subplots(figsize=(11, 3.4), dpi=120)
    ax.set_xlim(0, len(STAGES) * 1.6)
    ax.set_ylim(-0.2, 3.0)
    ax.axis("off")
    colors = ["#dfe9f5", "#e8f1e4", "#f7ecd9", "#f3e1e1", "#e9e2f2", "#e0f0ef", "#eeeeee"]
    for i, (name, what, verb) in enumerate(STAGES):
        x = i * 1.6 + 0.1
        ax.add_patch(FancyBboxPatch((x, 1.0), 1.35, 1.6, boxstyle="round,pad=0.03", fc=colors[i], ec="#555555"))
        ax.text(x + 0.675, 2.35, name, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x + 0.675, 1.75, what, ha="center", va="center", fontsize=7.2)
        ax.text(x + 0.675, 1.18, verb, ha="center", va="center", fontsize=7, family="monospace", color="#333333")
        if i < len(STAGES) - 1:
            ax.add_patch(FancyArrowPatch((x + 1.38, 1.8), (x + 1.6 + 0.07, 1.8), arrowstyle="-|>",
                                         mutation_scale=12, color="#444444"))
    ax.add_patch(FancyArrowPatch((len(STAGES) * 1.6 - 0.82, 0.95), (0.78, 0.95), connectionstyle="arc3,rad=-0.12",
                                 arrowstyle="-|>", mutation_scale=12, color="#888888", linestyle="--"))
    ax.text(len(STAGES) * 0.8, 0.05, "trace run: every stage in one run directory, resumable; the report compares "
            "the MoE with the base, each adapter,\nmerges, per-episode routing, multi-capability GRPO and SFT",
            ha="center", fontsize=7.5, color="#444444")
    out = Path(__file__).resolve().parent.parent / "docs" / "figures" / "loop.png"
    fig.savefig(out, bbox_inches="tight")
    return out


if __name__ == "__main__":
    print(main())
