"""The retail domain's database, generated from a seed: products with variants, users, orders.

The tables follow τ²-bench's retail ``db.json`` (docs/design.md, "Target environments"): ``products``
(``{product_id: {name, product_id, variants: {item_id: {item_id, options,
available, price}}}}``), ``users`` (name, address, email, payment methods —
credit card, PayPal, gift card with a balance —, order ids) and ``orders``
(user, shipping address, items, status, fulfillments with tracking ids,
payment history).

All randomness comes from the numpy ``Generator`` handed in, drawn in bulk
(:class:`Draw`) so that a small database takes a fraction of a millisecond.
Person and street names come from Faker pools built once per process with a
fixed seed; the product catalogue and cities are written here.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

#: DB size presets. ``small`` keeps reset + task generation under a millisecond; ``tau2`` matches
#: τ²-bench's retail DB (50 product types, ~600 variants, 500 users, 1000 orders).
SIZES: dict[str, dict[str, Any]] = {
    "small": {"products": 12, "variants_min": 4, "variants_max": 7, "users": 8, "orders": 24, "max_items": 4},
    "tau2": {"products": 50, "variants_min": 5, "variants_max": 19, "users": 500, "orders": 1000, "max_items": 5},
}

#: Order statuses of τ²-bench's data, and those its write tools produce.
STATUSES = ("pending", "processed", "delivered", "cancelled")
WRITE_STATUSES = ("pending (item modified)", "exchange requested", "return requested", "cancelled")
_STATUS_WEIGHTS = (0.42, 0.11, 0.37, 0.10)

# name, option dimensions, price range (dollars). Written for this project.
CATALOGUE: tuple[tuple[str, dict[str, tuple[str, ...]], tuple[float, float]], ...] = (
    ("T-Shirt", {"color": ("black", "white", "red", "blue", "purple", "green"), "size": ("S", "M", "L", "XL", "XXL"),
                 "material": ("cotton", "polyester"), "style": ("crew neck", "v-neck")}, (40, 60)),
    ("Laptop", {"screen size": ("13-inch", "15-inch", "17-inch"), "processor": ("i5", "i7", "i9"),
                "ram": ("8GB", "16GB", "32GB"), "storage": ("256GB SSD", "512GB SSD", "1TB SSD"),
                "color": ("silver", "space grey", "black")}, (1900, 3100)),
    ("Running Shoes", {"size": ("7", "8", "9", "10", "11"), "color": ("black", "white", "red", "yellow"),
                       "material": ("synthetic", "mesh", "leather"), "sole": ("rubber", "EVA")}, (90, 200)),
    ("Smartphone", {"color": ("black", "gold", "rose gold", "silver"), "storage": ("64GB", "128GB", "256GB"),
                    "RAM": ("4GB", "6GB", "8GB"), "screen size": ("5.8-inch", "6.1-inch", "6.5-inch")}, (900, 1300)),
    ("Backpack", {"color": ("black", "grey", "navy", "green"), "size": ("small", "medium", "large"),
                  "material": ("nylon", "polyester", "leather"), "compartment": ("laptop", "hydration", "camera")},
     (170, 230)),
    ("Coffee Maker", {"color": ("black", "stainless steel", "white"), "capacity": ("1 cup", "4 cups", "8 cups", "12 cups"),
                      "type": ("drip", "espresso", "french press"), "features": ("auto shutoff", "timer", "built-in grinder")},
     (230, 330)),
    ("Water Bottle", {"capacity": ("500ml", "750ml", "1000ml"), "material": ("glass", "plastic", "stainless steel"),
                      "color": ("blue", "red", "black", "green")}, (20, 50)),
    ("Desk Lamp", {"color": ("white", "black", "silver"), "brightness": ("low", "medium", "high"),
                   "power source": ("AC adapter", "battery", "USB")}, (130, 220)),
    ("Notebook", {"size": ("A4", "A5"), "cover type": ("hard cover", "soft cover"),
                  "paper": ("ruled", "plain", "dotted")}, (10, 40)),
    ("Sunglasses", {"frame color": ("black", "brown", "silver"), "lens color": ("black", "green", "blue", "brown"),
                    "lens type": ("polarized", "non-polarized"), "frame material": ("plastic", "metal")}, (250, 310)),
    ("Wristwatch", {"strap material": ("leather", "metal", "silicone"), "dial color": ("black", "white", "blue")},
     (1700, 2300)),
    ("Electric Toothbrush", {"color": ("white", "black", "blue"), "speed settings": ("low", "high"),
                             "battery type": ("rechargeable", "AA batteries")}, (140, 200)),
    ("Yoga Mat", {"thickness": ("4mm", "6mm", "8mm"), "material": ("PVC", "natural rubber", "TPE"),
                  "color": ("pink", "blue", "green", "purple")}, (90, 140)),
    ("Bluetooth Speaker", {"color": ("black", "blue", "red", "green"), "battery life": ("8 hours", "10 hours", "20 hours"),
                           "water resistance": ("yes", "no")}, (270, 330)),
    ("Gaming Mouse", {"color": ("black", "white", "RGB"), "sensor type": ("optical", "laser"),
                      "connectivity": ("wired", "wireless")}, (130, 200)),
    ("Action Camera", {"resolution": ("1080p", "4K", "5K"), "waterproof": ("yes", "no"),
                       "color": ("black", "silver")}, (380, 520)),
    ("Garden Hose", {"length": ("25ft", "50ft", "100ft"), "material": ("rubber", "vinyl", "latex"),
                     "color": ("green", "blue", "black")}, (90, 140)),
    ("Hiking Boots", {"size": ("7", "8", "9", "10", "11", "12"), "material": ("leather", "synthetic"),
                      "waterproof": ("yes", "no")}, (200, 270)),
    ("Tablet", {"screen size": ("7-inch", "8-inch", "10-inch"), "storage": ("32GB", "64GB", "128GB"),
                "color": ("black", "silver", "gold")}, (950, 1100)),
    ("E-Reader", {"screen size": ("6-inch", "7-inch", "8-inch"), "connectivity": ("Wi-Fi", "Wi-Fi + Cellular"),
                  "storage": ("8GB", "32GB")}, (250, 320)),
    ("Portable Charger", {"capacity": ("5000mAh", "10000mAh", "20000mAh"), "output": ("USB-A", "USB-C", "Wireless"),
                          "color": ("black", "white", "blue")}, (20, 60)),
    ("Indoor Security Camera", {"resolution": ("1080p", "2K", "4K"), "field of view": ("110 degrees", "130 degrees",
                                                                                       "160 degrees"),
                                "connectivity": ("Wi-Fi", "Ethernet")}, (2600, 3100)),
    ("Electric Kettle", {"capacity": ("1L", "1.5L", "2L"), "material": ("glass", "plastic", "stainless steel"),
                         "color": ("white", "black", "silver")}, (140, 260)),
    ("Mechanical Keyboard", {"switch type": ("linear", "tactile", "clicky"),
                             "backlight": ("none", "white", "RGB"), "size": ("full size", "80%", "60%")}, (120, 290)),
    ("Wireless Earbuds", {"color": ("black", "white", "blue"), "battery life": ("4 hours", "6 hours", "8 hours"),
                          "water resistance": ("IPX4", "IPX7", "not resistant")}, (150, 260)),
    ("Smart Thermostat", {"compatibility": ("Google Assistant", "Amazon Alexa", "Apple HomeKit"),
                          "color": ("black", "white", "stainless steel")}, (230, 270)),
    ("Fleece Jacket", {"size": ("S", "M", "L", "XL"), "color": ("black", "navy", "red", "grey"),
                       "zipper": ("full", "half")}, (90, 140)),
    ("Wall Clock", {"diameter": ("10 inches", "12 inches", "14 inches"), "color": ("black", "white", "wood"),
                    "type": ("analog", "digital")}, (150, 300)),
    ("Dumbbell Set", {"weight range": ("5-25 lbs", "30-50 lbs", "55-75 lbs"), "material": ("iron", "rubber", "urethane"),
                      "set type": ("fixed", "adjustable")}, (430, 560)),
    ("Pet Bed", {"size": ("small", "medium", "large"), "material": ("polyester", "fleece", "memory foam"),
                 "color": ("grey", "brown", "beige")}, (140, 200)),
    ("Espresso Machine", {"pressure": ("9 bar", "15 bar", "19 bar"), "capacity": ("1L", "1.5L", "2L"),
                          "type": ("manual", "automatic", "capsule")}, (2400, 3100)),
    ("Cycling Helmet", {"size": ("S", "M", "L"), "color": ("black", "white", "red", "blue"),
                        "ventilation": ("low", "medium", "high")}, (150, 230)),
    ("LED Light Bulb", {"brightness": ("60W equivalent", "75W equivalent", "100W equivalent"),
                        "color temperature": ("warm white", "daylight", "cool white"),
                        "connectivity": ("none", "Wi-Fi", "Bluetooth")}, (45, 60)),
    ("Digital Camera", {"resolution": ("20MP", "24MP", "30MP"), "zoom": ("3x", "5x", "10x"),
                        "storage": ("SD card", "CF card")}, (2300, 3300)),
    ("Bookshelf", {"material": ("wood", "metal", "glass"), "color": ("white", "black", "brown"),
                   "height": ("3 ft", "4 ft", "5 ft", "6 ft")}, (450, 550)),
    ("Bicycle", {"frame size": ("small", "medium", "large"), "color": ("black", "red", "blue", "green"),
                 "type": ("road", "mountain", "city")}, (1800, 2200)),
    ("Office Chair", {"material": ("fabric", "mesh", "leather"), "color": ("black", "grey", "blue"),
                      "armrest": ("none", "fixed", "adjustable"), "backrest height": ("standard", "high-back")},
     (430, 560)),
    ("Smart Watch", {"color": ("black", "silver", "gold"), "band material": ("silicone", "leather", "metal"),
                     "display": ("LCD", "AMOLED")}, (300, 390)),
    ("Luggage Set", {"piece count": ("2-piece", "3-piece", "4-piece"), "color": ("black", "blue", "red", "silver"),
                     "material": ("softshell", "hardshell")}, (450, 650)),
    ("Air Purifier", {"room size": ("small", "medium", "large"), "filter type": ("HEPA", "carbon", "ionic"),
                      "features": ("quiet operation", "night mode", "smart sensors")}, (470, 570)),
    ("Headphones", {"type": ("on-ear", "over-ear", "in-ear"), "connectivity": ("wired", "wireless"),
                    "color": ("black", "white", "red", "blue")}, (150, 380)),
    ("Vacuum Cleaner", {"type": ("upright", "canister", "robotic"), "bagged/bagless": ("bagged", "bagless"),
                        "features": ("pet hair removal", "HEPA filter", "cordless")}, (480, 660)),
    ("Skateboard", {"deck material": ("maple", "bamboo", "plastic"), "length": ("28 inch", "31 inch", "34 inch"),
                    "design": ("plain", "graphic", "custom")}, (120, 220)),
    ("Jigsaw Puzzle", {"pieces": ("500", "1000", "1500", "2000"), "theme": ("animals", "art", "fantasy", "landscape"),
                       "difficulty level": ("beginner", "intermediate", "expert")}, (45, 90)),
    ("Grill", {"type": ("charcoal", "electric", "gas"), "size": ("portable", "medium", "large"),
               "features": ("rotisserie", "side burner", "none")}, (800, 1100)),
    ("Sneakers", {"size": ("6", "7", "8", "9", "10", "11"), "color": ("white", "black", "grey", "red"),
                  "material": ("canvas", "leather", "synthetic")}, (140, 210)),
    ("Tea Kettle", {"material": ("stainless steel", "ceramic", "glass"), "capacity": ("1 liter", "1.5 liters", "2 liters"),
                    "stovetop compatibility": ("gas", "electric", "induction")}, (80, 140)),
    ("Patio Umbrella", {"size": ("6 ft", "7 ft", "9 ft"), "color": ("green", "blue", "red", "black"),
                        "material": ("olefin", "polyester", "sunbrella"), "tilt mechanism": ("manual tilt", "auto tilt")},
     (240, 300)),
    ("Makeup Kit", {"skin tone": ("light", "medium", "dark"), "kit size": ("basic", "professional"),
                    "brand": ("Brand A", "Brand B", "Brand C")}, (230, 280)),
    ("Perfume", {"scent family": ("woody", "fresh", "oriental"), "size": ("30ml", "50ml", "100ml"),
                 "gender": ("men", "women", "unisex")}, (250, 350)),
)

# Real US cities with their state and the first three digits of one of their zip codes.
CITIES: tuple[tuple[str, str, str], ...] = (
    ("New York", "NY", "100"), ("Los Angeles", "CA", "900"), ("Chicago", "IL", "606"), ("Houston", "TX", "770"),
    ("Phoenix", "AZ", "850"), ("Philadelphia", "PA", "191"), ("San Antonio", "TX", "782"), ("San Diego", "CA", "921"),
    ("Dallas", "TX", "752"), ("San Jose", "CA", "951"), ("Austin", "TX", "787"), ("Jacksonville", "FL", "322"),
    ("Fort Worth", "TX", "761"), ("Columbus", "OH", "432"), ("Charlotte", "NC", "282"), ("Indianapolis", "IN", "462"),
    ("San Francisco", "CA", "941"), ("Seattle", "WA", "981"), ("Denver", "CO", "802"), ("Washington", "DC", "200"),
    ("Boston", "MA", "021"), ("Nashville", "TN", "372"), ("Portland", "OR", "972"), ("Las Vegas", "NV", "891"),
    ("Detroit", "MI", "482"), ("Memphis", "TN", "381"), ("Louisville", "KY", "402"), ("Baltimore", "MD", "212"),
    ("Milwaukee", "WI", "532"), ("Albuquerque", "NM", "871"), ("Tucson", "AZ", "857"), ("Sacramento", "CA", "958"),
    ("Atlanta", "GA", "303"), ("Miami", "FL", "331"), ("Minneapolis", "MN", "554"), ("Tampa", "FL", "336"),
    ("Pittsburgh", "PA", "152"), ("Cincinnati", "OH", "452"), ("Orlando", "FL", "328"), ("Raleigh", "NC", "276"),
)
CARD_BRANDS = ("visa", "mastercard", "amex", "discover")


class Draw:
    """Uniform numbers drawn from a numpy ``Generator`` in bulk, then handed out one by one.

    A numpy call costs about a microsecond however few numbers it returns; generating a record
    takes dozens of choices, so drawing them in chunks is what keeps a small DB sub-millisecond.
    The sequence is a pure function of the generator's state.
    """

    __slots__ = ("rng", "buf", "i", "chunk")

    def __init__(self, rng: np.random.Generator, chunk: int = 1024):
        self.rng, self.chunk, self.buf, self.i = rng, chunk, [], 0

    def u(self) -> float:
        if self.i >= len(self.buf):
            self.buf, self.i = self.rng.random(self.chunk).tolist(), 0
        value = self.buf[self.i]
        self.i += 1
        return value

    def below(self, n: int) -> int:
        """An integer in [0, n)."""
        return int(self.u() * n)

    def between(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi] (both included)."""
        return lo + int(self.u() * (hi - lo + 1))

    def choice(self, seq: Sequence) -> Any:
        return seq[int(self.u() * len(seq))]

    def weighted(self, seq: Sequence, weights: Sequence[float]) -> Any:
        x, acc = self.u() * sum(weights), 0.0
        for item, w in zip(seq, weights):
            acc += w
            if x < acc:
                return item
        return seq[-1]

    def digits(self, n: int) -> str:
        """An n-digit decimal string without a leading zero."""
        return str(10 ** (n - 1) + int(self.u() * 9 * 10 ** (n - 1)))

    def sample(self, seq: Sequence, k: int) -> list:
        """k distinct elements (partial Fisher-Yates), in draw order."""
        pool = list(seq)
        k = min(k, len(pool))
        for i in range(k):
            j = i + int(self.u() * (len(pool) - i))
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:k]

    def bernoulli(self, p: float) -> bool:
        return self.u() < p


