"""``trace compose`` end to end: router training on successful episodes of two envs, routing statistics,
the baselines (PEFT linear / TIES merges, per-episode routing) and every method as an HFAgent."""

from __future__ import annotations

import csv
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from trace_envs import rollout  # noqa: E402
from trace_envs.agents import OracleAgent  # noqa: E402
from trace_train.cli import main  # noqa: E402

# Two envs whose conversations differ (a warehouse and an airline), one adapter named after each capability.
ENVS = {"examples/warehouse_stock-v0": ("structured_data_reasoning", {}),
        "trace/precondition_verification-v0": ("precondition_verification", {"domain": "airline", "prompt": "compact"})}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One `trace compose` run shared by the tests of this file (about 20 s on 2 cores)."""
    torch.set_num_threads(1)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_train.tiny.build import build_model

    root = tmp_path_factory.mktemp("compose_run")
    base = str(build_model("nano", out=root / "nano", env_ids=list(ENVS), corpus_seeds=2).path)
    adapters = {}
    for i, (cap, _) in enumerate(ENVS.values()):
        torch.manual_seed(10 + i)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False))
        model.save_pretrained(str(root / "train" / cap / "adapter"))
        adapters[cap] = str(root / "train" / cap / "adapter")
    data = root / "episodes.jsonl"
    with open(data, "w") as f:
        for env, (_, kwargs) in ENVS.items():
            for seed in range(4):
                f.write(json.dumps(rollout(env, OracleAgent(), seed=seed, env_kwargs=kwargs)) + "\n")
            failed = rollout(env, lambda obs, info: "I cannot help.", seed=9, env_kwargs=kwargs)
            assert not failed["success"]
            f.write(json.dumps(failed) + "\n")  # not trained on, but counted in the routing statistics
    out = root / "compose"
    status = main(["compose", "--base", base, "--adapters", *adapters.values(), "--data", str(data),
                   "--out", str(out), "--epochs", "6", "--lr", "0.05", "--accumulate", "1", "--max-length", "640",
                   "--no-progress"])
    assert status == 0
    return {"base": base, "adapters": adapters, "data": data, "out": out, "root": root}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_compose_writes_the_model_its_training_log_and_routing_stats(run, capsys):
    out = run["out"]
    spec = json.loads((out / "compose.json").read_text())
    assert [a["name"] for a in spec["adapters"]] == ["structured_data_reasoning", "precondition_verification"]
    assert spec["training"]["episodes"] == 8  # the successful ones only
    log = read_csv(out / "router_log.csv")
    assert len(log) == 6 * 8 and float(log[-1]["label"]) < float(log[0]["label"])
    rows = read_csv(out / "routing.csv")
    assert {(r["env_id"], r["role"]) for r in rows} >= {(env, role) for env in ENVS for role in ("all", "system")}
    slots = ["base"] + [a["name"] for a in spec["adapters"]]
    for r in rows:
        assert abs(sum(float(r[s]) for s in slots) - 1) < 1e-3
    for png in ("routing.png", "router_loss.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_router_sends_each_envs_tokens_to_its_own_adapter(run):
    """The label loss is learnt: most of an env's tokens go to the adapter of its capability."""
    rows = {r["env_id"]: r for r in read_csv(run["out"] / "routing.csv") if r["role"] == "all"}
    for env, (cap, _) in ENVS.items():
        other = next(c for c, _ in ENVS.values() if c != cap)
        assert float(rows[env][cap]) > 0.5 and float(rows[env][cap]) > float(rows[env][other]), rows[env]


def test_every_method_runs_as_an_hf_agent_and_per_episode_routing_is_the_chosen_adapter(run):
    from trace_train.agents import HFAgent

    methods = json.loads((run["out"] / "methods.json").read_text())
    assert set(methods) == {"composed", "linear", "ties", "per_episode", "adapter:structured_data_reasoning",
                            "adapter:precondition_verification"}
    for name in ("linear", "ties"):
        merge = json.loads((run["out"] / "baselines" / name / "merge.json").read_text())
        assert merge["method"] == name and all(len(a["sha256"]) == 64 for a in merge["adapters"])
    import gymnasium as gym

    env_id = "trace/precondition_verification-v0"
    env = gym.make(env_id, **ENVS[env_id][1])
    obs, info = env.reset(seed=3)
    env.close()
    replies = {}
    for name, m in methods.items():
        agent = HFAgent(m["model"], adapter=m["adapter"], max_new_tokens=6)
        replies[name] = agent(obs, info)
        if name == "per_episode":
            assert agent.model.episode_router().last_slots == [2]  # precondition_verification
    # Per-episode routing runs exactly base + the chosen adapter (weight 1) for the whole episode.
    assert replies["per_episode"] == replies["adapter:precondition_verification"]


