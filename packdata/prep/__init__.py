"""Conversion-time preparation of one sample: deterministic work done once, not every epoch."""
