"""``trace/tau_retail-v0``: τ²-bench's retail customer-service domain as a Gymnasium environment."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..base import TauEnv
from ..db import Layer
from ..task import TauTask
from . import db as retail_db
from . import tasks as retail_tasks
from .tools import RetailTools

_HERE = Path(__file__).resolve().parent
_POLICY: dict[bool, str] = {}


class RetailDomain:
    """The retail domain for :class:`~trace_envs.domains.base.TauEnv` (see ``base.Domain``)."""

    name = "retail"
    toolkit_cls = RetailTools
    scenarios = retail_tasks.SCENARIOS
    sizes = retail_db.SIZES

    def policy(self, compact: bool = False) -> str:
        text = _POLICY.get(compact)
        if text is None:
            text = _POLICY[compact] = (_HERE / ("policy_compact.md" if compact else "policy.md")).read_text(
                encoding="utf-8").strip()
        return text

    def generate_db(self, rng: np.random.Generator, size: dict) -> dict[str, dict[str, dict]]:
        return retail_db.generate_db(rng, size)

    def generate_task(self, rng: np.random.Generator, db: Layer, scenarios: list[str], size: dict) -> TauTask:
        return retail_tasks.generate_task(rng, db, scenarios, size)

    def load_tau2(self, path: Path) -> tuple[dict[str, dict[str, dict]], list[TauTask]]:
        return retail_tasks.load_tau2(path)


class TauRetailEnv(TauEnv):
    """An online store's customer-service desk, after τ²-bench's retail domain.

    ## Description
    The agent serves one customer per episode: it authenticates them (email, or name + zip code),
    then handles their requests with the store's tools under a written policy — cancel or modify
    pending orders (items, shipping address, payment method), return or exchange delivered orders,
    change the default address, answer questions about orders, gift cards and products — and
    refuses what the policy forbids (another customer's order or account, changes to an order
    whose items were already modified, wrong statuses, refunds to a method that did not pay, ...).
    The database (products with variants, users with payment methods, orders with items,
    fulfillments and payment history) and the task are generated from the seed. Scenario families:
    ``cancel``, ``modify_items``, ``modify_address``, ``modify_payment``, ``return``, ``exchange``,
    ``user_address``, ``info`` and ``bundle`` (2–3 requests in one conversation); about a third
    of the requests are refusals. The user is scripted (deterministic) by default.

    ## Action Space
    Text: the assistant's turn — a tool call (Hermes ``<tool_call>`` block, bare JSON or an OpenAI
    assistant message) or a message to the user. One tool call per turn.

    ## Observation Space
    Text: the system policy, the tool list and the user's opening message after ``reset``; then the
    tool's output or the user's reply. ``info["messages"]`` holds the transcript (OpenAI format) and
    ``info["tools"]`` the tool schemas.

    ## Rewards
    0 until the end; then the product of the task's components: ``DB`` (the database after the
    agent's writes equals the database after the gold writes) and ``COMMUNICATE`` (every required
    fact appears in the agent's messages). ``info["reward_breakdown"]`` shows each.

    ## Episode End
    The user ends with ``###STOP###`` (``user_stop``), a transfer to a human ends it (``transfer``),
    ten failed turns in a row end it (``too_many_errors``); ``max_episode_steps`` truncates.

    ## Arguments
    ``size`` (``"small"`` default, ``"tau2"`` for τ²-bench's DB size, or a dict), ``db_seed`` (one
    fixed DB for all episodes), ``scenarios`` / ``exclude_scenarios`` (difficulty and coverage knobs),
    ``tau2_data`` (a folder with τ²-bench's retail ``db.json`` and ``tasks.json``: run its official
    tasks), ``task_id``, ``user`` (``"scripted"`` or an OpenAI-compatible endpoint),
    ``prompt`` (``"full"`` or ``"compact"`` policy), ``reward_basis``, ``tau2_compat`` (τ²-bench's own
    reward on its official tasks; on by default with ``tau2_data``, see
    ``trace_envs/domains/tau2_compat.py``). Official tasks are written for an LLM user.

    ## Version History
    * v0: initial version. τ²-compatible mode on official tasks; the scripted user waits on filler
      statements instead of taking them as "handled".
    """

    domain = RetailDomain()
