"""attention: the tested package behind the course "Attention, line by line".

Mask convention everywhere: boolean, True = may attend, broadcastable to
``(b, h, i, j)`` (as in ``torch.nn.functional.scaled_dot_product_attention``); float
masks are added to the scores.

The package is laid out like the book: ``foundations`` (chapters 1-4), ``layers``
(5-9), ``efficient`` (10-16), ``practice`` (17-18), ``reading`` (19-20), and ``course``
(what every chapter uses: set-up, checks, figures, diagrams, the running example);
``exercises`` holds the checkers of the chapters' exercises. The shared, unchecked cores
sit at the root (``_checks``, ``_core``, ``_cache``, ``_rope``).

This facade is the library: the functions and modules a reader would call in their own
code, imported here by name and listed in ``__all__`` in reading order. A chapter's
teaching helpers (``attention.foundations.softmax.softmax_jacobian``, the score
functions of ``attention.layers.scoring`` ...) are public in their module's ``__all__``
and imported from their module. ``tests/test_facade.py`` holds both rules.
"""

# ruff: noqa: I001  (the imports follow the reading order, not the alphabet)

# What every chapter uses
from .course.notebook import (
    setup_notebook,
    report_close,
    load_benchmark,
    benchmark_machine,
)
from .course.plotting import (
    use_course_style,
    plot_attention,
    plot_heads,
    plot_mask,
    plot_grid,
)
from .course.example import running_example

# Foundations, chapters 1-4
from .foundations.softmax import softmax, log_softmax, logsumexp, entropy
from .foundations.scaled_dot_product import (
    attention_weights,
    scaled_dot_product_attention,
)
from .foundations.masks import (
    causal_mask,
    padding_mask,
    block_diagonal_mask,
    combine_masks,
)

# Attention layers, chapters 5-9
from .layers.self_attention import SelfAttention
from .layers.multihead import MultiHeadAttention, split_heads, merge_heads
from .layers.kv_cache import KVCache
from .layers.positional import (
    sinusoidal_positions,
    rope_frequencies,
    apply_rope,
    RotaryConfig,
    alibi_slopes,
    alibi_bias,
    relative_position_bucket,
    nope_temperature,
    temperature_tuned_attention,
)
from .layers.dual_chunk import dual_chunk_positions, dual_chunk_attention
from .layers.cross_attention import CrossAttention
from .layers.scoring import GeneralScore, AdditiveScore
from .layers.alignment import hard_attention, LocalAlignment
from .layers.additive import AdditiveAttention, MultiDimensionalAttention

# Efficient attention, chapters 10-16
from .efficient.feature_maps import random_feature_map
from .efficient.linear import (
    linear_attention,
    linear_attention_weights,
    linear_attention_step,
    lightning_attention,
)
from .efficient.delta_rule import (
    delta_rule_attention,
    gated_delta_rule_attention,
    kimi_delta_attention,
)
from .efficient.gated_deltanet import GatedDeltaNet
from .efficient.neural_memory import NeuralMemory
from .efficient.mqar import mqar_batch
from .efficient.patterns import (
    sliding_window_mask,
    dilated_mask,
    global_tokens_mask,
    bigbird_mask,
    block_sparse_mask,
    local_global_layout,
)
from .efficient.sparse import sliding_window_attention, block_sparse_attention
from .efficient.approximate import lsh_attention, linformer_attention
from .efficient.learned_sparse import (
    native_sparse_attention,
    moba_attention,
    lightning_index_scores,
    lightning_indexer,
    deepseek_sparse_attention,
    selection_mask,
    SelectionStats,
    selection_stats,
)
from .efficient.tiled import online_softmax, tiled_attention
from .efficient.distributed import (
    ring_attention,
    run_distributed,
    shard_sequence,
    unshard_sequence,
)

