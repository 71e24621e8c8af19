"""Create the products collection with a unique SKU."""


def up(ctx):
    ctx.db.create_collection("products")
    ctx.db.products.create_index("sku", unique=True)


def down(ctx):
    ctx.db.products.drop()
