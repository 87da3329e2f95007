"""Checkpoint selection (trace_train.train.select): the GRPO budget read off a validation curve.

The rule is tested on hand-made curves; the machinery end to end on a real nano model, real PEFT checkpoints and a
real env: every chosen step is played greedily, a zero-update checkpoint plays exactly the base's episodes, and the
end of training is a candidate even when the run saved no checkpoint at its last step.
"""

from __future__ import annotations

import json

import pytest

from trace_train.train.select import checkpoints, choose, every_nth


def _row(step: int, success: float, reward: float = 0.0, episodes: int = 10) -> dict:
    return {"step": step, "success": success, "lo": 0.0, "hi": 1.0, "reward": reward, "episodes": episodes}


def test_the_best_trained_step_wins_and_the_base_is_never_chosen():
    rows = [_row(0, 0.9), _row(5, 0.2), _row(10, 0.44), _row(15, 0.31)]
    assert choose(rows) == 10  # the base's 0.9 is the reference, not a candidate


def test_ties_go_to_the_higher_reward_then_to_the_later_step():
    assert choose([_row(0, 0.1), _row(5, 0.3, 0.40), _row(10, 0.3, 0.45), _row(15, 0.3, 0.45)]) == 15
    assert choose([_row(0, 0.1), _row(5, 0.3, 0.50), _row(10, 0.3, 0.45)]) == 5
    assert choose([_row(0, 0.1), _row(5, 0.9, episodes=0), _row(10, 0.2)]) == 10  # an unplayed step is no candidate
    with pytest.raises(ValueError, match="no trained checkpoint"):
        choose([_row(0, 0.5)])


def test_checkpoints_are_read_in_step_order_and_every_nth_keeps_the_last(tmp_path):
    for step in (75, 5, 10, 20, 15):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-30").write_text("a file, not a checkpoint")
    points = checkpoints(tmp_path)
    assert [s for s, _ in points] == [5, 10, 15, 20, 75]
    assert [s for s, _ in every_nth(points, 2)] == [10, 20, 75]
    assert [s for s, _ in every_nth(points, 1)] == [5, 10, 15, 20, 75]
    assert checkpoints(tmp_path / "missing") == []


ENV = "trace/precondition_verification-v0"
KWARGS = {"domain": "airline", "prompt": "compact", "max_episode_steps": 4}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """A GRPO run's folder as the trainer leaves it: checkpoints at steps 5 and 10 (5 a zero update, 10 a real
    one), the final adapter at step 12 (a zero update, saved as no checkpoint) and ``train_result.json``."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_train.tiny.build import build_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("select")
    base = str(build_model("nano", out=root / "nano", env_ids=[ENV], corpus_seeds=2).path)
    run = root / "run"

    def save(folder, real: bool):
        torch.manual_seed(3)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=not real))
        model.save_pretrained(str(folder))

    save(run / "checkpoints" / "checkpoint-5", real=False)
    save(run / "checkpoints" / "checkpoint-10", real=True)
    save(run / "adapter", real=False)
    (run / "train_result.json").write_text(json.dumps({"steps": 12}))
    return base, run


def test_selection_plays_the_base_and_each_checkpoint_and_keeps_the_best(grpo_run, tmp_path):
    from trace_train.rollouts import read_trajectories
    from trace_train.train.select import select_checkpoint

    base, run = grpo_run
    out = tmp_path / "select"
    chosen = select_checkpoint(base, run, [ENV], range(100, 103), out, env_kwargs=lambda env_id: dict(KWARGS),
                               max_new_tokens=12, final_adapter=run / "adapter", in_flight=3)
    assert [r["step"] for r in chosen.rows] == [0, 5, 10, 12]
    assert all(r["episodes"] == 3 for r in chosen.rows)
    assert chosen.final_step == 12 and chosen.seeds == [100, 103] and chosen.env_ids == [ENV]
    assert chosen.step == choose(chosen.rows)
    assert chosen.adapter_dir == {5: str(run / "checkpoints" / "checkpoint-5"),
                                  10: str(run / "checkpoints" / "checkpoint-10"), 12: str(run / "adapter")}[chosen.step]

    def replies(step):
        return [[m.get("content") for m in t["messages"] if m["role"] == "assistant"]
                for t in sorted(read_trajectories(out / f"{step:05d}" / "trajectories.jsonl"), key=lambda t: t["seed"])]

    # Greedy decoding of a zero update is the base: same episodes, token for token.
    assert replies(5) == replies(0) == replies(12)
    assert replies(10) != replies(0)  # a real update plays its own episodes
    saved = json.loads((out / "selection.json").read_text())
    assert saved["step"] == chosen.step and len(saved["rows"]) == 4
    assert (out / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "curve.csv").read_text().splitlines()[0] == "step,success,lo,hi,reward,episodes"

    # every=2 plays the base, the 2nd checkpoint and the end; a rerun reuses the episodes already on disk.
    again = select_checkpoint(base, run, [ENV], range(100, 103), out, env_kwargs=lambda env_id: dict(KWARGS),
                              max_new_tokens=12, final_adapter=run / "adapter", every=2, in_flight=3)
    assert [r["step"] for r in again.rows] == [0, 10, 12]
    assert len(list(read_trajectories(out / "00010" / "trajectories.jsonl"))) == 3


def test_a_run_without_checkpoints_is_a_clear_error(grpo_run, tmp_path):
    from trace_train.train.select import select_checkpoint

    base, _ = grpo_run
    with pytest.raises(ValueError, match="save_steps"):
        select_checkpoint(base, tmp_path, [ENV], range(2), tmp_path / "o", env_kwargs=lambda e: {})
