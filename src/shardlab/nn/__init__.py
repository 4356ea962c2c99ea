"""The torch side: the LM built from a ModelShape, its loss, and the corpora it trains on."""
