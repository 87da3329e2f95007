"""Retail tasks: procedurally generated scenarios, and τ²-bench's own tasks converted.

:func:`generate_task` draws a user from the database, plants the records the
scenario needs (an order with the right status, a second card, an order
shipped elsewhere, ...) into the task's initial layer, and builds one to
three requests with their gold handling. Families: ``cancel``,
``modify_items``, ``modify_address``, ``modify_payment``, ``return``,
``exchange``, ``user_address``, ``info``, and ``bundle`` (2–3 requests of the
others). About a third of the requests are refusals: either a rule the tools
enforce (wrong order status, another product type, a refund to a card that
did not pay, ...) or one only the policy enforces (another customer's order
or account, changes to an order whose items were already modified) — the
latter carry a ``forbidden_write`` that the tools would accept.

:func:`load_tau2` converts τ²-bench's retail ``db.json``/``tasks.json``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...core.tools import tool_specs
from ..db import Layer, copy_json
from ..task import Call, CannotBuild, Request, RequestSession, TauTask, UserScenario
from .db import CARD_BRANDS, Draw, new_address
from .tools import CANCEL_REASONS, RetailTools

FAMILIES = ("cancel", "modify_items", "modify_address", "modify_payment", "return", "exchange", "user_address",
            "info")
SCENARIOS = FAMILIES + ("bundle",)
REFUSE_RATE = 0.3
RELATIONS = ("wife", "husband", "sister", "brother", "mother", "father", "roommate", "colleague", "neighbour")
_CONFIRM_WORDS = re.compile(r"confirm|proceed|\(yes/no\)|anything else")


class _Skip(CannotBuild):
    """This variant cannot be built here; the caller tries another."""


# ---------------------------------------------------------------------- wording helpers
def money(x: float) -> str:
    return f"{x:.2f}"


def options_text(options: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items())


def address_text(a: dict) -> str:
    line2 = f", {a['address2']}" if a["address2"] else ""
    return f"{a['address1']}{line2}, {a['city']}, {a['state']} {a['zip']}, {a['country']}"


def method_label(m: dict) -> str:
    if m["source"] == "credit_card":
        return f"the {m['brand']} credit card ending in {m['last_four']}"
    if m["source"] == "gift_card":
        return f"gift card {m['id']}"
    return f"PayPal account {m['id']}"


def method_phrase(m: dict) -> str:
    if m["source"] == "credit_card":
        return f"my {m['brand']} card ending in {m['last_four']}"
    if m["source"] == "gift_card":
        return "my gift card"
    return "my PayPal account"


def _norm(text: str) -> str:
    return text.lower().replace(",", "")


class _Builder:
    """Builds the requests of one task over the task's initial layer."""

    def __init__(self, rng: np.random.Generator, db: Layer):
        self.d = Draw(rng, chunk=256)
        self.db = db
        self.used: set[str] = set()  # orders and users that a request of this task already relies on
        self.id_reference_prob = 0.45  # chance a request names its order by id rather than by an item in it

    # ------------------------------------------------------------------ records
    def orders_of(self, user: dict, status: str | None = None) -> list[dict]:
        out = []
        for oid in user["orders"]:
            order = self.db.get("orders", oid)
            if order is not None and oid not in self.used and (status is None or order["status"] == status):
                out.append(order)
        return out

    def user(self, uid: str) -> dict:
        return self.db.get("users", uid)  # type: ignore[return-value]

    def new_order_id(self) -> str:
        while True:
            oid = "#W" + self.d.digits(7)
            if self.db.get("orders", oid) is None:
                return oid

    def plant_order(self, user: dict, status: str, min_items: int = 1) -> dict:
        """A new order of ``user`` with ``status`` (inserted into the task's initial layer)."""
        d = self.d
        products = [self.db.get("products", pid) for pid in self.db.keys("products")]
        items = []
        for _ in range(max(min_items, d.between(1, 3))):
            product = d.choice(products)
            variant = d.choice(list(product["variants"].values()))
            items.append({"name": product["name"], "product_id": product["product_id"],
                          "item_id": variant["item_id"], "price": variant["price"],
                          "options": dict(variant["options"])})
        pm_id = d.choice(list(user["payment_methods"]))
        total = round(sum(i["price"] for i in items), 2)
        history = [{"transaction_type": "payment", "amount": total, "payment_method_id": pm_id}]
        if status == "pending (item modified)":
            history.append({"transaction_type": "refund", "amount": round(d.between(100, 2000) / 100, 2),
                            "payment_method_id": pm_id})
        fulfillments = [] if "pending" in status else [
            {"tracking_id": [d.digits(12)], "item_ids": [i["item_id"] for i in items]}]
        oid = self.new_order_id()
        order = {"order_id": oid, "user_id": user["user_id"], "address": dict(user["address"]), "items": items,
                 "status": status, "fulfillments": fulfillments, "payment_history": history}
        self.db.insert("orders", oid, order)
        self.db.edit("users", user["user_id"])["orders"].append(oid)
        return order

    def order(self, user: dict, status: str, min_items: int = 1, plant: float = 0.0) -> dict:
        """An unused order of ``user`` with ``status``, planting one if there is none (or with probability ``plant``)."""
        found = [o for o in self.orders_of(self.user(user["user_id"]), status) if len(o["items"]) >= min_items]
        order = self.d.choice(found) if found and not self.d.bernoulli(plant) else \
            self.plant_order(self.user(user["user_id"]), status, min_items)
        self.used.add(order["order_id"])
        return order

    def other_user(self, user: dict) -> dict:
        ids = [u for u in self.db.keys("users") if u != user["user_id"] and u not in self.used]
        if not ids:
            raise _Skip("no other user")
        other = self.user(self.d.choice(ids))
        self.used.add(other["user_id"])
        return other

    def add_method(self, user: dict, source: str, balance: float | None = None) -> dict:
        d = self.d
        while True:
            pm_id = f"{source}_{d.digits(7)}"
            if pm_id not in user["payment_methods"]:
                break
        if source == "credit_card":
            brands = [b for b in CARD_BRANDS if all(m.get("brand") != b for m in user["payment_methods"].values())]
            method = {"source": source, "id": pm_id, "brand": d.choice(brands or CARD_BRANDS),
                      "last_four": f"{d.below(10000):04d}"}
        elif source == "gift_card":
            method = {"source": source, "id": pm_id, "balance": float(balance if balance is not None else 100)}
        else:
            method = {"source": source, "id": pm_id}
        self.db.edit("users", user["user_id"])["payment_methods"][pm_id] = method
        return method

    def reference(self, user: dict, order: dict, status_peers: bool = True) -> tuple[str, dict | None, list[Call]]:
        """How the user names ``order``: its id, or "the order with the <product>" (then also the
        plausible wrong order with the same status, and the reads needed to tell them apart)."""
        user = self.user(user["user_id"])
        others = [self.db.get("orders", oid) for oid in user["orders"] if oid != order["order_id"]]
        names_elsewhere = {i["name"] for o in others for i in o["items"]}
        unique = [i["name"] for i in order["items"] if i["name"] not in names_elsewhere]
        read = Call("get_order_details", {"order_id": order["order_id"]})
        if not unique or self.d.bernoulli(self.id_reference_prob):
            return f"{order['order_id']}", None, [read]
        peers = [o for o in others if o["status"] == order["status"] and o["order_id"] not in self.used]
        wrong = self.d.choice(peers) if peers else None
        if wrong is not None:
            self.used.add(wrong["order_id"])
        reads = [Call("get_order_details", {"order_id": o["order_id"]})
                 for o in others[:3] if o is not wrong] + ([Call("get_order_details", {"order_id": wrong["order_id"]})]
                                                           if wrong else []) + [read]
        return f"with the {self.d.choice(unique)}", wrong, reads

    # ------------------------------------------------------------------ variants
    def swap_target(self, item: dict, want_unavailable: bool = False) -> tuple[dict, dict, dict | None]:
        """(target variant, described options, near-miss variant or None) for changing ``item``."""
        product = self.db.get("products", item["product_id"])
        variants = [v for v in product["variants"].values() if v["item_id"] != item["item_id"]]
        pool = [v for v in variants if v["available"] != want_unavailable]
        if not pool:
            raise _Skip("no variant")
        target = self.d.choice(pool)
        described = {k: v for k, v in target["options"].items() if item["options"].get(k) != v}
        if not described:
            raise _Skip("identical options")
        matching = [v for v in variants if all(v["options"].get(k) == val for k, val in described.items())]
        if len(matching) > 1:
            described = dict(target["options"])
        near = [v for v in variants if v["available"] and v is not target
                and sum(v["options"].get(k) != val for k, val in described.items()) == 1]
        return target, described, (self.d.choice(near) if near else None)


