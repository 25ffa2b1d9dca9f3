"""Operators for decode attention over a KV cache (FlashDecoding, ragged paged attention): skip the
cache past each length, group query heads that share a K/V head, split the KV axis across
programs or chips, and start a page copy only where it is needed."""
