"""τ²-compatible mode: on τ²-bench's official tasks, our reward is τ²-bench's reward.

``gym.make("trace/tau_airline-v0", tau2_data=PATH)`` (or ``trace/tau_retail-v0``) runs τ²-bench's own
tasks, and there a user expects the score τ²-bench's ``evaluate_simulation`` would give the same
trajectory. ``tau2_compat=True`` — the default whenever ``tau2_data`` is given, off otherwise — makes it
so. Everything that differs from the procedural envs is listed here; the procedural envs
(``tau2_data=None``) keep their stricter, documented behaviour.

What τ²-compatible mode changes
================================

Arguments (:class:`Tau2ToolSet`): before our schema check, each call's arguments are read as
τ²-bench's pydantic models read them.

* Objects inside lists (``flights``, ``passengers``, ``payment_methods``) lose keys the model does not
  have (a passenger with an extra ``"gender"`` key is accepted; τ²-bench ignores the key).
* Where τ²-bench builds a typed record, numbers take the record's type: a booking's payment
  ``amount`` and its bag counts are integers (``50.0`` → ``50``, ``"2"`` → ``2``; ``50.5`` is an
  error, as in τ²-bench), a certificate's ``amount`` is a float (``50`` and ``50.0`` are the same
  certificate).
* ``update_reservation_baggages`` assigns the counts as sent (τ²-bench does not re-validate on
  assignment), so ``2.0`` is stored as ``2.0`` — and, as in τ²-bench, no longer equals a gold ``2``.

Tools (``AirlineTools(db, tau2_compat=True)``, ``RetailTools(db, tau2_compat=True)``): writes that
τ²-bench's tools accept are accepted — a second ``cancel_reservation`` of a cancelled reservation
(refunding the refunds), ``nonfree_baggages`` above ``total_baggages``, an empty or repeated flight
list in ``book_reservation`` / ``update_reservation_flights``, a booking without passengers, a
zero-amount certificate, an empty ``item_ids`` in ``return_delivered_order_items``,
``exchange_delivered_order_items`` and ``modify_pending_order_items`` — and records are created under
τ²-bench's ids (reservations ``HATHAT``/``HATHAU``/``HATHAV``, certificates
``certificate_3221322``…``24``, at most three of each per task, as in τ²-bench).

Evaluation (:func:`trace_envs.domains.evaluation.evaluate_task` with ``tau2_compat=True``):

* ``COMMUNICATE``: a fact counts when it appears in any assistant message with text, including a
  turn that also calls a tool; each message is searched on its own, lower-cased with commas removed,
  and the fact itself is only lower-cased (τ²-bench's ``CommunicateEvaluator``).
* ``DB``: a gold action that fails is skipped (τ²-bench logs a warning) instead of zeroing the reward.
* Episodes do not end on repeated identical calls (τ²-bench has no such rule).

Known τ²-bench bugs, and what we do
===================================

* ``modify_pending_order_items`` prices every changed item with the price and options of the *last*
  new variant in the call (its loop variable leaks). In τ²-compatible mode we reproduce it, so rewards
  equal τ²-bench's published scores (its gold database is built with the same bug: listing the items
  of a multi-item change in another order than the gold action changes the database). With
  ``tau2_compat=False`` each item gets its own variant's price and options.
* ``cancel_reservation`` of a cancelled reservation refunds the refunds (the payment history grows
  ``[p, -p, -p, p]``). Reproduced in compatible mode; an error observation otherwise.

Intentional deviations (kept in both modes)
===========================================

* Domain bounds (:mod:`trace_envs.domains.bounds`): negative, non-finite or absurd bag counts and
  amounts (more than 10 bags per passenger, more than $100,000) are errors; τ²-bench stores them.
  A trajectory with such a call is scored as if the call had not been made.
* A string where our schema wants a number or a list, or a list of mixed objects, is rejected with an
  error observation; τ²-bench may store it as sent (its tools are not validated on entry).
* One tool call per turn (the policy's rule): τ²-bench executes every call of a parallel turn.
* Too many errors: we end after 10 *consecutive* rejected turns, τ²-bench after 10 tool errors in all;
  either way the reward is 0 (``too_many_errors``).
* When one of τ²-bench's tools raises half-way (a certificate listed twice in one booking), it keeps
  the half-done write; ours writes nothing.
* Gift-card balances are rounded to cents after each charge (τ²-bench's airline keeps the float).
  This changes no reward: both the agent's and the gold database go through the same tools.

The agreement is tested, not assumed: ``tests/test_tau2_fidelity.py`` replays gold and perturbed
trajectories of the official tasks through τ²-bench's own evaluator (its wheel, in its own Python
≥ 3.12 venv; :mod:`trace_envs.domains.tau2_reference`) and through ours.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from ..core.tools import ToolResult, ToolSet

_INT_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")
_FLOAT_TEXT = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")


def lax_int(value: Any) -> Any:
    """What a pydantic ``int`` field makes of ``value`` (lax mode); anything else is returned unchanged."""
    if isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, str) and _INT_TEXT.match(value):
        return int(value)
    return value


def lax_float(value: Any) -> Any:
    """What a pydantic ``float`` field makes of ``value`` (lax mode); anything else is returned unchanged."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, str) and _FLOAT_TEXT.match(value):
        return float(value)
    return value


