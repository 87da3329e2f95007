"""Router training (gates only) and routing statistics of a composed model.

Stage four of TRACE trains only the gates, with the backbone and every adapter frozen, on successful
trajectories (docs/design.md, "The method's settings"): a next-token loss on the assistant tokens, which reaches the gates through
``p_top`` (the chosen slot's probability scales its expert); a Switch-style load-balancing loss over
the K + 1 slots; and an optional label loss pushing each episode's tokens toward the adapter of the env
that produced it. Without the label loss a fresh router (every token on the base slot, where the expert
term is zero) learns from the balancing loss alone, so the label loss is on by default.

:func:`routing_stats` then measures the share of tokens each slot receives, per env and per message
role, averaged over the blocks; :func:`write_routing` writes it as a CSV table and a PNG heat map.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from .adapters import ComposeError
from .data import EncodedTrajectory
from .model import ComposedModel


@dataclass
class RouterTrainConfig:
    """Settings of gate training (defaults from docs/design.md, "The method's settings").

    Attributes:
        epochs: passes over the successful trajectories.
        lr: AdamW learning rate of the gates.
        weight_decay: AdamW weight decay.
        load_balance_coef: weight of the Switch load-balancing loss ((K+1) · Σ f_i P_i per block).
        label_coef: weight of the label loss (cross-entropy of each block's gate toward the episode's
            adapter slot); 0 turns it off.
        label_from: the tokens the label loss covers: ``"start"`` (every token, the paper's) or
            ``"first_observation"`` (from the end of the first user message on: before it, every env's
            conversation reads alike, and a context gate cannot tell them apart).
        accumulate: episodes per optimizer step (each episode is one sequence, without padding).
        max_grad_norm: gradient clipping of the gate parameters.
        seed: shuffling seed.
        prefit_steps: full-batch steps of the label loss alone before the joint training (0: none; see
            :func:`prefit_gates`). Each block's gate is fitted on what it reads while every episode is routed
            to its own adapter, the routing the label loss asks for.
        prefit_lr: AdamW learning rate of the pre-fit.
        prefit_rounds: reads of the gate inputs in the pre-fit: the first with every episode routed to its own
            adapter, each later one with the gates routing as the previous round left them (a later block reads
            the stream that the earlier blocks' choices made, the system prompt's included).
    """

    epochs: int = 3
    lr: float = 5e-4
    weight_decay: float = 0.0
    load_balance_coef: float = 0.001
    label_coef: float = 0.5
    label_from: str = "start"
    accumulate: int = 4
    max_grad_norm: float = 1.0
    seed: int = 0
    prefit_steps: int = 0
    prefit_lr: float = 0.01
    prefit_rounds: int = 2

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ComposeError(f"epochs must be >= 1, got {self.epochs}")
        if not self.lr > 0:
            raise ComposeError(f"lr must be > 0, got {self.lr}")
        if self.load_balance_coef < 0 or self.label_coef < 0:
            raise ComposeError("loss coefficients must be >= 0")
        if self.label_from not in ("start", "first_observation"):
            raise ComposeError(f"label_from must be 'start' or 'first_observation', got {self.label_from!r}")
        if self.accumulate < 1:
            raise ComposeError(f"accumulate must be >= 1, got {self.accumulate}")
        if self.prefit_steps < 0 or not self.prefit_lr > 0 or self.prefit_rounds < 1:
            raise ComposeError(f"prefit_steps must be >= 0, prefit_lr > 0 and prefit_rounds >= 1, got "
                               f"{self.prefit_steps}, {self.prefit_lr}, {self.prefit_rounds}")


def load_balance_loss(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch-style balancing of one block: (K+1) · Σ_i f_i · P_i over its tokens (``logits``: (N, K+1))."""
    probs = torch.softmax(logits.float(), dim=-1)
    chosen = probs.topk(top_k, dim=-1).indices
    f = torch.zeros_like(probs).scatter_(1, chosen, 1.0).mean(0) / top_k
    return probs.shape[-1] * (f * probs.mean(0)).sum()


def label_start(ep: EncodedTrajectory, cfg: RouterTrainConfig) -> int:
    """The first token the label loss covers (``cfg.label_from``), at most the episode's last token."""
    return min(ep.first_observation if cfg.label_from == "first_observation" else 0, len(ep.ids) - 1)


def label_positions(model: ComposedModel, ep: EncodedTrajectory, cfg: RouterTrainConfig) -> torch.Tensor:
    """The positions the label loss (and the pre-fit) cover: every token from :func:`label_start` on; under segment
    routing only the tokens where the gates decide (each message's first token, from there on), since every other
    token takes its message's choice whatever its own gate says (none there: the episode's last token)."""
    start = label_start(ep, cfg)
    positions = torch.arange(start, len(ep.ids))
    if model.routing == "segment":
        ids = torch.tensor(ep.ids[start:])
        decisions = positions[ids == model.segment_token_id]
        positions = decisions if len(decisions) else positions[-1:]
    return positions


def episode_loss(model: ComposedModel, ep: EncodedTrajectory, cfg: RouterTrainConfig) -> dict[str, torch.Tensor]:
    """The three losses of one episode (the total under ``"loss"``)."""
    device = next(model.gates.parameters()).device
    ids = torch.tensor([ep.ids], device=device)
    targets = torch.tensor(ep.targets[1:], device=device)
    with model.recording(logits=True, choices=False) as routers:
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits.float(), ids[0, 1:], reduction="none")
        next_token = (nll * targets).sum() / targets.sum().clamp(min=1)
        gate_logits = [r.logits[0] for r in routers]
    balance = torch.stack([load_balance_loss(g, model.top_k) for g in gate_logits]).mean()
    total = next_token + cfg.load_balance_coef * balance
    out = {"next_token": next_token.detach(), "load_balance": balance.detach()}
    if cfg.label_coef > 0 and ep.slot is not None:
        positions = label_positions(model, ep, cfg).to(device)
        label = torch.full((len(positions),), ep.slot, device=device)
        label_loss = torch.stack([torch.nn.functional.cross_entropy(g[positions].float(), label)
                                  for g in gate_logits]).mean()
        total = total + cfg.label_coef * label_loss
        out["label"] = label_loss.detach()
    out["loss"] = total
    return out


