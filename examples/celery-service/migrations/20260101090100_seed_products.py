"""Seed the catalogue."""

PRODUCTS = [
    {"sku": "MUG-1", "name": "Mug", "price_cents": 900},
    {"sku": "TEE-1", "name": "T-shirt", "price_cents": 1900},
    {"sku": "CAP-1", "name": "Cap", "price_cents": 1500},
]


def up(ctx):
    for product in PRODUCTS:
        ctx.db.products.update_one({"sku": product["sku"]}, {"$setOnInsert": product},
                                   upsert=True)


def down(ctx):
    ctx.db.products.delete_many({"sku": {"$in": [p["sku"] for p in PRODUCTS]}})