def model_objects(value: Any, fields: tuple[str, ...], types: dict[str, Callable[[Any], Any]] | None = None) -> Any:
    """A list of dicts as τ²-bench's models read it: unknown keys dropped, typed fields coerced.

    τ²-bench converts the list only when every element is a dict; otherwise it is left as sent.
    """
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        return value
    types = types or {}
    return [{k: types.get(k, _same)(v[k]) for k in fields if k in v} for v in value]


def _same(value: Any) -> Any:
    return value


# tool name -> argument name -> how τ²-bench's models read it
_FLIGHT = ("flight_number", "date")
_PASSENGER = ("first_name", "last_name", "dob")
_PAYMENT = ("payment_id", "amount")
TAU2_ARGUMENTS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "book_reservation": {
        "flights": lambda v: model_objects(v, _FLIGHT),
        "passengers": lambda v: model_objects(v, _PASSENGER),
        "payment_methods": lambda v: model_objects(v, _PAYMENT, {"amount": lax_int}),
        "total_baggages": lax_int,
        "nonfree_baggages": lax_int,
    },
    "update_reservation_flights": {"flights": lambda v: model_objects(v, _FLIGHT)},
    "update_reservation_passengers": {"passengers": lambda v: model_objects(v, _PASSENGER)},
    "send_certificate": {"amount": lax_float},
}
# Arguments τ²-bench stores as sent: validated here as the integers they denote, passed on unchanged.
TAU2_RAW_INTEGERS: dict[str, tuple[str, ...]] = {
    "update_reservation_baggages": ("total_baggages", "nonfree_baggages"),
}


def tau2_arguments(name: str, arguments: dict) -> dict:
    """``arguments`` of a call to ``name`` as τ²-bench's tools receive them."""
    rules = TAU2_ARGUMENTS.get(name)
    if not rules:
        return arguments
    return {k: rules[k](v) if k in rules else v for k, v in arguments.items()}


class Tau2ToolSet(ToolSet):
    """A :class:`ToolSet` that reads arguments as τ²-bench's tools do before checking and running them.

    The schemas the agent sees are the same as the plain ToolSet's; only what is accepted differs
    (see the module docstring). The transcript keeps the arguments as the agent sent them.
    """

    def check(self, name: Any, arguments: Any) -> ToolResult | None:
        if isinstance(name, str) and isinstance(arguments, dict) and name in TAU2_RAW_INTEGERS:
            arguments = {k: lax_int(v) if k in TAU2_RAW_INTEGERS[name] else v for k, v in arguments.items()}
        return super().check(name, arguments)

    def call(self, name: Any, arguments: Any) -> ToolResult:
        if isinstance(name, str) and isinstance(arguments, dict):
            arguments = tau2_arguments(name, arguments)
        return super().call(name, arguments)
