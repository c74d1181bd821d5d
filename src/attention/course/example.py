"""The course's running example: one sentence, embedded by a real model (chapters 1-8).

"The animal didn't cross the street because it was too tired": which word should "it"
attend to? Chapters 1-8 follow this one sentence. Its word pieces and vectors come
from all-MiniLM-L6-v2 (a small BERT-style encoder, hidden size 384, 6 layers, 12 heads
of size 32), loaded offline from safetensors by :func:`attention.load_minilm`:

- chapters 1-4 use the **token embeddings** (rows of the model's input embedding
  table: what a word piece is before any context or position) and the **query, key and
  value vectors** of one layer, computed by the model's own projections;
- chapters 5-8 use the same sentence for self-attention, heads and positions
  (the layer inputs ``hidden_states`` carry position and context).

The tokenizer adds two special tokens, ``[CLS]`` first and ``[SEP]`` last, and the
model attends to them like to any word piece: in layer 3, head 1 (the head chapters 1-4
follow) they hold about 55 % of each word's row of weights. ``special_tokens=True``
keeps them, so ``ex.qkv(layer)`` reproduces the model's own attention maps of the
sentence, which are also one call away:
``attention.trace_attention(ex.model, ex.tokenizer, ex.text).attentions``, shape
``(6, 12, 15, 15)``. With ``special_tokens=False`` (the default) they are dropped as
queries *and as keys*: a softmax over the 13 word pieces then renormalises every row
over the words alone, so its weights are larger than the model's (see
:meth:`RunningExample.qkv`).

``text`` swaps the sentence for another one, embedded the same way: the preface's
contrast, "... because it was too wide", where "it" means the street.

Shape legend: ``n`` tokens, ``embed_dim`` = 384, ``h`` = 12 heads, ``d`` = 32 per head,
``num_layers`` = 6. :class:`RunningExample` and :data:`RUNNING_SENTENCE` are importable
from ``attention.course.example``; only :func:`running_example` is re-exported by
``attention``.

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention`` (this module builds no masks;
the chapters build them for this sentence with :mod:`attention.foundations.masks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .._checks import check_int
from ..layers.multihead import split_heads
from ..practice.pretrained import load_minilm

__all__ = ["running_example"]

RUNNING_SENTENCE = "The animal didn't cross the street because it was too tired"


@dataclass(frozen=True)
class RunningExample:
    """One sentence as all-MiniLM-L6-v2 sees it.

    Attributes:
        text: the sentence.
        tokens: the ``n`` word pieces, lower-cased (``"didn't"`` is ``didn``, ``'``,
            ``t``); ``[CLS]`` first and ``[SEP]`` last only if ``special_tokens=True``.
        token_ids: ``(n,)`` vocabulary ids of ``tokens``.
        embeddings: ``(n, embed_dim)`` token embeddings: the rows of the model's input
            embedding table (``model.embeddings.word_embeddings``), with no position
            and no context. Float32, detached.
        hidden_states: ``(num_layers + 1, n, embed_dim)``: ``hidden_states[0]`` is the
            model's embedding output (token + position + segment, LayerNorm-ed),
            ``hidden_states[l]`` the input of layer ``l``. They come from one forward
            pass over the whole sentence *with* ``[CLS]`` and ``[SEP]``, as the model
            was trained; with ``special_tokens=False`` their rows are then dropped.
        model: the ``transformers`` ``BertModel`` (eager attention, ``eval()`` mode).
        tokenizer: its tokenizer.
    """

    text: str
    tokens: list[str]
    token_ids: Tensor
    embeddings: Tensor
    hidden_states: Tensor
    model: Any = field(repr=False, compare=False)
    tokenizer: Any = field(repr=False, compare=False)

    def index(self, token: str, occurrence: int = 0) -> int:
        """Position of the ``occurrence``-th (0-based) ``token`` in ``tokens``.

        Example: ``example.index("it")`` is 9 without special tokens, 10 with them.
        """
        occurrence = check_int("occurrence", occurrence, minimum=0)
        hits = [n for n, t in enumerate(self.tokens) if t == token]
        if len(hits) <= occurrence:
            raise ValueError(
                f"token {token!r} appears {len(hits)} time(s) in {self.tokens}, "
                f"so occurrence {occurrence} does not exist"
            )
        return hits[occurrence]

    def qkv(self, layer: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        r"""Layer ``layer``'s queries, keys and values, split into heads.

        :math:`Q = X W_Q^\top + b_Q`, :math:`K = X W_K^\top + b_K`,
        :math:`V = X W_V^\top + b_V` with :math:`X` = ``hidden_states[layer]`` and the
        model's own weights, each reshaped from ``(n, h d)`` to ``(h, n, d)``.

        With ``special_tokens=True``, ``softmax(Q K^T / sqrt(d))`` over the key axis is
        the model's own attention map of that layer. With ``special_tokens=False`` the
        rows and columns of ``[CLS]`` and ``[SEP]`` are missing: every query's scores
        are the model's, but its softmax runs over the 13 word pieces only, so every
        row is renormalised (divided by the weight the words held, about 45 % of the
        row on average in layer 3, head 1) and is *not* the model's map.

        Args:
            layer: which layer, ``0 <= layer < num_layers`` (6 for MiniLM).

        Returns:
            ``(q, k, v)``, each ``(h, n, d)`` = ``(12, n, 32)``, float32, detached.
        """
        num_layers = self.model.config.num_hidden_layers
        layer = check_int("layer", layer)
        if not 0 <= layer < num_layers:
            raise ValueError(f"layer must be in [0, {num_layers}), got {layer}")
        self_attn = self.model.encoder.layer[layer].attention.self
        x = self.hidden_states[layer]  # (n, embed_dim)
        h = self_attn.num_attention_heads
        with torch.no_grad():
            q, k, v = (
                split_heads(proj(x)[None], h)[0]  # (h, n, d)
                for proj in (self_attn.query, self_attn.key, self_attn.value)
            )
        return q, k, v


def running_example(
    model=None,
    tokenizer=None,
    *,
    special_tokens: bool = False,
    text: str = RUNNING_SENTENCE,
) -> RunningExample:
    """The running example's sentence as all-MiniLM-L6-v2 sees it (chapters 1-8).

    Tokenises the sentence (or ``text``) with all-MiniLM-L6-v2's tokenizer and reads
    its token embeddings and layer inputs from the model (see :class:`RunningExample`).
    Loading the model (offline, safetensors) takes a few seconds; pass ``model`` and
    ``tokenizer`` from :func:`attention.load_minilm` to reuse a loaded one.

    Args:
        model: a BERT-style encoder with eager attention, or None to load MiniLM.
        tokenizer: its tokenizer (required with ``model``; None when ``model`` is None).
        special_tokens: keep ``[CLS]`` and ``[SEP]`` as tokens (default False: the 13
            word pieces of the sentence only, and every softmax over them renormalised;
            see :meth:`RunningExample.qkv`).
        text: the sentence (default :data:`RUNNING_SENTENCE`); e.g. the preface's
            contrast with *wide* in place of *tired*.

    Returns:
        A :class:`RunningExample`: ``tokens`` (n), ``embeddings`` ``(n, 384)``,
        ``hidden_states`` ``(7, n, 384)``, and ``qkv(layer)`` giving three
        ``(12, n, 32)``.

    Raises:
        ImportError: ``transformers`` is not installed.
        ValueError: exactly one of ``model`` and ``tokenizer`` was given, or ``text``
            is empty.
        TypeError: ``special_tokens`` is not a bool.

    Example:
        >>> from attention.course.example import RUNNING_SENTENCE
        >>> RUNNING_SENTENCE.split()[7]
        'it'
        >>> ex = running_example()  # doctest: +SKIP
        >>> " ".join(ex.tokens)  # doctest: +SKIP
        "the animal didn ' t cross the street because it was too tired"
        >>> q, k, v = ex.qkv(layer=0)  # doctest: +SKIP
        >>> tuple(q.shape), tuple(ex.embeddings.shape)  # doctest: +SKIP
        ((12, 13, 32), (13, 384))
    """
    if (model is None) != (tokenizer is None):
        raise ValueError(
            "pass both model and tokenizer (e.g. from load_minilm()) or neither, got "
            f"model={'None' if model is None else type(model).__name__} and "
            f"tokenizer={'None' if tokenizer is None else type(tokenizer).__name__}"
        )
    if not isinstance(special_tokens, bool):
        raise TypeError(
            f"special_tokens must be a bool, got {type(special_tokens).__name__}"
        )
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty str, got {text!r}")
    if model is None or tokenizer is None:  # both or neither (checked above)
        model, tokenizer = load_minilm()
    encoded = tokenizer(text, return_tensors="pt")
    ids = encoded["input_ids"][0]  # (n + 2,) with [CLS] and [SEP]
    with torch.no_grad():
        out = model(**encoded, output_hidden_states=True)
        # (num_layers + 1, n + 2, embed_dim)
        hidden = torch.stack(out.hidden_states, dim=0)[:, 0]
        embeddings = model.embeddings.word_embeddings(ids)  # (n + 2, embed_dim)
    keep = slice(None) if special_tokens else slice(1, -1)
    ids = ids[keep]
    return RunningExample(
        text=text,
        tokens=list(tokenizer.convert_ids_to_tokens(ids.tolist())),
        token_ids=ids.clone(),
        embeddings=embeddings[keep].detach().clone(),
        hidden_states=hidden[:, keep].detach().clone(),
        model=model,
        tokenizer=tokenizer,
    )