def _pay_choice(b: _Builder, user: dict, order: dict, diff: float) -> dict:
    """A payment method for a price difference: the order's original one or a gift card that covers it."""
    user = b.user(user["user_id"])
    original = user["payment_methods"][order["payment_history"][0]["payment_method_id"]]
    cards = [m for m in user["payment_methods"].values() if m["source"] == "gift_card" and m["balance"] >= diff]
    if cards and b.d.bernoulli(0.35):
        return b.d.choice(cards)
    if original["source"] == "gift_card" and original["balance"] < diff:
        return b.add_method(user, "gift_card", float(int(diff) + 50))
    return original


# ---------------------------------------------------------------------- families
def _policy_other_order(b: _Builder, user: dict, status: str, verb: str) -> tuple[str, dict, dict]:
    other = b.other_user(user)
    order = b.order(other, status)
    relation = b.d.choice(RELATIONS)
    text = f"my {relation}'s order {order['order_id']}"
    message = (f"Order {order['order_id']} is not on your account, so I can't {verb} it. "
               f"The account holder needs to contact us themselves.")
    return text, order, {"message": message, "other": other}


def build_cancel(b: _Builder, user: dict, refuse: bool) -> Request:
    d = b.d
    reason = d.choice(CANCEL_REASONS)
    why = {"no longer needed": d.choice(("it's no longer needed", "I no longer needed it", "it is no longer needed")),
           "ordered by mistake": d.choice(("I ordered it by mistake", "it was ordered by mistake"))}[reason]
    if refuse:
        if d.bernoulli(0.5):
            ref, order, extra = _policy_other_order(b, user, "pending", "cancel")
            write = Call("cancel_pending_order", {"order_id": order["order_id"], "reason": reason})
            return Request("cancel", f"Could you cancel {ref}? They asked me to, because {why}.", "refuse",
                           reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                           message=extra["message"], forbidden_write=write,
                           details=f"It's order {order['order_id']}; {why}.")
        status = d.choice(("processed", "delivered", "pending (item modified)"))
        order = b.order(user, status, plant=0.3)
        return Request("cancel", f"I want to cancel my order {order['order_id']} because {why}.", "refuse",
                       reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                       message=f"Order {order['order_id']} has status '{order['status']}', and only pending orders "
                               f"can be cancelled, so I can't cancel it.",
                       details=f"It's order {order['order_id']}.")
    order = b.order(user, "pending")
    ref, wrong, reads = b.reference(user, order)
    payment = order["payment_history"][0]
    method = b.user(user["user_id"])["payment_methods"][payment["payment_method_id"]]
    names = ", ".join(i["name"] for i in order["items"])
    text = d.choice((f"I'd like to cancel my order {ref}; {why}.", f"Please cancel the order {ref}. {why.capitalize()}.",
                     f"I need to cancel my pending order {ref} because {why}."))
    return Request("cancel", text, "act", reads=reads,
                   message=f"I can cancel order {order['order_id']} ({names}) with the reason '{reason}'. "
                           f"The ${money(payment['amount'])} you paid will be refunded to {method_label(method)}.",
                   write=Call("cancel_pending_order", {"order_id": order["order_id"], "reason": reason}),
                   done_message=f"Order {order['order_id']} is now cancelled.",
                   wrong_write=Call("cancel_pending_order", {"order_id": wrong["order_id"], "reason": reason})
                   if wrong else None,
                   details=f"The order {ref}; {why}.")


