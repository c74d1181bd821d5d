"""Attention layers (chapters 5-9): self-, multi-head and cross-attention,
position, scoring functions and alignment."""
