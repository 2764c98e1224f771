"""Batched augmentations that run on the device of the batch they receive."""