def build_modify_address(b: _Builder, user: dict, refuse: bool) -> Request:
    d = b.d
    address = new_address(d)
    spoken = address_text(address)
    if refuse:
        kind = d.choice(("status", "item_modified", "other"))
        if kind == "other":
            ref, order, extra = _policy_other_order(b, user, "pending", "change")
            return Request("modify_address", f"Please change the shipping address of {ref} to {spoken}.", "refuse",
                           reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                           message=extra["message"],
                           forbidden_write=Call("modify_pending_order_address",
                                                {"order_id": order["order_id"], **address}),
                           details=f"Order {order['order_id']}, new address {spoken}.")
        status = "pending (item modified)" if kind == "item_modified" else d.choice(("processed", "delivered"))
        order = b.order(user, status, plant=0.3)
        reason = ("its items were already modified, and after an item modification an order can't be changed "
                  "any further" if kind == "item_modified" else "only pending orders can be modified")
        return Request("modify_address", f"Can you change the shipping address of my order {order['order_id']} to "
                                         f"{spoken}?", "refuse",
                       reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                       message=f"Order {order['order_id']} has status '{order['status']}': {reason}, so I can't "
                               f"change its address.",
                       forbidden_write=Call("modify_pending_order_address", {"order_id": order["order_id"], **address})
                       if kind == "item_modified" else None,
                       details=f"Order {order['order_id']}, new address {spoken}.")
    order = b.order(user, "pending")
    ref, wrong, reads = b.reference(user, order)
    text = d.choice((f"Please ship my order {ref} to {spoken} instead.",
                     f"I need to change the shipping address of my order {ref} to {spoken}."))
    return Request("modify_address", text, "act", reads=reads,
                   message=f"I will change the shipping address of order {order['order_id']} to {spoken}.",
                   write=Call("modify_pending_order_address", {"order_id": order["order_id"], **address}),
                   done_message=f"The shipping address of order {order['order_id']} is updated.",
                   wrong_write=Call("modify_pending_order_address", {"order_id": wrong["order_id"], **address})
                   if wrong else None,
                   details=f"The order {ref}; the new address is {spoken}.")


def build_modify_payment(b: _Builder, user: dict, refuse: bool) -> Request:
    d = b.d
    if refuse and d.bernoulli(0.5):
        other = b.other_user(user)
        order = b.order(other, "pending")
        current = order["payment_history"][0]["payment_method_id"]
        choices = [m for m in other["payment_methods"].values() if m["id"] != current and m["source"] != "gift_card"]
        target = d.choice(choices) if choices else b.add_method(b.user(other["user_id"]), "paypal")
        relation = d.choice(RELATIONS)
        return Request("modify_payment", f"My {relation} asked me to switch the payment of their order "
                                         f"{order['order_id']} to their {target['source'].replace('_', ' ')}.",
                       "refuse", reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                       message=f"Order {order['order_id']} is not on your account, so I can't change its payment. "
                               f"The account holder needs to contact us themselves.",
                       forbidden_write=Call("modify_pending_order_payment",
                                            {"order_id": order["order_id"], "payment_method_id": target["id"]}),
                       details=f"Order {order['order_id']}.")
    order = b.order(user, "pending")
    amount = order["payment_history"][0]["amount"]
    current = order["payment_history"][0]["payment_method_id"]
    me = b.user(user["user_id"])
    if refuse:
        cards = [m for m in me["payment_methods"].values() if m["source"] == "gift_card" and m["balance"] < amount]
        card = d.choice(cards) if cards else b.add_method(me, "gift_card", float(max(0, int(amount) - d.between(5, 60))))
        if card["id"] == current:
            raise _Skip("gift card already pays")
        balance = money(card["balance"])
        return Request("modify_payment", f"Can I pay for my order {order['order_id']} with my gift card instead?",
                       "refuse", reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                       message=f"Your gift card {card['id']} has a balance of ${balance}, which does not cover the "
                               f"order total of ${money(amount)}, so I can't move the payment to it.",
                       communicate=[balance], details=f"Order {order['order_id']}, my gift card {card['id']}.")
    ref, wrong_order, reads = b.reference(user, order)
    candidates = [m for m in me["payment_methods"].values() if m["id"] != current
                  and (m["source"] != "gift_card" or m["balance"] >= amount)]
    kind = d.choice(("credit_card", "paypal", "gift_card"))
    target = next((m for m in candidates if m["source"] == kind), None) or (
        b.add_method(me, kind, float(int(amount) + d.between(1, 100))))
    wrong = None
    if target["source"] == "credit_card":
        others = [m for m in b.user(user["user_id"])["payment_methods"].values()
                  if m["source"] == "credit_card" and m["id"] not in (target["id"], current)]
        if not others and d.bernoulli(0.6):
            others = [b.add_method(b.user(user["user_id"]), "credit_card")]
        if others:
            wrong = Call("modify_pending_order_payment", {"order_id": order["order_id"],
                                                          "payment_method_id": others[0]["id"]})
    if wrong is None and wrong_order is not None:
        wrong = Call("modify_pending_order_payment", {"order_id": wrong_order["order_id"],
                                                      "payment_method_id": target["id"]})
        if wrong_order["payment_history"][0]["payment_method_id"] == target["id"] or \
                len(wrong_order["payment_history"]) != 1:
            wrong = None
    old = b.user(user["user_id"])["payment_methods"][current]
    return Request("modify_payment", f"I'd like to pay for my order {ref} with {method_phrase(target)} instead.", "act",
                   reads=reads,
                   message=f"I will switch the payment of order {order['order_id']} (${money(amount)}) from "
                           f"{method_label(old)} to {method_label(target)}; the original payment will be refunded.",
                   write=Call("modify_pending_order_payment", {"order_id": order["order_id"],
                                                               "payment_method_id": target["id"]}),
                   done_message=f"Order {order['order_id']} is now paid with {method_label(target)}.",
                   wrong_write=wrong, details=f"The order {ref}, paid with {method_phrase(target)}.")