_POOLS: dict[str, tuple[str, ...]] | None = None


def name_pools() -> dict[str, tuple[str, ...]]:
    """First names, last names and street names from Faker, built once per process with a fixed seed."""
    global _POOLS
    if _POOLS is None:
        from faker import Faker

        fake = Faker("en_US")
        fake.seed_instance(20240611)

        def unique(fn, n: int) -> tuple[str, ...]:
            seen: dict[str, None] = {}
            for _ in range(n * 20):
                value = fn()
                if value.isalpha() or " " in value:
                    seen.setdefault(value, None)
                if len(seen) >= n:
                    break
            return tuple(seen)

        _POOLS = {
            "first": unique(fake.first_name, 160),
            "last": unique(fake.last_name, 160),
            "street": unique(lambda: f"{fake.street_name()}", 120),
        }
    return _POOLS


def _address(d: Draw, pools: dict) -> dict:
    city, state, zip3 = d.choice(CITIES)
    return {"address1": f"{d.between(10, 999)} {d.choice(pools['street'])}",
            "address2": f"Suite {d.between(100, 999)}" if d.u() < 0.85 else "",
            "city": city, "country": "USA", "state": state, "zip": zip3 + f"{d.below(100):02d}"}


def new_address(d: Draw, avoid: dict | None = None) -> dict:
    """A fresh random address (for tasks that move a user or an order), different from ``avoid``."""
    pools = name_pools()
    while True:
        address = _address(d, pools)
        if address != avoid:
            return address


