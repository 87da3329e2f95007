"""Quickstart: make a TRACE environment, play a few turns by hand, then let the reference agents play.

    python examples/quickstart.py

Needs only the environment suite (`pip install -e .`).
"""

from __future__ import annotations

import gymnasium as gym

import trace_envs
from trace_envs import make_agent, rollout
from trace_envs.core.conversation import hermes_tool_call


def main() -> None:
    env = gym.make("trace/tau_airline-v0")
    obs, info = env.reset(seed=7)  # the task is a pure function of the seed
    print("The customer says:", info["messages"][-1]["content"])
    print("Tools:", ", ".join(t["function"]["name"] for t in info["tools"]))

    # A turn is plain text (a message to the customer) or a tool call.
    obs, reward, terminated, truncated, info = env.step("Could you please provide your user id?")
    print("Customer:", obs)
    user_id = obs.rsplit(" ", 1)[-1].rstrip(".")
    obs, reward, terminated, truncated, info = env.step(hermes_tool_call("get_user_details", {"user_id": user_id}))
    print("Tool result:", obs[:200], "...")
    # Malformed turns come back as readable errors; step never raises because of the agent.
    obs, *_ = env.step('<tool_call>{"name": "cancel_reservation", "arguments": {"reservation": 1}}</tool_call>')
    print("Bad call:", obs)
    env.close()

    # The reference agents: the oracle solves every seed; each planted-deficit agent lacks one capability.
    for name in ["oracle", "tau:skip_precondition", "tau:stop_after_first", "tau:wrong_record", "tau:sloppy_arguments"]:
        rewards = [rollout("trace/tau_airline-v0", make_agent(name), seed)["reward"] for seed in range(30)]
        print(f"{name:24s} mean reward over 30 seeds: {sum(rewards) / len(rewards):.2f}")

    print(f"{len(trace_envs.registered())} environments registered; try `trace envs list`.")


if __name__ == "__main__":
    main()
