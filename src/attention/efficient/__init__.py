"""Efficient attention (chapters 10-16): linear and recurrent forms, associative
memory, sparse patterns, tiled exact attention, attention across devices and Triton."""