def _unique_id(d: Draw, taken: set, make) -> str:
    while True:
        value = make(d)
        if value not in taken:
            taken.add(value)
            return value


_COMBOS: dict[str, list[dict]] = {}


def option_combos(name: str) -> list[dict]:
    """Every option combination of a catalogue product, in a fixed order (built once per process).

    The dicts are shared by every generated DB: treat them as read-only (tools copy before writing).
    """
    combos = _COMBOS.get(name)
    if combos is None:
        dims = next(t[1] for t in CATALOGUE if t[0] == name)
        combos = [{}]
        for dim, values in dims.items():
            combos = [{**c, dim: v} for c in combos for v in values]
        _COMBOS[name] = combos
    return combos


def generate_db(rng: np.random.Generator, size: dict) -> dict[str, dict[str, dict]]:
    """A retail database (``products``, ``users``, ``orders``) drawn from ``rng``.

    Args:
        rng: the numpy generator all randomness comes from.
        size: a size preset (see :data:`SIZES`): ``products``, ``variants_min``/``variants_max``,
            ``users``, ``orders``, ``max_items``.
    """
    d = Draw(rng)
    u = d.u
    pools = name_pools()
    taken: set[str] = set()
    n_products = min(int(size["products"]), len(CATALOGUE))

    products: dict[str, dict] = {}
    variant_list: list[tuple[dict, dict]] = []  # (product, variant)
    vmin, vmax = int(size["variants_min"]), int(size["variants_max"])
    for name, dims, (lo, hi) in d.sample(CATALOGUE, n_products):
        product_id = _unique_id(d, taken, _ten_digits)
        combos = option_combos(name)
        variants: dict[str, dict] = {}
        for index in d.sample(range(len(combos)), d.between(vmin, vmax)):
            item_id = _unique_id(d, taken, _ten_digits)
            variants[item_id] = {"item_id": item_id, "options": combos[index], "available": u() < 0.65,
                                 "price": round(lo + u() * (hi - lo), 2)}
        product = {"name": name, "product_id": product_id, "variants": variants}
        products[product_id] = product
        variant_list.extend((product, v) for v in variants.values())

    users: dict[str, dict] = {}
    emails: set[str] = set()
    first_pool, last_pool = pools["first"], pools["last"]
    for _ in range(int(size["users"])):
        first, last = first_pool[int(u() * len(first_pool))], last_pool[int(u() * len(last_pool))]
        stem = f"{first.lower()}_{last.lower()}_"
        user_id = _unique_id(d, taken, lambda d: stem + str(d.between(1000, 9999)))
        mail = f"{first.lower()}.{last.lower()}"
        email = _unique_id(d, emails, lambda d: f"{mail}{d.between(1000, 9999)}@example.com")
        methods: dict[str, dict] = {}
        kinds = d.sample(("credit_card", "paypal", "gift_card"), d.between(1, 3))
        if u() < 0.2:
            kinds.append("credit_card")
        for kind in kinds:
            pm_id = _unique_id(d, taken, lambda d: f"{kind}_{d.digits(7)}")
            if kind == "credit_card":
                methods[pm_id] = {"source": kind, "id": pm_id, "brand": d.choice(CARD_BRANDS),
                                  "last_four": f"{d.below(10000):04d}"}
            elif kind == "gift_card":
                methods[pm_id] = {"source": kind, "id": pm_id, "balance": float(d.between(0, 200))}
            else:
                methods[pm_id] = {"source": kind, "id": pm_id}
        users[user_id] = {"user_id": user_id, "name": {"first_name": first, "last_name": last},
                          "address": _address(d, pools), "email": email, "payment_methods": methods, "orders": []}

    user_ids = list(users)
    orders: dict[str, dict] = {}
    max_items = int(size["max_items"])
    n_variants = len(variant_list)
    for n in range(int(size["orders"])):
        user = users[user_ids[n] if n < len(user_ids) else user_ids[int(u() * len(user_ids))]]
        order_id = _unique_id(d, taken, _order_id)
        status = d.weighted(STATUSES, _STATUS_WEIGHTS)
        items = []
        for _ in range(1 + int(u() * max_items)):
            product, variant = variant_list[int(u() * n_variants)]
            items.append({"name": product["name"], "product_id": product["product_id"], "item_id": variant["item_id"],
                          "price": variant["price"], "options": variant["options"]})
        methods = list(user["payment_methods"])
        pm_id = methods[int(u() * len(methods))]
        total = round(sum(i["price"] for i in items), 2)
        payments = [{"transaction_type": "payment", "amount": total, "payment_method_id": pm_id}]
        if status == "cancelled":
            payments.append({"transaction_type": "refund", "amount": total, "payment_method_id": pm_id})
        fulfillments = [] if status == "pending" else [
            {"tracking_id": [d.digits(12)], "item_ids": [i["item_id"] for i in items]}]
        orders[order_id] = {"order_id": order_id, "user_id": user["user_id"], "address": dict(user["address"]),
                            "items": items, "status": status, "fulfillments": fulfillments,
                            "payment_history": payments}
        user["orders"].append(order_id)
    return {"products": products, "users": users, "orders": orders}


def _ten_digits(d: Draw) -> str:
    return d.digits(10)


def _order_id(d: Draw) -> str:
    return "#W" + d.digits(7)