def test_cli_errors_are_one_line_and_lose_nothing(run, tmp_path, capsys):
    failed_only = tmp_path / "failed.jsonl"
    failed_only.write_text("\n".join(line for line in run["data"].read_text().splitlines()
                                     if not json.loads(line)["success"]) + "\n")
    args = ["compose", "--base", run["base"], "--adapters", *run["adapters"].values(), "--out", str(tmp_path / "o")]
    assert main(args + ["--data", str(failed_only)]) == 2
    assert "none of the 2 trajectories succeeded" in capsys.readouterr().err
    assert main(args + ["--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such trajectory file" in capsys.readouterr().err
    assert main(args + ["--data", str(failed_only), "--baselines", "soup"]) == 2
    assert "unknown baselines" in capsys.readouterr().err
    assert main(args + ["--data", str(run["data"]), "--prefit-steps", "-1"]) == 2
    assert "prefit_steps must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_adapters_from_trace_train_label_the_envs_they_were_trained_on(tmp_path):
    """An adapter folder written by `trace train` names its envs (trace_adapter.json); explicit claims and
    the capability-name rule fill in the rest; an env claimed twice goes to the first adapter."""
    from trace_train.compose.data import label_slots, trained_envs

    (tmp_path / "trace_adapter.json").write_text(json.dumps({"env_ids": ["trace/tool_calling_precision-v0"]}))
    assert trained_envs(tmp_path) == ["trace/tool_calling_precision-v0"]
    assert trained_envs(tmp_path / "missing") == []
    records = [{"env_id": "trace/tool_calling_precision-v0"}, {"env_id": "trace/precondition_verification-v0"},
               {"env_id": "examples/warehouse_stock-v0"}]
    slots = label_slots(records, ["tcp", "precondition_verification", "other"],
                        {"tcp": trained_envs(tmp_path), "other": ["trace/tool_calling_precision-v0"]})
    assert slots == {"trace/tool_calling_precision-v0": 1, "trace/precondition_verification-v0": 2}
    with pytest.raises(ValueError, match="unknown adapters"):
        label_slots(records, ["a"], {"b": ["x"]})


def test_an_adapter_with_a_zero_update_is_left_out_and_its_env_labels_the_base_slot(run, tmp_path, capsys):
    """GRPO whose every group was flat leaves PEFT's initial B = 0: that adapter is the base slot over again.
    compose leaves it out (no router split between two copies of the base, no merge diluted by it), its env's
    episodes teach the gates to pick the base, and per-episode routing (a choice among adapters) is skipped."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    zero = tmp_path / "precondition_verification"
    get_peft_model(AutoModelForCausalLM.from_pretrained(run["base"]),
                   LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS)).save_pretrained(str(zero))
    out = tmp_path / "compose"
    learnt = run["adapters"]["structured_data_reasoning"]
    args = ["compose", "--base", run["base"], "--adapters", learnt, str(zero), "--data", str(run["data"]),
            "--epochs", "6", "--lr", "0.05", "--accumulate", "1", "--max-length", "640", "--no-progress"]
    assert main(args + ["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "left out precondition_verification" in printed
    assert "trace/precondition_verification-v0 -> base" in printed
    spec = json.loads((out / "compose.json").read_text())
    assert [a["name"] for a in spec["adapters"]] == ["structured_data_reasoning"]
    methods = json.loads((out / "methods.json").read_text())
    assert set(methods) == {"composed", "linear", "ties", "adapter:structured_data_reasoning",
                            "adapter:precondition_verification"}
    rows = {r["env_id"]: r for r in read_csv(out / "routing.csv") if r["role"] == "all"}
    pv, wh = rows["trace/precondition_verification-v0"], rows["examples/warehouse_stock-v0"]
    assert float(pv["base"]) > 0.5 and float(pv["base"]) > float(pv["structured_data_reasoning"]), pv
    assert float(wh["structured_data_reasoning"]) > 0.5, wh
    # An adapter with an update that the caller judged to add nothing (trace run's compose.drop_unimproved) is left
    # out the same way, with the caller's reason; a name that was not given is refused before anything loads.
    from trace_train.compose import compose
    from trace_train.compose.adapters import ComposeError

    other = run["adapters"]["precondition_verification"]
    res = compose(run["base"], {"structured_data_reasoning": learnt, "precondition_verification": other},
                  str(run["data"]), tmp_path / "judged", train={"epochs": 1, "lr": 0.05, "accumulate": 1},
                  max_length=640, baselines=["linear"], progress=False,
                  leave_out={"precondition_verification": "no checkpoint beat the base"})
    assert res.dropped == ["precondition_verification"]
    assert res.dropped_why == {"precondition_verification": "no checkpoint beat the base"}
    assert res.labelled_envs["trace/precondition_verification-v0"] == "base"
    judged = json.loads((tmp_path / "judged" / "compose.json").read_text())
    assert [a["name"] for a in judged["adapters"]] == ["structured_data_reasoning"]
    with pytest.raises(ComposeError, match="leave_out names adapters that were not given"):
        compose(run["base"], [learnt], str(run["data"]), tmp_path / "never", leave_out={"nobody": "x"})
    assert not (tmp_path / "never").exists()
    # Asked to keep it, the zero adapter is a slot like any other (the paper's composition of every adapter).
    assert main(args + ["--out", str(tmp_path / "kept"), "--keep-zero-updates", "--baselines"]) == 0
    kept = json.loads((tmp_path / "kept" / "compose.json").read_text())
    assert [a["name"] for a in kept["adapters"]] == ["structured_data_reasoning", "precondition_verification"]
