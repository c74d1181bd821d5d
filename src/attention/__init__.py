"""attention: the tested package behind the course "Attention, line by line".

Mask convention everywhere: boolean, True = may attend (as in
``torch.nn.functional.scaled_dot_product_attention``); float masks are added to scores.
Each module's docstring names the chapter that teaches it.
"""

from .masks import causal_mask, combine_masks, decoding_mask, padding_mask, to_additive_mask
from .notebook import setup_notebook
from .plotting import plot_attention, plot_heads, plot_mask, use_course_style
from .scaled_dot_product import attention_weights, scaled_dot_product_attention
from .softmax import entropy, log_softmax, logsumexp, softmax, softmax_jacobian, two_pass_softmax

__version__ = "0.1.0"
from .kv_cache import KVCache, kv_cache_bytes_per_token  # noqa: E402
from .multihead import MultiHeadAttention, merge_heads, repeat_kv, split_heads  # noqa: E402
from .scoring import (  # noqa: E402  (chapter 08)
    ACTIVATIONS, AdditiveAttention, AdditiveScore, GeneralScore, additive_hidden, additive_scores,
    cosine_scores, dot_scores, general_scores, get_activation, scaled_dot_scores,
)
from .alignment import (  # noqa: E402  (chapter 08)
    LocalAlignment, MultiDimensionalAttention, hard_alignment, hard_attention, local_alignment,
    local_centre, local_window, multidimensional_attention, multidimensional_scores,
    multidimensional_weights, soft_alignment, soft_attention,
)
from .masks import (  # noqa: E402  (chapter 10: sparse patterns)
    bigbird_mask,
    block_sparse_mask,
    dilated_mask,
    global_tokens_mask,
    sliding_window_mask,
)
from .sparse import (  # noqa: E402
    block_sparse_attention,
    local_global_layout,
    sliding_window_attention,
)
from .linear import (  # noqa: E402  (chapter 09)
    elu_feature_map,
    linear_attention,
    linear_attention_naive,
    linear_attention_step,
    linear_attention_weights,
    performer_feature_map,
    random_feature_map,
    relu_feature_map,
)
from .tiled import online_softmax, online_softmax_blocked, tiled_attention  # noqa: E402  (chapter 11)
from .self_attention import SelfAttention  # noqa: E402  (chapter 05)
from .cross_attention import CrossAttention  # noqa: E402  (chapter 07)
from .seq2seq import TinySeq2Seq, encoder_decoder_masks, greedy_decode, reversal_batch, train_seq2seq  # noqa: E402,E501  (chapter 07)
from .pretrained import (  # noqa: E402  chapter 12; transformers is imported lazily inside
    AttentionTrace, attention_share, head_distances, head_diversity, load_minilm,
    mean_attention_entropy, minilm_attention_layer, minilm_attention_weights, minilm_model_dir,
    sink_share, token_position, top_heads, trace_attention,
)
from .approximate import (  # noqa: E402  (chapter 10: LSH and Linformer)
    linformer_attention,
    linformer_projection,
    lsh_attention,
    lsh_buckets,
)
