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
from .approximate import (  # chapter 11
    linformer_attention,
    linformer_projection,
    lsh_attention,
    lsh_buckets,
)
from .cross_attention import CrossAttention  # chapter 08
from .dual_chunk import dual_chunk_attention, dual_chunk_positions  # chapter 07
from .kv_cache import KVCache, kv_cache_bytes_per_token  # chapter 06
from .latent import LatentKVCache, MultiHeadLatentAttention  # chapter 14
from .linear import (  # chapter 10
    elu_feature_map,
    linear_attention,
    linear_attention_naive,
    linear_attention_step,
    linear_attention_weights,
    performer_feature_map,
    random_feature_map,
    relu_feature_map,
)
from .logits import qk_norm, soft_cap, softcap_attention  # chapter 14
from .masks import (  # chapter 04, 11
    bigbird_mask,
    block_sparse_mask,
    causal_mask,
    combine_masks,
    decoding_mask,
    dilated_mask,
    global_tokens_mask,
    padding_mask,
    sliding_window_mask,
    to_additive_mask,
)
from .multihead import MultiHeadAttention, merge_heads, repeat_kv, split_heads  # chapter 06
from .notebook import load_benchmark, report_close, setup_notebook
from .paged import PagedKVCache  # chapter 14
from .plotting import plot_attention, plot_heads, plot_mask, use_course_style
from .positional import (  # chapter 07
    alibi_bias,
    alibi_slopes,
    apply_rope,
    relative_position_bucket,
    rope_frequencies,
    sinusoidal_positions,
)
from .pretrained import (  # chapter 15
    AttentionTrace,
    attention_share,
    head_distances,
    head_diversity,
    load_minilm,
    mean_attention_entropy,
    minilm_attention_layer,
    minilm_attention_weights,
    minilm_model_dir,
    sink_share,
    token_position,
    top_heads,
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
from .sinks import (  # chapter 14
    StreamingKVCache,
    attention_with_sinks,
    sink_attention_weights,
    streaming_mask,
)
from .softmax import (  # chapter 02
    entropy,
    log_softmax,
    logsumexp,
    softmax,
    softmax_jacobian,
    two_pass_softmax,
)
from .sparse import (  # chapter 11
    block_sparse_attention,
    local_global_layout,
    sliding_window_attention,
)
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
    "elu_feature_map",
    "linear_attention",
    "linear_attention_naive",
    "linear_attention_step",
    "linear_attention_weights",
    "performer_feature_map",
    "random_feature_map",
    "relu_feature_map",
    "block_sparse_attention",
    "local_global_layout",
    "sliding_window_attention",
    "linformer_attention",
    "linformer_projection",
    "lsh_attention",
    "lsh_buckets",
    "online_softmax",
    "online_softmax_blocked",
    "tiled_attention",
    "attention_share",
    "AttentionTrace",
    "head_distances",
    "head_diversity",
    "load_minilm",
    "mean_attention_entropy",
    "minilm_attention_layer",
    "minilm_attention_weights",
    "minilm_model_dir",
    "sink_share",
    "token_position",
    "top_heads",
    "trace_attention",
    "attention_with_sinks",
    "sink_attention_weights",
    "streaming_mask",
    "StreamingKVCache",
    "LatentKVCache",
    "MultiHeadLatentAttention",
    "PagedKVCache",
    "qk_norm",
    "soft_cap",
    "softcap_attention",
]
__all__ += [  # chapter 07
    "sinusoidal_positions",
    "rope_frequencies",
    "apply_rope",
    "alibi_slopes",
    "alibi_bias",
    "relative_position_bucket",
    "dual_chunk_positions",
    "dual_chunk_attention",
]
