"""TRACE envs in a trainer that is not TRACE's: REINFORCE over tool calls, with the Gymnasium API only.

Proof that the environments plug into any trainer: this file touches them only through
``gym.make``, ``reset`` and ``step`` (plus the ``info`` dict every TRACE env returns: the tool
schemas and the transcript). No model is involved. The policy is a linear softmax over candidate
actions built each turn from what the agent has seen:

* call a tool that takes no argument;
* call a tool whose one argument is a string, with a value read from an earlier tool output
  (list items and object keys), e.g. ``get_stock(warehouse_id="WH-03")``;
* call a tool whose one argument is a number, with a sum over earlier tool outputs of the values
  under one key, e.g. ``submit_total(total=<sum of "tent">)``;
* send the user a message.

Each candidate has a few generic features (is it new, does its key appear in the user's request,
is everything listed already read, ...). REINFORCE with a mean-reward baseline learns weights over
them, starting from a weak prior against repeated calls (:data:`PRIOR`); on the worked example env the policy learns to list, read every warehouse and submit the
right sum, and the mean reward climbs from near 0 towards 1 within seconds.

Launch::

    python examples/other_trainer.py                  # the worked example env (examples/registry.yaml), seconds
    python examples/other_trainer.py --env trace/tau_airline-v0 --iterations 20

On the τ² targets this naive policy stays near 0 (they need conversations and multi-argument
writes); the run shows the API works end to end there too.
"""

from __future__ import annotations

import argparse
from pathlib import Path
import json
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

import trace_envs  # noqa: F401 - registers the TRACE ids (and TRACE_REGISTRY workspaces) with gymnasium

FEATURES = ["bias_no_arg_call", "string_call_new_value", "string_call_repeat", "sum_call",
            "sum_key_in_request", "all_values_read", "message", "no_arg_call_repeat"]

#: Initial weights: a weak prior against repeating calls and chatting. Everything else starts at 0.
PRIOR = {"string_call_new_value": 1.0, "string_call_repeat": -1.0, "no_arg_call_repeat": -1.0, "message": -2.0}


@dataclass
class Candidate:
    action: str
    features: np.ndarray


def _tool_call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _harvest(info: dict) -> tuple[list[str], dict[str, float]]:
    """Strings (list items, object keys) and per-key sums of numbers in every tool output so far."""
    strings: list[str] = []
    sums: dict[str, float] = {}
    for message in info.get("messages", []):
        if message.get("role") != "tool":
            continue
        try:
            value = json.loads(message.get("content") or "")
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            strings += [v for v in value if isinstance(v, str)]
        elif isinstance(value, dict):
            for key, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    sums[key] = sums.get(key, 0) + v
    return list(dict.fromkeys(strings)), sums


def candidates(info: dict) -> list[Candidate]:
    """The actions on offer this turn, each with its feature vector."""
    messages = info.get("messages", [])
    request = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "").lower()
    called = [(tc["function"]["name"], tc["function"]["arguments"])
              for m in messages for tc in (m.get("tool_calls") or [])]
    called_args = {json.dumps(json.loads(a), sort_keys=True) if isinstance(a, str) else json.dumps(a, sort_keys=True)
                   for _, a in called}
    called_names = {n for n, _ in called}
    strings, sums = _harvest(info)
    used_strings = {s for s in strings if any(s in a for a in called_args)}
    all_read = bool(strings) and used_strings == set(strings)
    out: list[Candidate] = []

    def add(action: str, **on: float) -> None:
        f = np.zeros(len(FEATURES))
        for k, v in on.items():
            f[FEATURES.index(k)] = v
        out.append(Candidate(action, f))

    for schema in info.get("tools", []):
        fn = schema["function"]
        props = fn["parameters"].get("properties", {})
        required = fn["parameters"].get("required", [])
        if not required:
            add(_tool_call(fn["name"], {}), bias_no_arg_call=1, no_arg_call_repeat=float(fn["name"] in called_names))
        elif len(required) == 1:
            arg = required[0]
            kind = props[arg].get("type")
            if kind == "string":
                for s in strings[:20]:
                    add(_tool_call(fn["name"], {arg: s}),
                        string_call_new_value=float(s not in used_strings), string_call_repeat=float(s in used_strings))
            elif kind in ("integer", "number"):
                for key, total in list(sums.items())[:20]:
                    value = int(total) if kind == "integer" else float(total)
                    add(_tool_call(fn["name"], {arg: value}), sum_call=1,
                        sum_key_in_request=float(key.lower() in request), all_values_read=float(all_read))
    add("Could you tell me more about what you need?", message=1)
    return out


def run_episode(env: gym.Env, weights: np.ndarray, seed: int, rng: np.random.Generator, max_turns: int = 30):
    """One episode with the softmax policy; returns (total reward, [(features of all candidates, chosen)])."""
    _, info = env.reset(seed=seed)
    trace = []
    total = 0.0
    for _ in range(max_turns):
        cands = candidates(info)
        feats = np.stack([c.features for c in cands])
        logits = feats @ weights
        p = np.exp(logits - logits.max())
        p /= p.sum()
        choice = int(rng.choice(len(cands), p=p))
        trace.append((feats, p, choice))
        _, reward, terminated, truncated, info = env.step(cands[choice].action)
        total += float(reward)
        if terminated or truncated:
            break
    return total, trace


def train(env_id: str, iterations: int, episodes: int, lr: float, seed: int, seeds: int) -> list[float]:
    """REINFORCE; returns the mean reward of each iteration."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    # A weak prior (avoid repeats and chatting, prefer unread values); what to submit is left to learning.
    weights = np.zeros(len(FEATURES))
    for name, value in PRIOR.items():
        weights[FEATURES.index(name)] = value
    curve: list[float] = []
    try:
        for it in range(iterations):
            batch = [run_episode(env, weights, int(rng.integers(seeds)), rng) for _ in range(episodes)]
            rewards = np.array([r for r, _ in batch])
            baseline = rewards.mean()
            grad = np.zeros_like(weights)
            for reward, trace in batch:
                for feats, p, choice in trace:
                    grad += (reward - baseline) * (feats[choice] - p @ feats)  # ∇ log softmax
            weights += lr * grad / episodes
            curve.append(float(baseline))
            print(f"iteration {it + 1:3d}  mean reward {baseline:.3f}  " + "#" * int(round(baseline * 40)), flush=True)
    finally:
        env.close()
    return curve


def register_examples(env_id: str) -> None:
    """Register ``examples/registry.yaml`` (this folder's workspace) when ``env_id`` is one of its ids, so that the
    example runs from any folder without ``TRACE_REGISTRY=examples``."""
    from trace_envs.core.registry import load_registry, registered

    if env_id.startswith("examples/") and env_id not in {e.id for e in registered()}:
        load_registry(Path(__file__).resolve().with_name("registry.yaml"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="examples/warehouse_stock-v0", help="a registered env id")
    parser.add_argument("--iterations", type=int, default=50, help="policy updates")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per update")
    parser.add_argument("--lr", type=float, default=5.0, help="step size")
    parser.add_argument("--seeds", type=int, default=1000, help="task seeds are drawn from range(seeds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the learner's own randomness")
    args = parser.parse_args(argv)
    register_examples(args.env)
    t0 = time.perf_counter()
    curve = train(args.env, args.iterations, args.episodes, args.lr, args.seed, args.seeds)
    k = max(1, len(curve) // 5)
    first, last = float(np.mean(curve[:k])), float(np.mean(curve[-k:]))
    print(f"{args.env}: mean reward {first:.3f} (first {k} iterations) -> {last:.3f} (last {k}) "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