def _swap_request(b: _Builder, user: dict, refuse: bool, family: str) -> Request:
    """modify_items (pending orders) and exchange (delivered orders) share their structure."""
    d = b.d
    exchange = family == "exchange"
    status = "delivered" if exchange else "pending"
    tool_name = "exchange_delivered_order_items" if exchange else "modify_pending_order_items"
    verb = "exchange" if exchange else "change"
    if refuse:
        kind = d.choice(("status", "repeat", "other", "unavailable") + (("product_type",) if exchange else ()))
        if kind == "other":
            ref, order, extra = _policy_other_order(b, user, status, verb)
            item = order["items"][0]
            target, described, _ = b.swap_target(item)
            write = Call(tool_name, {"order_id": order["order_id"], "item_ids": [item["item_id"]],
                                     "new_item_ids": [target["item_id"]],
                                     "payment_method_id": order["payment_history"][0]["payment_method_id"]})
            return Request(family, f"Could you {verb} the {item['name']} in {ref} to the {options_text(described)} "
                                   f"one? Use the original payment method.", "refuse",
                           reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                           message=extra["message"], forbidden_write=write, details=f"Order {order['order_id']}.")
        if kind in ("status", "repeat"):
            bad = (("exchange requested", "return requested") if exchange else ("pending (item modified)",)) \
                if kind == "repeat" else (("pending", "processed") if exchange else ("processed", "delivered"))
            order = b.order(user, d.choice(bad), plant=0.3)
            item = order["items"][0]
            rule = ("an order can only be exchanged once, and only while it is delivered" if exchange and kind == "repeat"
                    else "items can only be modified once per order" if kind == "repeat"
                    else f"only {status} orders can have items {'exchanged' if exchange else 'modified'}")
            return Request(family, f"I want to {verb} the {item['name']} in my order {order['order_id']} for a "
                                   f"different option.", "refuse",
                           reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                           message=f"Order {order['order_id']} has status '{order['status']}', and {rule}, so I "
                                   f"can't {verb} its items.", details=f"Order {order['order_id']}.")
        order = b.order(user, status)
        item = order["items"][0]
        if kind == "product_type":
            names = sorted({p["name"] for p in b.db.values("products")} - {item["name"]})
            other_name = d.choice(names)
            return Request(family, f"I'd like to exchange the {item['name']} from my order {order['order_id']} for a "
                                   f"{other_name}.", "refuse",
                           reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                           message=f"Exchanges have to stay within the same product, so the {item['name']} can't "
                                   f"be exchanged for a {other_name}.", details=f"Order {order['order_id']}.")
        target, described, _ = b.swap_target(item, want_unavailable=True)
        return Request(family, f"Please {verb} the {item['name']} in my order {order['order_id']} to the "
                               f"{options_text(described)} one.", "refuse",
                       reads=[Call("get_order_details", {"order_id": order["order_id"]}),
                              Call("get_product_details", {"product_id": item["product_id"]})],
                       message=f"The {item['name']} with {options_text(target['options'])} (item {target['item_id']}) "
                               f"is not available right now, so I can't make that {verb}.",
                       details=f"Order {order['order_id']}, the {options_text(described)} {item['name']}.")
    order = b.order(user, status)
    ref, wrong_order, reads = b.reference(user, order)
    item = d.choice(order["items"])
    target, described, near = b.swap_target(item)
    diff = round(target["price"] - item["price"], 2)
    method = _pay_choice(b, user, order, diff)
    args = {"order_id": order["order_id"], "item_ids": [item["item_id"]], "new_item_ids": [target["item_id"]],
            "payment_method_id": method["id"]}
    wrong = None
    if near is not None and (method["source"] != "gift_card" or method["balance"] >= near["price"] - item["price"]):
        wrong = Call(tool_name, {**args, "new_item_ids": [near["item_id"]]})
    direction = "charged to" if diff > 0 else "refunded to"
    communicate = [money(abs(diff))] if d.bernoulli(0.5) else []
    extra = (" After this, the items of this order can't be modified again." if not exchange else
             " You'll receive an email on how to return the old item.")
    pay = "pay or refund the difference with" if d.bernoulli(0.5) else "settle any price difference with"
    text = d.choice((f"I'd like to {verb} the {item['name']} in my order {ref} to the {options_text(described)} one; "
                     f"{pay} {method_phrase(method)}.",
                     f"For my order {ref}, can you {verb} the {item['name']} for the {options_text(described)} "
                     f"version? Please {pay} {method_phrase(method)}."))
    return Request(family, text, "act", reads=reads + [Call("get_product_details", {"product_id": item["product_id"]})],
                   message=f"I will {verb} the {item['name']} in order {order['order_id']} (item {item['item_id']}, "
                           f"{options_text(item['options'])}, ${money(item['price'])}) for item {target['item_id']} "
                           f"({options_text(target['options'])}, ${money(target['price'])}). The price difference of "
                           f"${money(abs(diff))} will be {direction} {method_label(method)}.{extra}",
                   write=Call(tool_name, args), communicate=communicate,
                   done_message=f"The {'exchange is requested' if exchange else 'item is changed'} for order "
                                f"{order['order_id']}.",
                   wrong_write=wrong, details=f"The {item['name']} in order {ref}: I want the "
                                              f"{options_text(described)} one.")


def build_modify_items(b: _Builder, user: dict, refuse: bool) -> Request:
    return _swap_request(b, user, refuse, "modify_items")


def build_exchange(b: _Builder, user: dict, refuse: bool) -> Request:
    return _swap_request(b, user, refuse, "exchange")


