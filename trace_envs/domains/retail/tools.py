"""The retail domain's tools, with τ²-bench's names, arguments and read/write semantics.

Reads never copy (they return the stored record; the serializer turns it into
the tool message). Writes check everything first and only then change the
database through :meth:`Layer.edit`, so a failed call leaves it untouched.
The tools enforce what τ²-bench's tools enforce (order status, item and
variant existence, same product, availability, payment method ownership,
gift card balance, the original-payment-method rule for returns). They do
*not* check that an order belongs to the authenticated user, nor that an
order whose items were modified is left alone: those rules live in the
policy, and the agent must apply them.
"""

from __future__ import annotations

import json
from ...core.tools import ToolError, tool
from ..db import Layer, copy_json
from ..generic import GenericTools, calculate  # noqa: F401 - calculate is part of this module's API

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
_ORDER_ID = "Order ids look like '#W0000000' (with the '#'); the user's order ids are in get_user_details."


def _money(value: float) -> float:
    return round(value + 0.0, 2)


class RetailTools(GenericTools):
    """The tools of the retail domain over one database layer.

    Args:
        db: the episode's copy-on-write layer (tables ``products``, ``users``, ``orders``).
        tau2_compat: accept what τ²-bench's tools accept (an empty item list in a return, exchange or
            item change) and price an item change as τ²-bench does (see
            :mod:`trace_envs.domains.tau2_compat`). Off: the stricter tools documented below.
    """

    def __init__(self, db: Layer, tau2_compat: bool = False):
        self.db = db
        self.tau2_compat = tau2_compat

    # ------------------------------------------------------------------ lookups
    def _order(self, order_id: str) -> dict:
        order = self.db.get("orders", order_id)
        if order is None:
            hint = " Did you forget the '#'?" if not order_id.startswith("#") and \
                self.db.get("orders", "#" + order_id) is not None else ""
            raise ToolError(f"order {order_id!r} not found.{hint} {_ORDER_ID}")
        return order

    def _user(self, user_id: str) -> dict:
        user = self.db.get("users", user_id)
        if user is None:
            raise ToolError(f"user {user_id!r} not found. Find the user id with find_user_id_by_email or "
                            "find_user_id_by_name_zip.")
        return user

    def _product(self, product_id: str) -> dict:
        product = self.db.get("products", product_id)
        if product is None:
            hint = (" That is an item id; get_item_details gives its product id."
                    if self._find_variant(product_id) is not None else "")
            raise ToolError(f"product {product_id!r} not found.{hint} list_all_product_types lists the product ids.")
        return product

    def _find_variant(self, item_id: str) -> tuple[dict, dict] | None:
        for product in self.db.values("products"):
            variant = product["variants"].get(item_id)
            if variant is not None:
                return product, variant
        return None

    def _payment_method(self, user_id: str, payment_method_id: str) -> dict:
        user = self._user(user_id)
        method = user["payment_methods"].get(payment_method_id)
        if method is None:
            raise ToolError(f"payment method {payment_method_id!r} not found for user {user_id!r}; "
                            f"their payment methods are: {', '.join(user['payment_methods'])}.")
        return method

    def _check_items(self, order: dict, item_ids: list[str]) -> None:
        have: dict[str, int] = {}
        for item in order["items"]:
            have[item["item_id"]] = have.get(item["item_id"], 0) + 1
        want: dict[str, int] = {}
        for item_id in item_ids:
            want[item_id] = want.get(item_id, 0) + 1
        for item_id, count in want.items():
            if count > have.get(item_id, 0):
                listed = ", ".join(sorted(have))
                raise ToolError(f"item {item_id!r} is not in order {order['order_id']} "
                                f"{'that many times' if item_id in have else ''}".rstrip()
                                + f". The order's item ids are: {listed}.")
        if not item_ids and not self.tau2_compat:  # τ²-bench files a return or exchange of nothing
            raise ToolError("item_ids is empty: name at least one item of the order.")

    def _price_difference(self, order: dict, item_ids: list[str], new_item_ids: list[str],
                          verb: str) -> tuple[float, list[dict]]:
        """The price difference of swapping items for variants of the same products, and those variants."""
        if len(item_ids) != len(new_item_ids):
            raise ToolError(f"item_ids has {len(item_ids)} item(s) but new_item_ids has {len(new_item_ids)}; "
                            f"each item to be {verb} needs exactly one new item in the same position.")
        by_id = {item["item_id"]: item for item in order["items"]}
        diff = 0.0
        variants = []
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            item = by_id[item_id]
            if new_item_id == item_id and verb == "modified":
                raise ToolError(f"new item {new_item_id} is the same as the old item; choose a different option.")
            product = self.db.get("products", item["product_id"])
            variant = product["variants"].get(new_item_id) if product else None
            if variant is None:
                raise ToolError(f"item {new_item_id!r} is not a variant of {item['name']} (product "
                                f"{item['product_id']}); items can only be {verb} for the same product type.")
            if not variant["available"]:
                raise ToolError(f"item {new_item_id} ({item['name']}) is not available.")
            diff += variant["price"] - item["price"]
            variants.append(variant)
        if self.tau2_compat and verb == "modified":  # τ²-bench does not round this difference
            return diff, variants
        return _money(diff), variants

    # ------------------------------------------------------------------ generic

    # ------------------------------------------------------------------ reads
    @tool
    def find_user_id_by_email(self, email: str) -> str:
        """Find a user id by email address.

        Args:
            email: The email of the user, such as 'something@example.com'.
        """
        wanted = email.strip().lower()
        for user in self.db.values("users"):
            if user["email"].lower() == wanted:
                return user["user_id"]
        raise ToolError(f"no user with email {email!r}. Ask the user to check it, or identify them by first name, "
                        "last name and zip code (find_user_id_by_name_zip).")

    @tool
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find a user id by first name, last name and zip code. Use this only if the user cannot be found by email.

        Args:
            first_name: The first name of the customer, such as 'John'.
            last_name: The last name of the customer, such as 'Doe'.
            zip: The zip code of the customer, such as '12345'.
        """
        first, last, code = first_name.strip().lower(), last_name.strip().lower(), zip.strip()
        for user in self.db.values("users"):
            name = user["name"]
            if name["first_name"].lower() == first and name["last_name"].lower() == last \
                    and user["address"]["zip"] == code:
                return user["user_id"]
        raise ToolError(f"no user named {first_name} {last_name} with zip code {zip!r}.")

    @tool
    def get_user_details(self, user_id: str) -> dict:
        """Get the details of a user: name, address, email, payment methods and order ids.

        Args:
            user_id: The user id, such as 'sara_doe_496'.
        """
        return self._user(user_id)

    @tool
    def get_order_details(self, order_id: str) -> dict:
        """Get the status and details of an order.

        Args:
            order_id: The order id, such as '#W0000000'. Note the '#' at the beginning.
        """
        return self._order(order_id)

    @tool
    def get_product_details(self, product_id: str) -> dict:
        """Get the inventory details of a product: all its variants (items) with their options,
        availability and price.

        Args:
            product_id: The product id, such as '6086499569'. A product id is not an item id.
        """
        return self._product(product_id)

    @tool
    def get_item_details(self, item_id: str) -> dict:
        """Get the details of one item (a product variant): its product, options, availability and price.

        Args:
            item_id: The item id, such as '1008292230'.
        """
        found = self._find_variant(item_id)
        if found is None:
            raise ToolError(f"item {item_id!r} not found. Item ids are listed in get_product_details "
                            "and in get_order_details.")
        product, variant = found
        return {"name": product["name"], "product_id": product["product_id"], **variant}

    @tool
    def list_all_product_types(self) -> str:
        """List the name and product id of every product type, as a JSON object sorted by name."""
        return json.dumps({p["name"]: p["product_id"] for p in self.db.values("products")}, sort_keys=True)

    # ------------------------------------------------------------------ writes
    @tool(write=True)
    def cancel_pending_order(self, order_id: str, reason: str) -> dict:
        """Cancel a pending order. Processed or delivered orders cannot be cancelled. Explain the
        cancellation and get the user's explicit confirmation (yes) first. The payment is refunded:
        at once to a gift card, otherwise in 5-7 business days.

        Args:
            order_id: The order id, such as '#W0000000'. Note the '#' at the beginning.
            reason: The reason for cancellation: 'no longer needed' or 'ordered by mistake'.
        """
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ToolError(f"order {order_id} is '{order['status']}'; only pending orders can be cancelled.")
        if reason not in CANCEL_REASONS:
            raise ToolError(f"invalid reason {reason!r}; the reason must be 'no longer needed' or "
                            "'ordered by mistake'.")
        for payment in order["payment_history"]:
            self._payment_method(order["user_id"], payment["payment_method_id"])
        refunds = [{"transaction_type": "refund", "amount": p["amount"], "payment_method_id": p["payment_method_id"]}
                   for p in order["payment_history"]]
        for refund in refunds:
            method = self._payment_method(order["user_id"], refund["payment_method_id"])
            if method["source"] == "gift_card":
                edited = self.db.edit("users", order["user_id"])["payment_methods"][refund["payment_method_id"]]
                edited["balance"] = _money(edited["balance"] + refund["amount"])
        order = self.db.edit("orders", order_id)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    @tool(write=True)
    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str, state: str,
                                     country: str, zip: str) -> dict:
        """Modify the shipping address of a pending order. Explain the change and get the user's
        explicit confirmation (yes) first.

        Args:
            order_id: The order id, such as '#W0000000'. Note the '#' at the beginning.
            address1: The first line of the address, such as '123 Main St'.
            address2: The second line of the address, such as 'Apt 1' or ''.
            city: The city, such as 'San Francisco'.
            state: The state, such as 'CA'.
            country: The country, such as 'USA'.
            zip: The zip code, such as '12345'.
        """
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ToolError(f"order {order_id} is '{order['status']}'; only pending orders can be modified.")
        order = self.db.edit("orders", order_id)
        order["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                            "country": country, "zip": zip}
        return order

    @tool(write=True)
    def modify_pending_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                   payment_method_id: str) -> dict:
        """Modify items of a pending order to other variants of the same products. This can be done
        only once per order. Explain the change and get the user's explicit confirmation (yes) first.

        Args:
            order_id: The order id, such as '#W0000000'. Note the '#' at the beginning.
            item_ids: The item ids to modify, such as ['1008292230']. An item may appear more than once.
            new_item_ids: The new item ids, one per item in item_ids, in the same positions, each a variant of
                the same product.
            payment_method_id: The payment method that pays or receives the price difference, such as
                'gift_card_0000000' or 'credit_card_0000000'.
        """
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ToolError(f"order {order_id} is '{order['status']}'; only pending orders whose items were "
                            "not modified before can have their items modified.")
        self._check_items(order, item_ids)
        diff, variants = self._price_difference(order, item_ids, new_item_ids, "modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < diff:
            raise ToolError(f"gift card {payment_method_id} has a balance of {method['balance']}, not enough to pay "
                            f"the price difference of {diff}.")
        if method["source"] == "gift_card":
            edited = self.db.edit("users", order["user_id"])["payment_methods"][payment_method_id]
            edited["balance"] = _money(edited["balance"] - diff)
        order = self.db.edit("orders", order_id)
        order["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund",
                                         "amount": abs(diff), "payment_method_id": payment_method_id})
        replaced: set[int] = set()
        for item_id, variant in zip(item_ids, variants):
            if self.tau2_compat:
                # τ²-bench's pricing bug, reproduced so that rewards match its own: every changed item gets
                # the new id it asked for but the price and options of the *last* new variant in the call.
                index = next(i for i, it in enumerate(order["items"]) if it["item_id"] == item_id)
                variant = dict(variant, price=variants[-1]["price"], options=variants[-1]["options"])
            else:
                index = next(i for i, it in enumerate(order["items"])
                             if it["item_id"] == item_id and i not in replaced)
            replaced.add(index)
            item = order["items"][index]
            item["item_id"] = variant["item_id"]
            item["price"] = variant["price"]
            item["options"] = copy_json(variant["options"])
        order["status"] = "pending (item modified)"
        return order

    @tool(write=True)
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> dict:
        """Modify the payment method of a pending order. Explain the change and get the user's
        explicit confirmation (yes) first.

        Args:
            order_id: The order id, such as '#W0000000'. Note the '#' at the beginning.
            payment_method_id: The new payment method, such as 'gift_card_0000000' or 'credit_card_0000000'.
        """
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ToolError(f"order {order_id} is '{order['status']}'; only pending orders can be modified.")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ToolError(f"order {order_id} has {len(history)} transactions; the payment method can only be "
                            "changed for an order with exactly one payment.")
        old_id, amount = history[0]["payment_method_id"], history[0]["amount"]
        if old_id == payment_method_id:
            raise ToolError(f"order {order_id} is already paid with {payment_method_id}; choose a different method.")
        if method["source"] == "gift_card" and method["balance"] < amount:
            raise ToolError(f"gift card {payment_method_id} has a balance of {method['balance']}, not enough to pay "
                            f"the order total of {amount}.")
        old = self._payment_method(order["user_id"], old_id)
        if method["source"] == "gift_card" or old["source"] == "gift_card":
            methods = self.db.edit("users", order["user_id"])["payment_methods"]
            if method["source"] == "gift_card":
                methods[payment_method_id]["balance"] = _money(methods[payment_method_id]["balance"] - amount)
            if old["source"] == "gift_card":
                methods[old_id]["balance"] = _money(methods[old_id]["balance"] + amount)
        order = self.db.edit("orders", order_id)
        order["payment_history"].extend([
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
        ])
        return order

    @tool(write=True)
    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str, country: str,
                            zip: str) -> dict:
        """Modify the default address of a user. Explain the change and get the user's explicit
        confirmation (yes) first.

        Args:
            user_id: The user id, such as 'sara_doe_496'.
            address1: The first line of the address, such as '123 Main St'.
            address2: The second line of the address, such as 'Apt 1' or ''.
            city: The city, such as 'San Francisco'.
            state: The state, such as 'CA'.
            country: The country, such as 'USA'.
            zip: The zip code, such as '12345'.
        """
        self._user(user_id)
        user = self.db.edit("users", user_id)
        user["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                           "country": country, "zip": zip}
        return user

    @tool(write=True)
    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> dict:
        """Return items of a delivered order; the order status becomes 'return requested' and the user
        gets an email on how to send the items back. The refund goes to the original payment method or
        to a gift card of the user. Explain the return and get the user's explicit confirmation (yes) first.

        Args:
            order_id: The order id, such as '#W0000000'. Note the '#' at the beginning.
            item_ids: The item ids to return, such as ['1008292230']. An item may appear more than once.
            payment_method_id: The payment method that receives the refund: the original payment method of
                the order or a gift card, such as 'gift_card_0000000'.
        """
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError(f"order {order_id} is '{order['status']}'; only delivered orders can be returned.")
        method = self._payment_method(order["user_id"], payment_method_id)
        original = order["payment_history"][0]["payment_method_id"]
        if method["source"] != "gift_card" and payment_method_id != original:
            raise ToolError(f"the refund must go to the original payment method ({original}) or to a gift card.")
        self._check_items(order, item_ids)
        order = self.db.edit("orders", order_id)
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    @tool(write=True)
    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                       payment_method_id: str) -> dict:
        """Exchange items of a delivered order for other variants of the same products; the order status
        becomes 'exchange requested'. An order can be exchanged only once. Explain the exchange and get the
        user's explicit confirmation (yes) first.

        Args:
            order_id: The order id, such as '#W0000000'. Note the '#' at the beginning.
            item_ids: The item ids to exchange, such as ['1008292230']. An item may appear more than once.
            new_item_ids: The new item ids, one per item in item_ids, in the same positions, each a variant of
                the same product.
            payment_method_id: The payment method that pays or receives the price difference, such as
                'gift_card_0000000' or 'credit_card_0000000'.
        """
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError(f"order {order_id} is '{order['status']}'; only delivered orders can be exchanged.")
        self._check_items(order, item_ids)
        diff, _ = self._price_difference(order, item_ids, new_item_ids, "exchanged")
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < diff:
            raise ToolError(f"gift card {payment_method_id} has a balance of {method['balance']}, not enough to pay "
                            f"the price difference of {diff}.")
        order = self.db.edit("orders", order_id)
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff
        return order
