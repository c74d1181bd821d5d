"""Foundations (chapters 1-4): dot products, softmax, scaling and masks."""