def build_return(b: _Builder, user: dict, refuse: bool) -> Request:
    d = b.d
    if refuse:
        kind = d.choice(("status", "method", "other"))
        if kind == "other":
            ref, order, extra = _policy_other_order(b, user, "delivered", "return")
            item = order["items"][0]
            return Request("return", f"I'd like to return the {item['name']} from {ref}, refunded to the original "
                                     f"payment method.", "refuse",
                           reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                           message=extra["message"],
                           forbidden_write=Call("return_delivered_order_items", {
                               "order_id": order["order_id"], "item_ids": [item["item_id"]],
                               "payment_method_id": order["payment_history"][0]["payment_method_id"]}),
                           details=f"Order {order['order_id']}.")
        if kind == "status":
            order = b.order(user, d.choice(("pending", "processed", "exchange requested")), plant=0.3)
            item = order["items"][0]
            return Request("return", f"I want to return the {item['name']} from my order {order['order_id']}.",
                           "refuse", reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                           message=f"Order {order['order_id']} has status '{order['status']}', and only delivered "
                                   f"orders can be returned, so I can't start a return for it.",
                           details=f"Order {order['order_id']}.")
        order = b.order(user, "delivered")
        me = b.user(user["user_id"])
        original = order["payment_history"][0]["payment_method_id"]
        others = [m for m in me["payment_methods"].values() if m["source"] != "gift_card" and m["id"] != original]
        method = d.choice(others) if others else b.add_method(me, d.choice(("credit_card", "paypal")))
        item = order["items"][0]
        return Request("return", f"I want to return the {item['name']} from my order {order['order_id']} and get the "
                                 f"refund on {method_phrase(method)}.", "refuse",
                       reads=[Call("get_order_details", {"order_id": order["order_id"]})],
                       message=f"Refunds can only go to the order's original payment method "
                               f"({method_label(me['payment_methods'][original])}) or to a gift card, so I can't send "
                               f"it to {method_label(method)}.", details=f"Order {order['order_id']}.")
    except_mode = d.bernoulli(0.35)
    order = b.order(user, "delivered", min_items=2 if except_mode else 1)
    ref, wrong_order, reads = b.reference(user, order)
    names = [i["name"] for i in order["items"]]
    wrong = None
    if except_mode and len(set(names)) >= 2:
        keep = d.choice(sorted(set(names)))
        items = [i for i in order["items"] if i["name"] != keep]
        ask = f"everything except the {keep}"
    else:
        distinct = [n for n in names if names.count(n) == 1]
        chosen = d.sample(distinct, d.between(1, min(2, len(distinct)))) if distinct else [names[0]]
        items = [i for i in order["items"] if i["name"] in chosen]
        ask = " and the ".join(chosen)
        ask = "the " + ask
    me = b.user(user["user_id"])
    original = me["payment_methods"][order["payment_history"][0]["payment_method_id"]]
    cards = [m for m in me["payment_methods"].values() if m["source"] == "gift_card"]
    method = d.choice(cards) if cards and d.bernoulli(0.4) else original
    ids = [i["item_id"] for i in items]
    if except_mode and len(ids) < len(order["items"]):
        wrong = Call("return_delivered_order_items", {"order_id": order["order_id"],
                                                       "item_ids": [i["item_id"] for i in order["items"]],
                                                       "payment_method_id": method["id"]})
    elif wrong_order is not None:
        wrong = Call("return_delivered_order_items", {"order_id": wrong_order["order_id"],
                                                       "item_ids": [wrong_order["items"][0]["item_id"]],
                                                       "payment_method_id": wrong_order["payment_history"][0][
                                                           "payment_method_id"]})
        if method["source"] == "gift_card":
            wrong.arguments["payment_method_id"] = method["id"]
    refund = round(sum(i["price"] for i in items), 2)
    listed = ", ".join(f"{i['name']} (item {i['item_id']})" for i in items)
    where = "the original payment method" if method is original else method_phrase(method)
    return Request("return", f"I'd like to return {ask} from my order {ref}, with the refund going to {where}.", "act",
                   reads=reads,
                   message=f"I will request a return of {listed} from order {order['order_id']}. The refund of "
                           f"${money(refund)} will go to {method_label(method)}.",
                   write=Call("return_delivered_order_items", {"order_id": order["order_id"], "item_ids": ids,
                                                               "payment_method_id": method["id"]}),
                   communicate=[money(refund)] if d.bernoulli(0.5) else [],
                   done_message="The return is requested; you'll receive an email explaining how to send the items back.",
                   wrong_write=wrong, details=f"The order {ref}: return {ask}.")


def build_user_address(b: _Builder, user: dict, refuse: bool) -> Request:
    d = b.d
    if refuse:
        other = b.other_user(user)
        address = new_address(d, other["address"])
        relation = d.choice(RELATIONS)
        return Request("user_address", f"Could you also update my {relation}'s default address to "
                                       f"{address_text(address)}? Their user id is {other['user_id']}.", "refuse",
                       message=f"The account {other['user_id']} is not yours, and I can only make changes to your "
                               f"own account, so I can't update that address; they need to contact us themselves.",
                       forbidden_write=Call("modify_user_address", {"user_id": other["user_id"], **address}),
                       details=f"The user id is {other['user_id']}.")
    me = b.user(user["user_id"])
    if d.bernoulli(0.4):  # "the address my order ... is shipped to"
        order = b.order(me, d.choice(("pending", "processed", "delivered")))
        address = new_address(d, me["address"])
        b.db.edit("orders", order["order_id"])["address"] = address
        peer = b.order(b.user(user["user_id"]), d.choice(("pending", "processed", "delivered")))
        wrong_address = new_address(d, address)
        if wrong_address == me["address"]:
            raise _Skip("same address")
        b.db.edit("orders", peer["order_id"])["address"] = wrong_address
        return Request("user_address", f"Please make the address my order {order['order_id']} was shipped to my "
                                       f"default address.", "act",
                       reads=[Call("get_order_details", {"order_id": peer["order_id"]}),
                              Call("get_order_details", {"order_id": order["order_id"]})],
                       message=f"I will set the default address on your account to {address_text(address)}, the "
                               f"shipping address of order {order['order_id']}.",
                       write=Call("modify_user_address", {"user_id": me["user_id"], **address}),
                       done_message="Your default address is updated.",
                       wrong_write=Call("modify_user_address", {"user_id": me["user_id"], **wrong_address}),
                       details=f"The address of order {order['order_id']}.")
    address = new_address(d, me["address"])
    spoken = address_text(address)
    return Request("user_address", d.choice((f"I moved. Please update my default address to {spoken}.",
                                             f"Can you change the address on my account to {spoken}?")), "act",
                   message=f"I will update the default address on your account to {spoken}.",
                   write=Call("modify_user_address", {"user_id": me["user_id"], **address}),
                   done_message="Your default address is updated.", details=f"The new address is {spoken}.")