def prefit_gates(model: ComposedModel, episodes: Sequence[EncodedTrajectory], cfg: RouterTrainConfig,
                 progress: bool = True) -> list[dict]:
    """Fit each block's gate to the episodes' labels alone, full-batch, before the joint training.

    The joint loss reaches the gates a few episodes at a time: every step pushes the shared direction toward the
    adapter its episodes came from, and with a few dozen steps the gates swing instead of settling (measured on
    the planted recipe: docs/compose.md). Here every labelled
    episode is routed to its own adapter (the routing the label loss asks for), each block's gate input is read
    once, and the gates are fitted on all of it at once (each episode weighing the same, whatever its length),
    ``cfg.prefit_steps`` AdamW steps at ``cfg.prefit_lr``. Each later round (``cfg.prefit_rounds``) reads the
    inputs again with the gates routing, and refits. Returns one log row per 10 steps (round, label loss).
    Under segment routing only the tokens where the gates decide are fitted (:func:`label_positions`).

    It holds every labelled token's gate input of every block in memory (tokens × width floats per block): made
    for router sets the size of the CPU recipes' (16 episodes, ~20k tokens); a large model's would need sampling.
    """
    labelled = [ep for ep in episodes if ep.slot is not None]
    if not labelled or cfg.prefit_steps == 0:
        return []
    device = next(model.gates.parameters()).device
    labels, weights, covered = [], [], []
    for ep in labelled:
        positions = label_positions(model, ep, cfg)
        n = len(positions)
        covered.append(positions)
        labels.append(torch.full((n,), ep.slot, dtype=torch.long))
        weights.append(torch.full((n,), 1.0 / n))
    y, w = torch.cat(labels).to(device), torch.cat(weights).to(device)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.prefit_rounds * cfg.prefit_steps, desc="router pre-fit", unit="step")
    log: list[dict] = []
    try:
        for round_ in range(cfg.prefit_rounds):
            per_block: list[list[torch.Tensor]] = [[] for _ in model.gates]
            for ep, positions in zip(labelled, covered):
                for block, x in enumerate(model.gate_inputs(ep.ids, ep.slot if round_ == 0 else None)):
                    per_block[block].append(x[positions.to(x.device)])
            inputs = [torch.cat(xs).to(device) for xs in per_block]
            opt = torch.optim.AdamW(model.gate_parameters(), lr=cfg.prefit_lr, weight_decay=cfg.weight_decay)
            for step in range(cfg.prefit_steps):
                losses = [(torch.nn.functional.cross_entropy(gate(x.to(gate.weight.dtype)).float(), y,
                                                             reduction="none") * w).sum() / w.sum()
                          for gate, x in zip(model.gates, inputs)]
                loss = torch.stack(losses).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if step % 10 == 0 or step == cfg.prefit_steps - 1:
                    log.append({"round": round_ + 1, "prefit_step": step + 1, "label": round(float(loss.detach()), 6)})
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return log


