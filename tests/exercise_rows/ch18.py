"""Chapter 18's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch18
from exercise_rows import Row

# --------------------------------------------------------------------------- cache byte


def my_cache_bytes_per_token(config, bytes_per_number=2):
    """Bytes of KV cache one token takes in the whole model (all layers)."""
    if "kv_lora_rank" in config:  # MLA: one latent and one shared rotary key
        numbers = config["kv_lora_rank"] + config["rope_dim"]
    else:  # MHA, GQA, MQA: a key and a value per key/value head
        numbers = 2 * config["kv_heads"] * config["head_dim"]
    return config["layers"] * numbers * bytes_per_number


def my_cache_bytes_per_token_stub(config, bytes_per_number=2):
    """Bytes of KV cache one token takes in the whole model (all layers)."""
    raise NotImplementedError("write your solution here")


def bytes_without_the_factor_two(config, bytes_per_number=2):
    if "kv_lora_rank" in config:
        numbers = config["kv_lora_rank"] + config["rope_dim"]
    else:
        numbers = config["kv_heads"] * config["head_dim"]
    return config["layers"] * numbers * bytes_per_number


def bytes_of_one_layer(config, bytes_per_number=2):
    if "kv_lora_rank" in config:
        return (config["kv_lora_rank"] + config["rope_dim"]) * bytes_per_number
    return 2 * config["kv_heads"] * config["head_dim"] * bytes_per_number


def bytes_with_mla_doubled(config, bytes_per_number=2):
    if "kv_lora_rank" in config:
        numbers = 2 * (config["kv_lora_rank"] + config["rope_dim"])
    else:
        numbers = 2 * config["kv_heads"] * config["head_dim"]
    return config["layers"] * numbers * bytes_per_number


def bytes_of_the_query_heads(config, bytes_per_number=2):
    if "kv_lora_rank" in config:
        numbers = config["kv_lora_rank"] + config["rope_dim"]
    else:
        numbers = 2 * config["heads"] * config["head_dim"]
    return config["layers"] * numbers * bytes_per_number


# --------------------------------------------------------------------------- paged gath


def my_paged_gather(pool, block_table, length):
    """The first `length` positions of a sequence, read through its block table."""
    s = pool.shape[1]  # positions per block
    p = torch.arange(length)
    blocks = torch.tensor(block_table, dtype=torch.long)[p // s]  # physical block of p
    return pool[blocks, p % s]


def my_paged_gather_stub(pool, block_table, length):
    """The first `length` positions of a sequence, read through its block table."""
    raise NotImplementedError("write your solution here")


def gather_ignoring_the_table(pool, block_table, length):
    s = pool.shape[1]
    p = torch.arange(length)
    return pool[p // s, p % s]


def gather_whole_blocks(pool, block_table, length):
    return torch.cat([pool[b] for b in block_table])


def gather_with_a_flat_slot_without_s(pool, block_table, length):
    s = pool.shape[1]
    flat = pool.reshape(-1, *pool.shape[2:])
    return torch.stack([flat[block_table[p // s] + p % s] for p in range(length)])


# --------------------------------------------------------------------------- soft-cappi


def my_softcap_attention(q, k, v, cap, mask=None):
    """Attention with scores soft-capped to (-cap, cap) before the mask."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = cap * torch.tanh(scores / cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def my_softcap_attention_stub(q, k, v, cap, mask=None):
    """Attention with scores soft-capped to (-cap, cap) before the mask."""
    raise NotImplementedError("write your solution here")


def softcap_after_the_mask(q, k, v, cap, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(cap * torch.tanh(scores / cap), dim=-1) @ v


def softcap_after_the_softmax(q, k, v, cap, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return cap * torch.tanh(weights / cap) @ v


def softcap_without_the_factor(q, k, v, cap, mask=None):
    scores = torch.tanh(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) / cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def softcap_of_unscaled_scores(q, k, v, cap, mask=None):
    scores = cap * torch.tanh(q @ k.transpose(-2, -1) / cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# -------------------------------------------------------------------------------- sinks


def my_sink_weights(scores, sinks):
    """Attention weights with a learned sink logit per head (its share dropped)."""
    top = torch.maximum(scores.amax(-1, keepdim=True), sinks[:, None, None])
    e = torch.exp(scores - top)
    return e / (torch.exp(sinks[:, None, None] - top) + e.sum(-1, keepdim=True))


def my_sink_weights_stub(scores, sinks):
    """Attention weights with a learned sink logit per head (its share dropped)."""
    raise NotImplementedError("write your solution here")


def sink_weights_ignoring_the_sink(scores, sinks):
    return torch.softmax(scores, dim=-1)


def sink_weights_keeping_its_column(scores, sinks):
    column = sinks[:, None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)


def sink_weights_without_a_shift(scores, sinks):
    e = scores.exp()
    return e / (sinks[:, None, None].exp() + e.sum(-1, keepdim=True))


def sink_weights_with_sinks_over_the_queries(scores, sinks):
    top = torch.maximum(scores.amax(-1, keepdim=True), sinks[:, None])
    e = torch.exp(scores - top)
    return e / (torch.exp(sinks[:, None] - top) + e.sum(-1, keepdim=True))


ROWS = [
    Row(
        ch18.check_cache_bytes_per_token,
        my_cache_bytes_per_token,
        my_cache_bytes_per_token_stub,
        (
            (bytes_without_the_factor_two, "the factor 2 is missing"),
            (bytes_of_one_layer, "one layer's cache"),
            (bytes_with_mla_doubled, "counted twice"),
            (bytes_of_the_query_heads, "the query heads are counted"),
        ),
    ),
    Row(
        ch18.check_paged_gather,
        my_paged_gather,
        my_paged_gather_stub,
        (
            (gather_ignoring_the_table, "the block table is ignored"),
            (gather_whole_blocks, "partly filled"),
            (gather_with_a_flat_slot_without_s, "starts at slot b * s"),
        ),
    ),
    Row(
        ch18.check_softcap_attention,
        my_softcap_attention,
        my_softcap_attention_stub,
        (
            (softcap_after_the_mask, "the cap comes after the mask"),
            (softcap_after_the_softmax, "after the softmax"),
            (softcap_without_the_factor, "the factor c is missing"),
            (softcap_of_unscaled_scores, "unscaled scores"),
        ),
    ),
    Row(
        ch18.check_sink_weights,
        my_sink_weights,
        my_sink_weights_stub,
        (
            (sink_weights_ignoring_the_sink, "the sink is ignored"),
            (sink_weights_keeping_its_column, "column is kept"),
            (sink_weights_without_a_shift, "exp overflows"),
            (sink_weights_with_sinks_over_the_queries, "broadcast over the queries"),
        ),
    ),
]
