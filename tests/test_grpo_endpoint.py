"""GRPO whose episodes come from an OpenAI-compatible endpoint, played through the rollout seam (issue 30, item 4).

TRL's ``GRPOTrainer`` (through :func:`trace_train.train.grpo.train`) trains a LoRA on the nano model for 2 steps,
while the policy's episodes are played by an :class:`~trace_train.agents.OpenAIChatAgent` on ``transformers serve``
serving the same nano model (the session's server, ``conftest.transformers_server``):

* (a) on the ``local`` backend, in 2 worker processes; (b) on the ``ray`` backend, on the actors of a real one-node
  Ray cluster. The trainer's process is forbidden to build an endpoint agent, so the episodes ran elsewhere;
* every member of a group is reset with the group's seed (its records, and identical prompts in the tokens TRL
  gets), hint mode and dynamic sampling go on working, and the train log has its rows;
* a bad endpoint config fails before training: no server at the URL, an engine or Ray setting that does not exist;
  a server that stops answering mid-run stops training instead of handing TRL episodes the policy never played.

Nothing syncs ``transformers serve`` with the trained weights (on GPUs, TRL's vLLM server mode does): the test is
about where the episodes run and what comes back, not about learning.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

#: The env the session's nano model was built on (conftest.model_dir).
ENV = "examples/warehouse_stock-v0"
GROUP = 2


def _config(model: str, url: str, out, **kw):
    from trace_train.train.grpo import TrainConfig

    # The nano model's generation config is greedy, and `transformers serve` samples only when told so.
    sample = {"generation_config": json.dumps({"do_sample": True, "eos_token_id": [2, 0], "pad_token_id": 0})}
    settings = dict(env_ids=[ENV], model=model, output_dir=str(out), policy_base_url=url, policy_extra_body=sample,
                    max_steps=2,
                    group_size=GROUP, groups_per_step=2, learning_rate=1e-3, calibration_groups=0, save_steps=10,
                    lora_r=4, lora_alpha=8, max_turn_tokens=16, max_tool_calling_iterations=2, hint_share=0.5,
                    resample_attempts=1, progress=False, plot=False, device="cpu")
    settings.update(kw)
    return TrainConfig(**settings)


@pytest.fixture
def seen(monkeypatch):
    """What the rollout function played and handed TRL (a spy: the real methods run), and a guard: an endpoint agent
    built in this (the trainer's) process fails the test."""
    from trace_train import agents
    from trace_train.train import grpo

    calls: dict[str, list] = {"play": [], "out": []}
    play, call = grpo.GroupRollouts._play, grpo.GroupRollouts.__call__

    def spy_play(self, agent, groups):
        played = play(self, agent, groups)
        calls["play"].append((agent, list(groups), [list(eps) for eps in played]))  # the caller replaces resampled ones
        return played

    def spy_call(self, prompts, trainer):
        rows = list(trainer._trace_rows)
        out = call(self, prompts, trainer)
        calls["out"].append((rows, out))
        return out

    def refuse(self, *args, **kwargs):
        raise AssertionError("an endpoint agent was built in the trainer's process")

    monkeypatch.setattr(grpo.GroupRollouts, "_play", spy_play)
    monkeypatch.setattr(grpo.GroupRollouts, "__call__", spy_call)
    monkeypatch.setattr(agents.OpenAIChatAgent, "__init__", refuse)
    return calls


def _check_run(result, calls, model_dir: str, engine: str) -> None:
    from trace_train.train.grpo import EndpointPolicy, read_log

    assert result.steps == 2
    rows = read_log(result.log_csv)
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert all(r["episodes"] >= GROUP * 2 and r["rollout_s"] > 0 and r["step_s"] > 0 for r in rows), rows
    assert (result.adapter_dir / "adapter_model.safetensors").exists()
    assert len(calls["out"]) == 2 and calls["play"]
    name = f"openai:{model_dir}"
    replies: list[str] = []
    for policy, groups, played in calls["play"]:
        assert isinstance(policy, EndpointPolicy) and policy.engine == engine
        for (env_id, seed, members), records in zip(groups, played):
            # Every member of the group was reset with its seed; half of it (hint_share) played with the hint.
            assert len(records) == members == GROUP
            assert {(r["env_id"], r["seed"]) for r in records} == {(env_id, seed)}
            assert sorted(r["agent"] for r in records) == [name, f"{name}+hint"]
            # The endpoint answered every turn (an unanswered request is an agent error), and its (sampled) text is
            # in the transcripts: the text re-tokenised for the loss.
            assert all(r["steps"] >= 1 and r["agent_errors"] == 0 and r["timing"]["agent_s"] > 0 for r in records)
            replies += [m["content"] for r in records for m in r["messages"] if m["role"] == "assistant"]
    assert len(replies) >= 8 and len(set(replies)) > 1, replies
    trained = 0
    for rows_, out in calls["out"]:
        trained += sum(sum(mask) for mask in out["env_mask"])
        # TRL's rows come in groups of one seed; their episodes' prompts (the task of the seed) are identical.
        assert len(out["prompt_ids"]) == len(rows_) == GROUP * 2
        for g in range(0, len(rows_), GROUP):
            assert len({r["seed"] for r in rows_[g:g + GROUP]}) == 1
            assert len({tuple(p) for p in out["prompt_ids"][g:g + GROUP]}) == 1
        assert out["prompt_ids"][0] != out["prompt_ids"][GROUP]
    assert trained > 0, "no token of the endpoint's replies reached the loss"


def test_grpo_plays_endpoint_episodes_in_local_worker_processes(model_dir, transformers_server, seen, tmp_path):
    from trace_train.train.grpo import train

    t0 = time.perf_counter()
    result = train(_config(model_dir, transformers_server, tmp_path, rollout_workers=2))
    _check_run(result, seen, model_dir, "local")
    print(f"\nGRPO, 2 steps, endpoint episodes in 2 local processes: {time.perf_counter() - t0:.1f} s")


def test_a_bad_endpoint_config_fails_before_training(tmp_path):
    from conftest import free_port

    from trace_train.train.grpo import ConfigError, TrainConfig, train

    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ConfigError, match="no OpenAI-compatible server answers there") as err:
        train(_config("/no/model/needed", url, tmp_path))
    assert "TrainConfig.policy_base_url" in str(err.value) and "transformers serve" in str(err.value)
    assert not any(tmp_path.iterdir()), "something was written before the config was checked"
    with pytest.raises(ConfigError, match=r"TrainConfig.rollout_engine = 'spark': choose one of local, ray"):
        _config("m", url, tmp_path, rollout_engine="spark")
    with pytest.raises(ConfigError, match=r"ray.num_actors must be >= 1, got 0"):
        _config("m", url, tmp_path, rollout_engine="ray", ray={"num_actors": 0})
    with pytest.raises(ConfigError, match=r"ray.num_actor: unknown key; did you mean num_actors"):
        _config("m", url, tmp_path, rollout_engine="ray", ray={"num_actor": 2})
    with pytest.raises(ConfigError, match=r"TrainConfig.rollout_engine = 'ray': the seam plays endpoint rollouts"):
        TrainConfig(env_ids=[ENV], model="m", output_dir=str(tmp_path), rollout_engine="ray")
    with pytest.raises(ConfigError, match=r"vllm_mode: server"):
        _config("m", url, tmp_path, use_vllm=True, vllm_mode="colocate")


