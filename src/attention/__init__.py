"""attention: the tested package behind the course "Attention, line by line".

Mask convention everywhere: boolean, True = may attend, broadcastable to ``(b, h, i, j)``
(as in ``torch.nn.functional.scaled_dot_product_attention``); float masks are added to
the scores. Each module's docstring names the chapter that teaches it; the imports below
follow the reading order. ``attention.pretrained`` imports transformers only when called.
"""

from .alignment import (  # chapter 09
    LocalAlignment,
    MultiDimensionalAttention,
    hard_alignment,
    hard_attention,
    local_alignment,
    local_centre,
    local_window,
    multidimensional_attention,
    multidimensional_scores,
    multidimensional_weights,
    soft_alignment,
    soft_attention,
)
from .approximate import linformer_attention, lsh_attention  # chapter 11
from .cross_attention import CrossAttention  # chapter 08
from .feature_maps import random_feature_map  # chapter 10
from .head_stats import (  # chapter 15
    attention_share,
    head_diversity,
    mean_attention_entropy,
    sink_share,
)
from .kv_cache import KVCache, kv_cache_bytes_per_token  # chapter 06
from .linear import linear_attention, linear_attention_step, linear_attention_weights  # chapter 10
from .masks import (  # chapter 04
    causal_mask,
    combine_masks,
    decoding_mask,
    padding_mask,
    to_additive_mask,
)
from .multihead import MultiHeadAttention, merge_heads, repeat_kv, split_heads  # chapter 06
from .notebook import load_benchmark, report_close, setup_notebook
from .patterns import (  # chapter 11
    bigbird_mask,
    block_sparse_mask,
    dilated_mask,
    global_tokens_mask,
    local_global_layout,
    sliding_window_mask,
)
from .plotting import plot_attention, plot_heads, plot_mask, use_course_style
from .pretrained import (  # chapter 15
    load_minilm,
    minilm_attention_layer,
    minilm_attention_weights,
    trace_attention,
)
from .scaled_dot_product import attention_weights, scaled_dot_product_attention  # chapter 01-04
from .scoring import (  # chapter 09
    ACTIVATIONS,
    AdditiveAttention,
    AdditiveScore,
    GeneralScore,
    additive_hidden,
    additive_scores,
    cosine_scores,
    dot_scores,
    general_scores,
    get_activation,
    scaled_dot_scores,
)
from .self_attention import SelfAttention  # chapter 05
from .seq2seq import (  # chapter 08
    TinySeq2Seq,
    encoder_decoder_masks,
    greedy_decode,
    reversal_batch,
    train_seq2seq,
)
from .softmax import (  # chapter 02
    entropy,
    log_softmax,
    logsumexp,
    softmax,
    softmax_jacobian,
    two_pass_softmax,
)
from .sparse import block_sparse_attention, sliding_window_attention  # chapter 11
from .tiled import online_softmax, online_softmax_blocked, tiled_attention  # chapter 12

__version__ = "0.1.0"

__all__ = [
    "entropy",
    "log_softmax",
    "logsumexp",
    "softmax",
    "softmax_jacobian",
    "two_pass_softmax",
    "attention_weights",
    "scaled_dot_product_attention",
    "bigbird_mask",
    "block_sparse_mask",
    "causal_mask",
    "combine_masks",
    "decoding_mask",
    "dilated_mask",
    "global_tokens_mask",
    "padding_mask",
    "sliding_window_mask",
    "to_additive_mask",
    "setup_notebook",
    "report_close",
    "load_benchmark",
    "plot_attention",
    "plot_heads",
    "plot_mask",
    "use_course_style",
    "SelfAttention",
    "merge_heads",
    "MultiHeadAttention",
    "repeat_kv",
    "split_heads",
    "kv_cache_bytes_per_token",
    "KVCache",
    "CrossAttention",
    "encoder_decoder_masks",
    "greedy_decode",
    "reversal_batch",
    "TinySeq2Seq",
    "train_seq2seq",
    "ACTIVATIONS",
    "additive_hidden",
    "additive_scores",
    "AdditiveAttention",
    "AdditiveScore",
    "cosine_scores",
    "dot_scores",
    "general_scores",
    "GeneralScore",
    "get_activation",
    "scaled_dot_scores",
    "hard_alignment",
    "hard_attention",
    "local_alignment",
    "local_centre",
    "local_window",
    "LocalAlignment",
    "multidimensional_attention",
    "multidimensional_scores",
    "multidimensional_weights",
    "MultiDimensionalAttention",
    "soft_alignment",
    "soft_attention",
    "linear_attention",
    "linear_attention_step",
    "linear_attention_weights",
    "random_feature_map",
    "block_sparse_attention",
    "local_global_layout",
    "sliding_window_attention",
    "linformer_attention",
    "lsh_attention",
    "online_softmax",
    "online_softmax_blocked",
    "tiled_attention",
    "attention_share",
    "head_diversity",
    "load_minilm",
    "mean_attention_entropy",
    "minilm_attention_layer",
    "minilm_attention_weights",
    "sink_share",
    "trace_attention",
]