def build_info(b: _Builder, user: dict, refuse: bool) -> Request:
    d = b.d
    kind = d.choice(("status", "tracking", "total", "price", "count", "balance"))
    me = b.user(user["user_id"])
    if kind == "balance":
        cards = [m for m in me["payment_methods"].values() if m["source"] == "gift_card"]
        card = cards[0] if cards else b.add_method(me, "gift_card", float(d.between(5, 300)))
        balance = money(card["balance"])
        return Request("info", "What is the balance on my gift card?", "answer",
                       message=f"Your gift card {card['id']} has a balance of ${balance}.", communicate=[balance],
                       details="My gift card balance.")
    if kind in ("price", "count"):
        products = [p for p in b.db.values("products") if len(p["variants"]) >= 2]
        product = d.choice(products)
        reads = [Call("list_all_product_types"), Call("get_product_details", {"product_id": product["product_id"]})]
        variants = list(product["variants"].values())
        if kind == "count":
            n = sum(v["available"] for v in variants)
            fact = f"{n} available"
            return Request("info", f"How many {product['name']} options are available right now?", "answer",
                           reads=reads,
                           message=f"The {product['name']} has {n} available options right now, out of "
                                   f"{len(variants)} in the catalogue.", communicate=[fact],
                           wrong_message=(f"The {product['name']} has {len(variants)} available options right now."
                                          if len(variants) != n else None),
                           details=f"The {product['name']}.")
        target = d.choice(variants)
        near = [v for v in variants if v is not target
                and sum(v["options"][k] != target["options"][k] for k in target["options"]) == 1
                and v["price"] != target["price"]]
        wrong = d.choice(near) if near else None
        price = money(target["price"])
        state = "available" if target["available"] else "currently unavailable"
        return Request("info", f"How much does the {product['name']} with {options_text(target['options'])} cost?",
                       "answer", reads=reads,
                       message=f"The {product['name']} with {options_text(target['options'])} (item "
                               f"{target['item_id']}) costs ${price} and is {state}.",
                       communicate=[price],
                       wrong_message=(f"That {product['name']} costs ${money(wrong['price'])}." if wrong else None),
                       details=f"The {product['name']} with {options_text(target['options'])}.")
    status = None
    if kind == "tracking":
        status = d.choice(("processed", "delivered"))
    order = b.order(me, status or d.choice(("pending", "processed", "delivered", "cancelled")))
    ref, wrong_order, reads = b.reference(user, order)
    if kind == "status":
        return Request("info", f"What is the status of my order {ref}?", "answer", reads=reads,
                       message=f"Order {order['order_id']} has status '{order['status']}'.",
                       communicate=[order["status"]],
                       wrong_message=(f"That order has status '{wrong_order['status']}'." if wrong_order else None),
                       details=f"The order {ref}.")
    if kind == "tracking":
        tracking = order["fulfillments"][0]["tracking_id"][0]
        wrong_tracking = wrong_order["fulfillments"][0]["tracking_id"][0] if wrong_order else None
        return Request("info", f"What is the tracking number of my order {ref}?", "answer", reads=reads,
                       message=f"The tracking number of order {order['order_id']} is {tracking}.",
                       communicate=[tracking],
                       wrong_message=(f"The tracking number is {wrong_tracking}." if wrong_tracking else None),
                       details=f"The order {ref}.")
    paid = money(order["payment_history"][0]["amount"])
    wrong_paid = money(wrong_order["payment_history"][0]["amount"]) if wrong_order else None
    return Request("info", f"How much did I pay for my order {ref}?", "answer", reads=reads,
                   message=f"You paid ${paid} for order {order['order_id']}.", communicate=[paid],
                   wrong_message=(f"You paid ${wrong_paid} for that order." if wrong_paid else None),
                   details=f"The order {ref}.")


BUILDERS = {"cancel": build_cancel, "modify_items": build_modify_items, "modify_address": build_modify_address,
            "modify_payment": build_modify_payment, "return": build_return, "exchange": build_exchange,
            "user_address": build_user_address, "info": build_info}


# ---------------------------------------------------------------------- the task
_REFUSAL_FACTS = (re.compile(r"has status '([^']+)'"), re.compile(r"^Order (#W\d+) is not on your account"),
                  re.compile(r"^The account (\S+) is not yours"), re.compile(r"(not available)"),
                  re.compile(r"(same product)"), re.compile(r"(original payment method)"))


def _refusal_fact(message: str) -> str | None:
    """The key fact of a refusal (the blocking status, the foreign order or account, the broken rule)."""
    for pattern in _REFUSAL_FACTS:
        if m := pattern.search(message):
            return m.group(1)
    return None


def _validate(task: TauTask) -> None:
    """Keep the ``needs`` contract exact: drop facts or wrong messages that other turns would already say."""
    for r in task.requests:  # a refusal must be said, or doing nothing would score like handling it
        if r.decision == "refuse" and not r.communicate:
            fact = _refusal_fact(r.message)
            if fact is None:
                raise RuntimeError(f"refusal without a key fact: {r.message!r}")
            r.communicate = [fact]
    closing = "Thank you for reaching out. Is there anything else I can help you with?"
    first = task.requests[0]
    stop_said = _norm(" ".join([task.auth_message, first.message, first.done_message, closing]))
    for r in task.requests[1:]:
        r.communicate = [f for f in r.communicate if _norm(f) not in stop_said]
    for i, r in enumerate(task.requests):
        if r.wrong_message is None:
            continue
        said = _norm(" ".join([task.auth_message, r.wrong_message] + [
            f"{o.message} {o.done_message}" for j, o in enumerate(task.requests) if j != i]))
        if not r.communicate or all(_norm(f) in said for f in r.communicate):
            r.wrong_message = None
    for r in task.requests:
        text = _norm(f"{r.message} {r.done_message}")
        if not all(_norm(f) in text for f in r.communicate):
            raise RuntimeError(f"{r.kind}: facts {r.communicate} are not all in the agent's messages")
        if r.decision != "act" and _CONFIRM_WORDS.search(r.message.lower()):
            raise RuntimeError(f"{r.kind}: a refusal or answer must not read as a confirmation request: {r.message!r}")


