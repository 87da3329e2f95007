"""The report's link table (trace_train.report.links) on a small hand-made run with known per-family results.

Two capabilities, each diagnosed on one target family (A on ``f1``, B on ``f2``), and a third family ``f3`` the
base half solves. By construction: SFT lifts ``f1`` only (L1 holds for A, not for B); GRPO lifts A's own env
and B's env was not measured (L2 partly measured); adapter A lifts ``f1`` and keeps ``f3``, adapter B lifts
nothing (L3 fails for B); the MoE lifts ``f1`` and ``f2`` and beats both adapters (L4 holds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SEEDS = range(20)


def _episodes(env_id: str, agent: str, outcome) -> list[dict]:
    """One record per (family, seed); ``outcome(family, seed) -> success``."""
    out = []
    for family in ("f1", "f2", "f3"):
        for s in SEEDS:
            ok = bool(outcome(family, s))
            out.append({"env_id": env_id, "seed": 100 * int(family[1]) + s, "sample": 0, "agent": agent,
                        "scenario": family, "success": ok, "reward": float(ok), "termination": "agent_stop",
                        "reward_breakdown": {"informed": float(ok)}})
    return out


def _write(path: Path, records: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def run_dir(tmp_path):
    from trace_train.evaluate import evaluate

    run = tmp_path / "run"
    for cap, family in (("cap_a", "f1"), ("cap_b", "f2")):
        spec = {"name": cap, "failure_families": {family: 5}}
        (run / "diagnosis" / "specs").mkdir(parents=True, exist_ok=True)
        (run / "diagnosis" / "specs" / f"{cap}.json").write_text(json.dumps(spec))
    half = lambda f, s: f == "f3" and s % 2 == 0  # noqa: E731 - the base: half of f3, nothing else
    methods = {
        "base": half,
        "sft": lambda f, s: f == "f1" or half(f, s),
        "adapter:cap_a": lambda f, s: f == "f1" or half(f, s),
        "adapter:cap_b": half,
        "trace_moe": lambda f, s: f in ("f1", "f2") or half(f, s),
    }
    results = {"methods": {}, "n_seeds": 60, "samples": 1, "temperature": 0.0, "ks": [1]}
    for key, outcome in methods.items():
        rel = Path("eval") / key.replace(":", "_") / "trajectories.jsonl"
        _write(run / rel, _episodes("trace/target-v0", key, outcome))
        metrics = evaluate(run / rel, ks=(1,), n_boot=0)
        results["methods"][key] = {"label": key, "available": True, "trajectories": str(rel),
                                   "overall": metrics["overall"]}
    # Where the MoE's router sent each family's tokens (the evaluate stage writes it beside the episodes).
    (run / "eval" / "trace_moe" / "routing_by_family.csv").write_text(
        "env_id,role,tokens,base,cap_a,cap_b\n"
        "f1,all,900,0.1,0.8,0.1\nf1,assistant,300,0.1,0.8,0.1\nf1,system,600,0.5,0.5,0.0\n"
        "f2,assistant,800,0.2,0.1,0.7\nf3,assistant,700,0.9,0.05,0.05\nf3,all,2000,0.3,0.3,0.4\n")
    results["methods"]["trace_moe"]["routing_by_family"] = "routing_by_family.csv"
    (run / "eval" / "results.json").write_text(json.dumps(results))
    env = lambda agent, rate: [{"env_id": "gen/cap_a-v0", "seed": s, "sample": 0, "agent": agent,  # noqa: E731
                                "success": s < rate, "reward": float(s < rate), "termination": "agent_stop",
                                "reward_breakdown": {"evidence": 1.0, "informed": float(s < rate)}}
                               for s in range(30)]
    _write(run / "eval" / "env" / "cap_a" / "base" / "trajectories.jsonl", env("base", 3))
    _write(run / "eval" / "env" / "cap_a" / "adapter" / "trajectories.jsonl", env("adapter", 27))
    return run


def test_the_links_follow_the_per_family_results(run_dir):
    from trace_train.report.links import capability_families, compute_links

    assert capability_families(run_dir) == {"cap_a": ["f1"], "cap_b": ["f2"]}
    links = compute_links(run_dir, n_boot=500, seed=0)

    l1 = {r["capability"]: r for r in links["L1"]["rows"]}
    assert l1["cap_a"]["delta"]["value"] == pytest.approx(1.0) and l1["cap_a"]["held"] is True
    assert l1["cap_b"]["delta"]["value"] == pytest.approx(0.0) and l1["cap_b"]["held"] is False
    assert links["L1"]["verdict"] == "failed"
    assert links["L1"]["per_family"]["f3"]["value"] == pytest.approx(0.0)

    l2 = {r["capability"]: r for r in links["L2"]["rows"]}
    assert l2["cap_a"]["delta"]["value"] == pytest.approx((27 - 3) / 30) and l2["cap_a"]["held"] is True
    assert l2["cap_a"]["breakdown"]["base"]["informed"] == pytest.approx(0.1)
    assert l2["cap_a"]["breakdown"]["adapter"]["informed"] == pytest.approx(0.9)
    assert l2["cap_b"]["delta"] is None and links["L2"]["verdict"] == "partly measured"

    l3 = {r["capability"]: r for r in links["L3"]["rows"]}
    assert l3["cap_a"]["delta"]["value"] == pytest.approx(1.0)
    assert l3["cap_a"]["others"]["value"] == pytest.approx(0.0) and l3["cap_a"]["held"] is True
    assert l3["cap_b"]["delta"]["value"] == pytest.approx(0.0) and l3["cap_b"]["held"] is False
    assert links["L3"]["verdict"] == "failed"

    l4 = links["L4"]
    assert l4["overall"]["value"] == pytest.approx(40 / 60) and l4["overall"]["ci"][0] > 0
    assert l4["moe"] == pytest.approx(50 / 60) and l4["best_single"] == ("adapter:cap_a", pytest.approx(30 / 60))
    assert l4["per_family"]["f2"]["value"] == pytest.approx(1.0) and l4["verdict"] == "held"
    assert links["L4"]["sentence"].startswith("L4 held")
    assert l4["routing"] == {"f1": {"base": 0.1, "cap_a": 0.8, "cap_b": 0.1},
                             "f2": {"base": 0.2, "cap_a": 0.1, "cap_b": 0.7},
                             "f3": {"base": 0.9, "cap_a": 0.05, "cap_b": 0.05}}
    assert "cap_b +0.000" in links["L3"]["sentence"]
    # MoE − the best single adapter, paired: +1/3 (f2 won), with its interval.
    assert l4["versus_best"]["value"] == pytest.approx(20 / 60) and l4["versus_best"]["ci"][0] > 0


def test_a_capability_the_run_left_out_is_not_a_link(run_dir):
    """The diagnosis retained a third capability but diagnose.max_capabilities left it out (no env, no adapter):
    it gets no row in any link, so it can neither fail L1 through the SFT baseline nor leave L2/L3 "partly
    measured" for want of an adapter. Without the stage record (a hand-made run folder), every diagnosed
    capability is read."""
    from trace_train.report.links import capability_families, compute_links

    spec = {"name": "cap_c", "failure_families": {"f3": 9}}
    (run_dir / "diagnosis" / "specs" / "cap_c.json").write_text(json.dumps(spec))
    assert set(capability_families(run_dir)) == {"cap_a", "cap_b", "cap_c"}
    (run_dir / "stages.json").write_text(json.dumps({"stages": {"diagnose": {"status": "done", "summary": {
        "retained": ["cap_a", "cap_b", "cap_c"], "selected": ["cap_a", "cap_b"],
        "dropped_by_max_capabilities": ["cap_c"]}}}}))
    assert capability_families(run_dir) == {"cap_a": ["f1"], "cap_b": ["f2"]}
    links = compute_links(run_dir, n_boot=200, seed=0)
    for link in ("L1", "L2", "L3"):
        assert [r["capability"] for r in links[link]["rows"]] == ["cap_a", "cap_b"]
    assert "cap_c" not in links["L1"]["sentence"] + links["L3"]["sentence"]


def test_l1_prefers_sft_on_the_capabilitys_own_env(run_dir):
    """Where the run has SFT on one capability's env alone (its GRPO run's warm-up, evaluated as `sft:<cap>`), L1
    reads that capability from it; the others still from the SFT baseline on every env."""
    from trace_train.evaluate import evaluate
    from trace_train.report.links import compute_links

    rel = Path("eval") / "sft_cap_b" / "trajectories.jsonl"
    _write(run_dir / rel, _episodes("trace/target-v0", "sft:cap_b", lambda f, s: f == "f2" and s < 15))
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    results["methods"]["sft:cap_b"] = {"label": "sft:cap_b", "available": True, "trajectories": str(rel),
                                       "overall": evaluate(run_dir / rel, ks=(1,), n_boot=0)["overall"]}
    (run_dir / "eval" / "results.json").write_text(json.dumps(results))
    l1 = {r["capability"]: r for r in compute_links(run_dir, n_boot=500, seed=0)["L1"]["rows"]}
    assert l1["cap_b"]["sft"] == "sft:cap_b" and l1["cap_b"]["delta"]["value"] == pytest.approx(0.75)
    assert l1["cap_b"]["held"] is True
    assert l1["cap_a"]["sft"] == "sft" and l1["cap_a"]["delta"]["value"] == pytest.approx(1.0)
    # a warm-up on episodes of its own (e.g. decision-blind ones) is no transfer ceiling: the SFT baseline decides
    (run_dir / "config.yaml").write_text("train:\n  options:\n    sft_warmup_env_kwargs: {size: {blind_cabin_prob: 0.5}}\n")
    l1 = {r["capability"]: r for r in compute_links(run_dir, n_boot=500, seed=0)["L1"]["rows"]}
    assert l1["cap_b"]["sft"] == "sft" and l1["cap_b"]["delta"]["value"] == pytest.approx(0.0)
    # ... unless the trainer found that those kwargs changed none of this env's episodes (its own, then)
    done = run_dir / "train" / "cap_b" / "run" / "sft_warmup" / "done.json"
    done.parent.mkdir(parents=True)
    for changed, reads in (([0, 16], "sft:cap_b"), ([7, 16], "sft")):
        done.write_text(json.dumps({"overlay_changed": {"gen/cap_b-v0": changed}}))
        l1 = {r["capability"]: r for r in compute_links(run_dir, n_boot=500, seed=0)["L1"]["rows"]}
        assert l1["cap_b"]["sft"] == reads


def test_grpo_is_split_from_the_sft_warm_up_it_started_from(run_dir):
    """A GRPO run with an SFT warm-up: L2 and L3 say what GRPO added over the warm-up (on the env, and on the
    capability's families), beside the verdict, which stays the run's as a whole. Here the warm-up paid most of
    the env gain (3 → 21 of 30; GRPO 21 → 27) and all of the target gain (GRPO added nothing on f1)."""
    from trace_train.evaluate import evaluate
    from trace_train.report.links import compute_links
    from trace_train.report.run_report import write_report

    rel = Path("eval") / "sft_cap_a" / "trajectories.jsonl"
    _write(run_dir / rel, _episodes("trace/target-v0", "sft:cap_a", lambda f, s: f == "f1" or (f == "f3" and s < 6)))
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    results["methods"]["sft:cap_a"] = {"label": "sft:cap_a", "available": True, "trajectories": str(rel),
                                       "overall": evaluate(run_dir / rel, ks=(1,), n_boot=0)["overall"]}
    (run_dir / "eval" / "results.json").write_text(json.dumps(results))
    warm = [{"env_id": "gen/cap_a-v0", "seed": s, "sample": 0, "agent": "warmup", "success": s < 21,
             "reward": float(s < 21), "termination": "agent_stop",
             "reward_breakdown": {"evidence": 0.5, "informed": float(s < 21)}} for s in range(30)]
    _write(run_dir / "eval" / "env" / "cap_a" / "warmup" / "trajectories.jsonl", warm)

    links = compute_links(run_dir, n_boot=500, seed=0)
    l2 = {r["capability"]: r for r in links["L2"]["rows"]}
    assert l2["cap_a"]["grpo"]["value"] == pytest.approx(6 / 30)
    assert l2["cap_a"]["grpo"]["base"] == pytest.approx(21 / 30)
    assert l2["cap_a"]["breakdown"]["warmup"]["evidence"] == pytest.approx(0.5)
    assert l2["cap_a"]["held"] is True and l2["cap_b"]["grpo"] is None  # no warm-up episodes for cap_b
    l3 = {r["capability"]: r for r in links["L3"]["rows"]}
    assert l3["cap_a"]["grpo"]["value"] == pytest.approx(0.0) and l3["cap_a"]["held"] is True
    assert l3["cap_b"]["grpo"] is None
    assert "cap_a +0.800 [" in links["L2"]["sentence"] and "(GRPO over its SFT warm-up +0.200 [" in \
        links["L2"]["sentence"]

    text = write_report(run_dir).markdown.read_text()
    assert "| L2 | cap_a: GRPO over its SFT warm-up, on its env | +0.200 [" in text
    assert "| L3 | cap_a: GRPO over its SFT warm-up, on its families | +0.000" in text
    assert "| cap_a | 0.100 | 0.700 | 0.900 | +0.800 [" in text  # before, after the warm-up, after GRPO
    assert "| cap_a | evidence | 1.00 | 0.50 | 1.00 |" in text


def test_the_report_has_the_links_section(run_dir):
    from trace_train.report.run_report import write_report

    paths = write_report(run_dir)
    text = paths.markdown.read_text()
    assert "# Links: where the claim holds and where it breaks" in text
    assert "| L4 | MoE vs base | +0.667 [" in text and "L3 failed" in text
    assert "| L2 | cap_a adapter on its env | +0.800 [" in text
    assert "| f2 |" in text  # the per-family table
    assert "| f1 | 0.10 | 0.80 | 0.10 |" in text  # where the router sent each family


def test_the_training_section_shows_each_runs_chosen_checkpoint(run_dir):
    """Checkpoint selection in the report: the chosen step beside the last one, and a zero-update run that
    had nothing to choose from says so."""
    from trace_train.report.run_report import write_report

    sel = {"step": 10, "final_step": 75, "success": 0.44, "final_success": 0.30, "base_success": 0.21,
           "seeds": [100, 150], "episodes": 450, "curve_png": None}
    train = {"adapters": {"cap_a": {"env_ids": ["gen/cap_a-v0"], "sft": False, "steps": 75, "rollouts": 1050,
                                    "selected": sel},
                          "cap_b": {"env_ids": ["gen/cap_b-v0"], "sft": False, "steps": 70, "rollouts": 560,
                                    "selected": {"step": 70, "final_step": 70,
                                                 "skipped": "a zero update: every checkpoint is the base"}}},
             "baselines": {}}
    (run_dir / "train").mkdir(exist_ok=True)
    (run_dir / "train" / "results.json").write_text(json.dumps(train))
    text = write_report(run_dir).markdown.read_text()
    assert "played seeds 100-149 of the run's own envs" in text
    assert "| `cap_a` | 10 | 75 | 0.21 | 0.44 | 0.30 | – |" in text
    assert "| `cap_b` | 70 | 70 | – | – | – | a zero update: every checkpoint is the base |" in text
    assert "Lead-in questions" not in text
    # lead_in: auto: the families the train stage chose, with the base's rollout record behind them.
    lead_in = {"families": ["flight_status"], "base_rollouts": {"flight_status": [21, 30], "info": [2, 27]},
               "min_success": 0.5, "min_episodes": 5}
    (run_dir / "stages.json").write_text(json.dumps({"stages": {"train": {"status": "done", "summary": {
        "lead_in": lead_in}}}}))
    text = write_report(run_dir).markdown.read_text()
    assert ("Lead-in questions (`lead_in: auto`): `flight_status`, the target families the base answered in at "
            "least 50% of at least 5 rollout episodes" in text
            and "(its rollouts: flight_status 21 of 30, info 2 of 27)" in text)


@pytest.mark.parametrize("delta, verdict", [((+0.10, +0.05, +0.15), "above the base, outside the interval"),
                                             ((-0.295, -0.36, -0.23), "below the base, outside the interval"),
                                             ((+0.02, -0.03, +0.07), "within the interval (not significant)")])
def test_the_headline_says_which_side_of_the_base_the_moe_is_on(tmp_path, delta, verdict):
    """A MoE significantly below the base is said to be below it, not "within the interval"."""
    from trace_train.report.document import Document
    from trace_train.report.run_report import _headline

    def method(value, d=None):
        m = {"available": True, "overall": {"pass@1": {"value": value, "ci": [value - 0.05, value + 0.05]}}}
        if d:
            m["delta_vs_base"] = {"pass@1": {"value": d[0], "ci": [d[1], d[2]]}}
        return m

    methods = {"base": method(0.4), "trace_moe": method(0.4 + delta[0], delta)}
    results = {"n_seeds": 200, "samples": 1, "methods": methods}
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.json").write_text(json.dumps(results))
    doc = Document("t")
    _headline(doc, tmp_path, {})
    text = " ".join(b[1] for b in doc.blocks if b[0] == "p")
    assert f"— {verdict}." in text