def test_a_policy_server_that_stops_answering_stops_training(tmp_path):
    """The server is gone after the check (killed mid-run): every turn is an agent error, and the rollout function
    refuses to hand TRL a step of episodes the policy never played (here on the local backend, in this process)."""
    from types import SimpleNamespace

    from conftest import free_port

    from trace_train.train.grpo import GroupRollouts, env_kwargs_for

    cfg = _config("unused", f"http://127.0.0.1:{free_port()}/v1", tmp_path, hint_share=0.0, resample_attempts=0)
    rollouts = GroupRollouts(cfg, {ENV: env_kwargs_for(cfg, ENV)}, "cpu")
    rows = [{"seed": s, "environment": ENV} for s in (1_000_000, 1_000_001) for _ in range(GROUP)]
    trainer = SimpleNamespace(_trace_rows=rows, args=SimpleNamespace(top_p=1.0), state=SimpleNamespace(global_step=0),
                              model=SimpleNamespace(training=True))
    with pytest.raises(RuntimeError, match="every request of the step's 4 episodes to the policy server at"):
        rollouts(rows, trainer)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="pip install 'trace-rl[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_grpo_plays_endpoint_episodes_on_ray_actors(model_dir, transformers_server, ray_cluster, seen, tmp_path):
    from trace_train.train.grpo import train

    t0 = time.perf_counter()
    result = train(_config(model_dir, transformers_server, tmp_path, rollout_engine="ray",
                           ray={"num_actors": 2, "env_cpus": 0.5, "max_concurrent_per_actor": 4}))
    _check_run(result, seen, model_dir, "ray")
    # The episodes' agents lived on the cluster's rollout actors (the guard kept them out of this process). The GCS
    # actor table (ray.util.state would need the dashboard, which the test cluster leaves out).
    from ray._private.state import actors as actor_table

    actors = [a for a in actor_table().values() if a.get("ActorClassName") == "RolloutActor"]
    assert len(actors) >= 2 and all(a["Pid"] not in (0, os.getpid()) for a in actors), actors
    print(f"\nGRPO, 2 steps, endpoint episodes on {len(actors)} Ray actors: {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