def _authentication(d: Any, db: Layer, user: dict) -> tuple[dict[str, str], list[Call], str]:
    """How the user is identified: by name + zip (when that finds exactly this user, 40% of the time) or by
    email. Returns the facts the user knows, the agent's identifying calls and its question."""
    first, last = user["name"]["first_name"], user["name"]["last_name"]
    zip_code = user["address"]["zip"]
    by_name = next((u["user_id"] for u in db.values("users")
                    if u["name"]["first_name"].lower() == first.lower() and u["name"]["last_name"].lower() == last.lower()
                    and u["address"]["zip"] == zip_code), None)
    if d.bernoulli(0.4) and by_name == user["user_id"]:
        known = {"name": f"{first} {last}", "zip": zip_code}
        auth = [Call("find_user_id_by_name_zip", {"first_name": first, "last_name": last, "zip": zip_code})]
        auth_message = "I can help with that. First, could you please tell me your first and last name and your zip code?"
    else:
        known = {"email": user["email"]}
        auth = [Call("find_user_id_by_email", {"email": user["email"]})]
        auth_message = "I can help with that. First, could you please provide the email address on your account?"
    auth.append(Call("get_user_details", {"user_id": user["user_id"]}))
    return known, auth, auth_message


def _chain_requests(d: Any, requests: list[Request]) -> None:
    """Phrase the second and later requests as follow-ups ("Also, ...")."""
    for r in requests[1:]:
        r.text = d.choice(("Also, ", "One more thing: ", "And ", "Next, ")) + r.text[0].lower() + r.text[1:]


def generate_task(rng: np.random.Generator, db: Layer, scenarios: list[str], size: dict) -> TauTask:
    """A retail task drawn from ``rng`` over the initial layer ``db`` (which it may plant records in).

    Args:
        rng: the episode's generator.
        db: the task's initial-state layer.
        scenarios: the families to draw from (``bundle`` combines 2–3 of the others).
        size: the DB size preset (unused beyond the DB itself).
    """
    b = _Builder(rng, db)
    d = b.d
    scenario = d.choice(scenarios)
    singles = [s for s in scenarios if s != "bundle"] or list(FAMILIES)
    families = [d.choice(singles) for _ in range(d.between(2, 3))] if scenario == "bundle" else [scenario]
    users = db.keys("users")
    user = db.get("users", d.choice(users))
    b.used.add(user["user_id"])
    requests: list[Request] = []
    for family in families:
        for attempt in range(6):
            refuse = d.bernoulli(REFUSE_RATE) and (family != "info")
            try:
                requests.append(BUILDERS[family](b, user, refuse))
                break
            except _Skip:
                continue
        else:
            raise RuntimeError(f"could not build a {family} request")  # pragma: no cover
    user = db.get("users", user["user_id"])
    first, last = user["name"]["first_name"], user["name"]["last_name"]
    known, auth, auth_message = _authentication(d, db, user)
    _chain_requests(d, requests)
    greeting = d.choice(("Hi.", "Hello!", "Hi there.", "Good afternoon."))
    opening = f"{greeting} {requests[0].text}"
    name = "bundle:" + "+".join(families) if scenario == "bundle" else scenario
    task = TauTask(task_id=f"retail-{name}-{d.digits(8)}", domain="retail", scenario=name,
                   user=UserScenario(persona=f"{first} {last}, a customer of the online store", known_info=known,
                                     opening=opening,
                                     instructions=" ".join(r.text for r in requests)),
                   requests=requests, auth=auth, auth_message=auth_message)
    _validate(task)
    return task


class RetailRequestSession(RequestSession):
    """Retail requests one at a time for one user (see :class:`~trace_envs.domains.task.RequestSession`).

    Args:
        rng: the episode's generator.
        db: the task's initial layer (requests plant their records in it).
        user_id: the user (default: drawn).
        id_reference_prob: chance that a request names its order by id; otherwise (when an item
            identifies it) by "the order with the <item>", with a same-status order as the plausible
            wrong one (the structured-data-reasoning variant). 1.0 = always by id.
    """

    domain = "retail"
    families = FAMILIES

    def __init__(self, rng: np.random.Generator, db: Layer, user_id: str | None = None,
                 id_reference_prob: float = 0.45):
        self.b = _Builder(rng, db)
        self.b.id_reference_prob = id_reference_prob
        self.db = db
        self.user_id = user_id or self.b.d.choice(db.keys("users"))
        self.b.used.add(self.user_id)

    def _snapshot(self) -> Any:
        return copy_json(self.db.changes), set(self.b.used)

    def _restore(self, state: Any) -> None:
        self.db.changes.clear()
        self.db.changes.update(state[0])
        self.b.used = state[1]

    def _build(self, family: str, refuse: bool | None) -> Request:
        if refuse is None:
            refuse = self.b.d.bernoulli(REFUSE_RATE) and family != "info"
        if refuse and family == "info":
            raise CannotBuild("info requests are never refusals")
        return BUILDERS[family](self.b, self.db.get("users", self.user_id), refuse)

    def task(self, requests: list[Request], scenario: str, opening: str | None = None) -> TauTask:
        if not requests:
            raise ValueError("a task needs at least one request")
        d, db = self.b.d, self.db
        user = db.get("users", self.user_id)
        first, last = user["name"]["first_name"], user["name"]["last_name"]
        known, auth, auth_message = _authentication(d, db, user)
        _chain_requests(d, requests)
        greeting = d.choice(("Hi.", "Hello!", "Hi there.", "Good afternoon."))
        task = TauTask(task_id=f"retail-{scenario}-{d.digits(8)}", domain="retail", scenario=scenario,
                       user=UserScenario(persona=f"{first} {last}, a customer of the online store", known_info=known,
                                         opening=opening if opening is not None else f"{greeting} {requests[0].text}",
                                         instructions=" ".join(r.text for r in requests)),
                       requests=requests, auth=auth, auth_message=auth_message)
        try:
            _validate(task)
        except RuntimeError as exc:
            raise CannotBuild(str(exc)) from exc
        return task