def train_router(model: ComposedModel, episodes: Sequence[EncodedTrajectory], cfg: RouterTrainConfig | None = None,
                 progress: bool = True) -> list[dict]:
    """Train the gates in place; returns one log row per optimizer step (losses, epoch)."""
    cfg = cfg or RouterTrainConfig()
    if not episodes:
        raise ComposeError("no successful trajectories to train the router on; pass trajectories with "
                           "success=true (e.g. `trace rollout` of each capability adapter on its env)")
    # Context gates read their context centred on this data's mean (a statistic, fixed before training).
    model.fit_context_centers(ep.ids for ep in episodes)
    prefit = prefit_gates(model, episodes, cfg, progress=progress)
    params = model.gate_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    order = list(range(len(episodes)))
    steps_per_epoch = math.ceil(len(order) / cfg.accumulate)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps_per_epoch * cfg.epochs, desc="router", unit="step")
    log: list[dict] = []
    model.train()
    try:
        for epoch in range(cfg.epochs):
            rng.shuffle(order)
            for start in range(0, len(order), cfg.accumulate):
                chunk = order[start:start + cfg.accumulate]
                sums: dict[str, float] = {}
                for i in chunk:
                    losses = episode_loss(model, episodes[i], cfg)
                    (losses["loss"] / len(chunk)).backward()
                    for k, v in losses.items():
                        sums[k] = sums.get(k, 0.0) + float(v.detach()) / len(chunk)
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
                row = {"step": len(log) + 1, "epoch": epoch + 1, **{k: round(v, 6) for k, v in sums.items()}}
                log.append(row)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{sums['loss']:.3f}")
    finally:
        model.eval()
        if bar is not None:
            bar.close()
    model.spec.training = {"config": asdict(cfg), "episodes": len(episodes), "steps": len(log),
                           "final": log[-1] if log else None,
                           "prefit": {"steps": cfg.prefit_steps, "rounds": cfg.prefit_rounds,
                                      "label_first": prefit[0]["label"], "label_last": prefit[-1]["label"],
                                      "label_last_per_round": [r["label"] for r in prefit
                                                               if r["prefit_step"] == cfg.prefit_steps]}
                           if prefit else None}
    return log


@torch.no_grad()
def routing_stats(model: ComposedModel, episodes: Sequence[EncodedTrajectory], progress: bool = False) -> list[dict]:
    """Share of tokens per slot for each (env, role) and each env overall (role ``"all"``), over all blocks."""
    device = next(model.gates.parameters()).device
    slots = model.num_experts + 1
    counts: dict[tuple[str, str], torch.Tensor] = {}
    it = episodes
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(episodes, desc="routing stats", unit="episode")
    for ep in it:
        with model.recording(choices=True) as routers:
            model(input_ids=torch.tensor([ep.ids], device=device), use_cache=False)
            choices = torch.stack([r.choice[0] for r in routers])  # (blocks, T)
        roles = ep.roles
        for role in sorted(set(roles)) + ["all"]:
            mask = torch.tensor([role == "all" or r == role for r in roles], device=device)
            c = torch.bincount(choices[:, mask].flatten(), minlength=slots).cpu()
            key = (ep.env_id, role)
            counts[key] = counts.get(key, torch.zeros(slots, dtype=torch.long)) + c
    names = model.slot_names()
    rows = []
    for (env, role), c in sorted(counts.items()):
        total = int(c.sum())
        rows.append({"env_id": env, "role": role, "tokens": total // max(1, len(model.gates)),
                     **{names[i]: round(float(c[i]) / max(total, 1), 4) for i in range(slots)}})
    return rows


def write_routing(rows: list[dict], slot_names: Sequence[str], out_dir: Path,
                  name: str = "routing") -> tuple[Path, Path | None]:
    """``<name>.csv`` (every env x role) and ``<name>.png`` (heat map: env x role rows, slot columns)."""
    out_dir = Path(out_dir)
    csv_path = out_dir / f"{name}.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["env_id", "role", "tokens", *slot_names])
        w.writeheader()
        w.writerows(rows)
    if not rows:
        return csv_path, None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(rows, key=lambda r: (r["env_id"], r["role"] != "all", r["role"]))
    labels = [f"{r['env_id']} · {r['role']}" for r in ordered]
    values = [[r[s] for s in slot_names] for r in ordered]
    fig, ax = plt.subplots(figsize=(4.5 + 1.1 * len(slot_names), 1.8 + 0.36 * len(labels)))
    im = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(slot_names)), slot_names, rotation=30, ha="right")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
    ax.set_title("Share of tokens per slot (all blocks)", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return csv_path, png


def write_train_log(log: list[dict], out_dir: Path) -> tuple[Path, Path | None]:
    """``router_log.csv`` and ``router_loss.png`` (losses per optimizer step)."""
    out_dir = Path(out_dir)
    path = out_dir / "router_log.csv"
    keys = ["step", "epoch"] + sorted({k for row in log for k in row} - {"step", "epoch"})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(log)
    if not log:
        return path, None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in log]
    for key in ("loss", "next_token", "label"):
        if key in log[0]:
            ax.plot(steps, [r.get(key) for r in log], label=key)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("Router training (gates only)")
    ax.legend()
    fig.tight_layout()
    png = out_dir / "router_loss.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return path, png
