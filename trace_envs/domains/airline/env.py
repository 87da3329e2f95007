"""``trace/tau_airline-v0``: τ²-bench-style airline customer service as a Gymnasium environment."""

from __future__ import annotations

from ..base import TauEnv
from . import AirlineDomain


class TauAirlineEnv(TauEnv):
    """Airline customer service: a policy, a database, a scripted customer, and τ²-style rewards.

    Description:
        The agent is an airline's customer-service agent. It reads the policy (system prompt),
        identifies the customer, reads the database with τ²-bench's airline tools (users, reservations,
        flights with per-date status, seats and fares) and serves the customer's requests: cancellations
        (allowed only if booked within 24 hours, the airline cancelled a flight, business class, or
        insured with a covered reason), flight and cabin changes (basic economy flights cannot change),
        checked bags (free allowance by membership and cabin, $50 per extra bag), bookings ($30 insurance
        per passenger), passenger updates, compensation (only when asked and eligible), flight status and
        questions answered from the data. A task holds one request or a bundle of two or three, and the
        right outcome may be a refusal. The database is generated from the seed (or loaded from
        τ²-bench's ``db.json`` with ``tau2_data``); the customer is a deterministic script by default.

    Action Space:
        Text: the assistant's turn. A tool call (Hermes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``,
        a bare JSON call, or an OpenAI assistant message with ``tool_calls``) or a plain message to the
        customer. One tool call per turn.

    Observation Space:
        Text: the policy, tool list and customer's opening message after ``reset``; then the tool result
        (``<tool_response>``) or the customer's reply. ``info["messages"]`` holds the conversation in
        OpenAI format and ``info["tools"]`` the tool schemas.

    Rewards:
        0 until the end; then the product of the task's reward components: ``DB`` (the database after the
        agent's writes equals the database after the gold writes, by canonical hash of every touched
        record) and ``COMMUNICATE`` (every required fact appears in the agent's messages). ``reward_breakdown``
        gives each component.

    Episode End:
        Terminated when the customer ends the conversation (``###STOP###``: user_stop), is transferred
        (``transfer``), gives up on missing information (``out_of_scope``), or after too many invalid
        actions in a row (``too_many_errors``). Truncated by ``max_episode_steps`` (registry: 40).

    Arguments:
        ``size`` ("small" default, "medium", "tau2" = τ²-bench's entity counts, or a dict of overrides). The
        dict may also set the task mix: ``bundle_prob`` (share of tasks with two requests, for multi-step
        work) and ``refusal_prob`` (share of requests the policy forbids, for precondition checks). Five more
        keys exist for the planted-deficit experiment (docs/environments.md, "Options that exist for the
        planted experiment"); they change what the tasks ask, so leave them unset unless you reproduce it:
        ``ask_details_prob`` (requests that name their record only when the agent asks),
        ``cancel_grounds`` (the grounds an allowed cancellation is drawn with; ``["business"]`` makes it rest
        on the cabin alone), ``read_back`` (with that, the oracle states the cabin before deciding),
        ``blind_cabin_prob`` (with that, cancellations whose cabin is drawn against the decision: oracle episodes
        for a decision-blind SFT warm-up, never a reward to train or evaluate on) and
        ``uniform_status_prob`` (flight statuses drawn uniformly instead of mostly ``landed``),
        ``db_seed`` (fixed database, tasks vary with the seed), ``scenarios`` / ``exclude_scenarios``
        (families: cancel, flight_change, cabin_change, baggage, booking, passenger_update, compensation,
        flight_status, info), ``tau2_data`` (folder with
        τ²-bench's airline ``db.json`` and ``tasks.json``) and ``task_id``, ``user`` ("scripted" or an LLM
        endpoint dict), ``prompt`` ("full" or "compact" policy), ``reward_basis``, ``tau2_compat``
        (τ²-bench's own reward on its official tasks; on by default with ``tau2_data``, see
        ``trace_envs/domains/tau2_compat.py``). Official tasks are written for an LLM user.

    Version History:
        v0: initial version. τ²-compatible mode on official tasks; the scripted user waits on filler
        statements instead of taking them as "handled"; bags and amounts bounded by the domain.
    """

    domain = AirlineDomain()