def request_session(rng: np.random.Generator, db: Layer, size: dict | None = None, user_id: str | None = None,
                    describe_prob: float | None = None) -> RetailRequestSession:
    """A :class:`RetailRequestSession` (the capability envs' uniform request-building API; ``size`` is unused).

    ``describe_prob``: chance that a request names its order by an item in it rather than by id
    (when an item identifies it; a same-status order is then the plausible wrong one); None = the
    domain's default (0.55).
    """
    return RetailRequestSession(rng, db, user_id, 0.45 if describe_prob is None else 1.0 - describe_prob)


# ---------------------------------------------------------------------- τ²-bench's own data
_WRITE_TOOLS = frozenset(name for name, spec in tool_specs(RetailTools).items() if spec.write)
_SUPPORTED_BASIS = ("DB", "COMMUNICATE", "ACTION")


def _known_info(text: str) -> dict[str, str]:
    known: dict[str, str] = {}
    if m := re.search(r"[\w.+-]+@[\w-]+\.[\w.]+", text):
        known["email"] = m.group(0).rstrip(".")
    if m := re.search(r"\b[a-z]+_[a-z]+_\d{3,5}\b", text):
        known["user_id"] = m.group(0)
    if m := re.search(r"#W\d{7}", text):
        known["order_id"] = m.group(0)
    if m := re.search(r"\b\d{5}\b", text):
        known["zip"] = m.group(0)
    if m := re.search(r"You are ([A-Z][a-z]+) ([A-Z][a-z]+)", text):
        known["name"] = f"{m.group(1)} {m.group(2)}"
    return known


def tau2_task(raw: dict, skip: set[int] = frozenset()) -> TauTask:  # type: ignore[assignment]
    """One τ²-bench retail task as a :class:`TauTask` (one request per gold write, so the oracle replays them all).

    Args:
        raw: the task as in ``tasks.json``.
        skip: indices of gold actions to leave out (writes that fail on τ²-bench's DB, hence change nothing).
    """
    scenario = raw.get("user_scenario") or {}
    instructions = scenario.get("instructions") or ""
    if isinstance(instructions, dict):
        parts = [instructions.get(k) for k in ("reason_for_call", "known_info", "unknown_info", "task_instructions")]
        text = " ".join(p for p in parts if p)
        known_text = instructions.get("known_info") or ""
        reason = instructions.get("reason_for_call") or text
    else:
        text = known_text = reason = str(instructions)
    criteria = raw.get("evaluation_criteria") or {}
    actions = [Call(a["name"], dict(a.get("arguments") or {}))
               for i, a in enumerate(criteria.get("actions") or []) if i not in skip]
    facts = [str(f) for f in criteria.get("communicate_info") or []]
    basis = tuple(b for b in (criteria.get("reward_basis") or ("DB", "COMMUNICATE")) if b in _SUPPORTED_BASIS)
    transfers = [a for a in actions if a.name == "transfer_to_human_agents"]
    requests: list[Request] = []
    pending_reads: list[Call] = []
    for action in actions:
        if action.name == "transfer_to_human_agents":
            continue
        if action.name in _WRITE_TOOLS:
            args = ", ".join(f"{k}={v!r}" for k, v in action.arguments.items())
            requests.append(Request("tau2", "Please go ahead with the next change.", "act", reads=pending_reads,
                                    message=f"I will now call {action.name}({args}).", write=action,
                                    done_message="Done."))
            pending_reads = []
        else:
            pending_reads.append(action)
    if pending_reads or not requests:
        requests.append(Request("tau2", "Please tell me what you found.", "answer", reads=pending_reads,
                                message="I have looked into your request."))
    if facts:
        first = requests[0]
        first.message = f"Here is what I found: {'; '.join(facts)}. {first.message}"
        first.communicate = facts
    if transfers:
        requests.append(Request("tau2", "I'd like to talk to a human agent.", "answer", reads=transfers[-1:],
                                message="I am transferring you to a human agent."))
    requests[0].text = reason
    return TauTask(task_id=str(raw["id"]), domain="retail", scenario="tau2",
                   user=UserScenario(persona=str(scenario.get("persona") or "a customer of the online store"),
                                     known_info=_known_info(known_text), opening=reason, instructions=text),
                   requests=requests, reward_basis=basis,
                   gold_actions=[a for a in actions if a.name in _WRITE_TOOLS])


def load_tau2(path: str | Path) -> tuple[dict[str, dict[str, dict]], list[TauTask]]:
    """Read τ²-bench's retail ``db.json`` and ``tasks.json`` from ``path``: (tables, tasks)."""
    path = Path(path)
    with open(path / "db.json", encoding="utf-8") as f:
        raw_db = json.load(f)
    tables = {name: raw_db[name] for name in ("products", "users", "orders")}
    with open(path / "tasks.json", encoding="utf-8") as f:
        raw_tasks: list[Any] = json.load(f)
    return tables, [tau2_task(t, _failing_writes(tables, t)) for t in raw_tasks]


def _failing_writes(tables: dict, raw: dict) -> set[int]:
    """Indices of the task's gold actions that fail when replayed in order (τ²-bench records them as
    errors that change nothing, so they are dropped from the gold path)."""
    from ...core.tools import ToolSet

    tools = ToolSet(RetailTools(Layer(tables)))
    failing = set()
    for i, action in enumerate((raw.get("evaluation_criteria") or {}).get("actions") or []):
        if action["name"] in _WRITE_TOOLS and not tools.call(action["name"], dict(action.get("arguments") or {})).ok:
            failing.add(i)
    return failing