# In practice, chapters 17-18
from .practice.pretrained import (
    load_minilm,
    trace_attention,
    minilm_attention_weights,
    minilm_attention_layer,
)
from .practice.head_stats import (
    mean_attention_entropy,
    attention_share,
    sink_share,
    head_diversity,
)
from .practice.sinks import (
    attention_with_sinks,
    sink_attention_weights,
    StreamingKVCache,
)
from .practice.latent import LatentKVCache, MultiHeadLatentAttention
from .practice.paged import PagedKVCache
from .practice.logits import soft_cap, qk_norm

# Reading attention and beyond softmax, chapters 19-20
from .reading.circuits import (
    qk_circuit,
    ov_circuit,
    copying_score,
    previous_token_score,
    induction_score,
    prefix_matching_score,
    AttentionOnlyTransformer,
)
from .reading.weights import (
    sparsemax,
    entmax15,
    sigmoid_attention,
    differential_attention,
    differential_lambda_init,
    DifferentialAttention,
    RefinedSelfAttention,
)

__version__ = "0.1.0"

__all__ = [
    # What every chapter uses
    "setup_notebook",
    "report_close",
    "load_benchmark",
    "benchmark_machine",
    "use_course_style",
    "plot_attention",
    "plot_heads",
    "plot_mask",
    "plot_grid",
    "running_example",
    # Foundations, chapters 1-4
    "softmax",
    "log_softmax",
    "logsumexp",
    "entropy",
    "attention_weights",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "block_diagonal_mask",
    "combine_masks",
    # Attention layers, chapters 5-9
    "SelfAttention",
    "MultiHeadAttention",
    "split_heads",
    "merge_heads",
    "KVCache",
    "sinusoidal_positions",
    "rope_frequencies",
    "apply_rope",
    "RotaryConfig",
    "alibi_slopes",
    "alibi_bias",
    "relative_position_bucket",
    "nope_temperature",
    "temperature_tuned_attention",
    "dual_chunk_positions",
    "dual_chunk_attention",
    "CrossAttention",
    "GeneralScore",
    "AdditiveScore",
    "hard_attention",
    "LocalAlignment",
    "AdditiveAttention",
    "MultiDimensionalAttention",
    # Efficient attention, chapters 10-16
    "random_feature_map",
    "linear_attention",
    "linear_attention_weights",
    "linear_attention_step",
    "lightning_attention",
    "delta_rule_attention",
    "gated_delta_rule_attention",
    "kimi_delta_attention",
    "GatedDeltaNet",
    "NeuralMemory",
    "mqar_batch",
    "sliding_window_mask",
    "dilated_mask",
    "global_tokens_mask",
    "bigbird_mask",
    "block_sparse_mask",
    "local_global_layout",
    "sliding_window_attention",
    "block_sparse_attention",
    "lsh_attention",
    "linformer_attention",
    "native_sparse_attention",
    "moba_attention",
    "lightning_index_scores",
    "lightning_indexer",
    "deepseek_sparse_attention",
    "selection_mask",
    "SelectionStats",
    "selection_stats",
    "online_softmax",
    "tiled_attention",
    "ring_attention",
    "run_distributed",
    "shard_sequence",
    "unshard_sequence",
    # In practice, chapters 17-18
    "load_minilm",
    "trace_attention",
    "minilm_attention_weights",
    "minilm_attention_layer",
    "mean_attention_entropy",
    "attention_share",
    "sink_share",
    "head_diversity",
    "attention_with_sinks",
    "sink_attention_weights",
    "StreamingKVCache",
    "LatentKVCache",
    "MultiHeadLatentAttention",
    "PagedKVCache",
    "soft_cap",
    "qk_norm",
    # Reading attention and beyond softmax, chapters 19-20
    "qk_circuit",
    "ov_circuit",
    "copying_score",
    "previous_token_score",
    "induction_score",
    "prefix_matching_score",
    "AttentionOnlyTransformer",
    "sparsemax",
    "entmax15",
    "sigmoid_attention",
    "differential_attention",
    "differential_lambda_init",
    "DifferentialAttention",
    "RefinedSelfAttention",
]
