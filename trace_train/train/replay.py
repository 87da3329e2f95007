"""GRPO replay: an NLL term on the base's own episodes of the families the capability envs never draw.

A LoRA trained by GRPO on one capability env learns that env's skill and, on the planted recipe, forgets what the
base did on the target's other requests: the precondition adapter answered 0 of 130 flight-status and information
requests (the base 46; docs/train.md). Replaying the base's episodes in the SFT warm-up alone does not hold:
GRPO takes back within 10 steps what the warm-up kept (flight status 15 → 7 of 54). This term keeps them in
every step's loss instead, as PPO-ptx keeps the pre-training data in InstructGPT's RL loss::

    loss = grpo_loss + grpo_replay_weight × mean NLL(agent turns of grpo_replay_batch replayed episodes)

The replayed episodes are those of :func:`~trace_train.tiny.sft_data.left_out_episodes`: the base's own
(sampled) episodes on the target whose families no training env draws, failures included. Their NLL under the
adapter is, up to the base's entropy, a KL from the base on the base's own states; it adds no reward and no
target success, only "do there what the base did".

Measured on the planted recipe (seed 0; docs/train.md): with a weight of 4 or more
the precondition adapter's last step answers 28-31 of 54 flight-status requests (without the term 3), but steps
10-20 do not keep them, and GRPO's own drift on cancellations is untouched; the recipe leaves the term off.
A resumed run starts the replay order again from its first epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

logger = logging.getLogger(__name__)

#: Oracle episodes per env read to learn which target families the env draws.
FAMILY_PROBE_SEEDS = 64
#: Longest replayed row in tokens (the SFT warm-up's; turns beyond it are left out).
REPLAY_MAX_LENGTH = 4096


def drawn_families(env_ids: Sequence[str], env_kwargs: dict[str, dict], first_seed: int,
                   seeds: int = FAMILY_PROBE_SEEDS) -> set[str]:
    """The target families the envs' own episodes draw, read from their oracle episodes on ``seeds`` training
    seeds from ``first_seed`` (the families a task names do not depend on the agent)."""
    from ..tiny.sft_data import oracle_trajectories

    drawn: set[str] = set()
    for env_id in env_ids:
        records, _ = oracle_trajectories(env_id, range(first_seed, first_seed + seeds),
                                         env_kwargs=env_kwargs.get(env_id, {}))
        drawn.update(f for r in records for f in r.get("families") or [])
    return drawn


@dataclass
class ReplayBatches:
    """Token rows of the replayed episodes, served ``batch`` at a time in seeded epochs (every episode once per
    epoch, a fresh order each epoch: :func:`~trace_train.tiny.sft_data.seeded_epochs`).

    Args:
        rows: ``(ids, labels)`` per episode, labels -100 outside the agent's turns (:func:`sft_rows`).
        batch: rows per call of :meth:`next`.
        seed: the order's seed.
    """

    rows: list[tuple[list[int], list[int]]]
    batch: int
    seed: int = 0
    summary: dict = field(default_factory=dict)
    _stream: Iterator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from ..tiny.sft_data import seeded_epochs

        self._stream = seeded_epochs(self.rows, self.seed)

    def next(self) -> list[tuple[list[int], list[int]]]:
        return list(islice(self._stream, min(self.batch, len(self.rows))))


def replay_batches(path: str, drawn: set[str], tokenizer, batch: int, max_length: int,
                   seed: int = 0) -> ReplayBatches | None:
    """The replayed episodes of ``path`` (families outside ``drawn``) as :class:`ReplayBatches`, or ``None``
    (with a warning) when the file holds none."""
    from ..tiny.sft_data import left_out_episodes, sft_rows

    kept, summary = left_out_episodes(path, drawn)
    rows, turns, dropped = sft_rows(tokenizer, kept, max_length)
    summary = {**summary, "rows": len(rows), "turns": turns, "turns_cut": dropped}
    if not rows:
        logger.warning("GRPO replay: none of the %d episodes in %s is of a family the envs leave out (they draw "
                       "%s); the replay term is off", summary["episodes_in_file"], path,
                       ", ".join(sorted(drawn)) or "no labelled family")
        return None
    logger.info("GRPO replay: %d episodes of %s (families %s)", len(rows), path, summary["families"])
    return ReplayBatches(rows=rows, batch=batch, seed=seed, summary=summary)


def replay_nll(model, rows: list[tuple[list[int], list[int]]], pad_id: int, device: str):
    """Mean NLL of the agent-turn tokens of ``rows`` under ``model`` (a causal LM; a PEFT model's adapters are
    active), with gradients: the bootstrap's SFT loss (:func:`~trace_train.tiny.sft_forward.sft_loss`), the
    rows' shared system prompt run once."""
    from ..tiny.sft_data import shared_prefix_length
    from ..tiny.sft_forward import sft_loss

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return sft_loss(base, rows, pad_id, prefix_len=shared_prefix_length(rows), device=device)
