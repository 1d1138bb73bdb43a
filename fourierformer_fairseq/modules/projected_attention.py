"""``ProjectedMultiheadAttention``: fairseq's ``MultiheadAttention`` whose attention a subclass computes.

The base holds the whole ``forward`` of fairseq's contract (the template); an attention kind
(``FourierMultiheadAttention``, ``PerformerMultiheadAttention``, ``GlobalFilterMixer``) writes one
method, ``attend``, declares what it supports, and adds its options to the constructor:

    forward(query, key, value, key_padding_mask, incremental_state, need_weights, static_kv,
            attn_mask, before_softmax, need_head_weights, *, causal=None)
      -> projections (the inherited ``q_proj``, ``k_proj``, ``v_proj``; beamable encoder-decoder
         attention keeps one copy of the keys), ``bias_k`` / ``bias_v``, heads split to
         (batch, heads, time, head_dim), ``prepare_queries_keys`` (a kind's per-position step,
         before the cache), the incremental cache, ``add_zero_attn``, masks made bool
      -> ``attend(q, k, v, key_padding_mask=, attn_mask=, causal=, need_weights=)``
         returning (out (batch, heads, tgt_len, head_dim), weights (batch, heads, tgt_len, src_len) or None)
      -> ``out_proj`` and the weights in the stock layout (averaged over heads unless need_head_weights).

Causality is said, not guessed: the decoder layer builds its self-attention with ``causal=True``
and its decoder passes no future mask (models/attention_transformer.py). ``attend`` then gets
``causal=True`` (queries aligned to the last keys) and any ``attn_mask`` given is a mask like any
other, applied as given. One call can say otherwise with forward's ``causal`` argument (the decoder
passes False for fairseq's ``full_context_alignment``).

The incremental cache is the stock one (``prev_key`` / ``prev_value`` of shape (batch, heads, seq,
head_dim), through the inherited ``_get_input_buffer`` / ``_set_input_buffer`` /
``_append_prev_key_padding_mask``, so ``reorder_incremental_state`` reorders it for beam search), beside which a kind may keep a table
of the cached keys (``cache_key_table``: the Fourier kind's CPU key table), which holds the growing
keys of self-attention itself (``prev_key`` its view, extended a step at a time), unless the kind keeps a state of its own for causal self-attention (``own_incremental_state``:
then ``attend_step(q, k, v, key_padding_mask, saved_state)`` computes the step from, and updates,
the saved state).

What a kind supports it declares as class attributes, checked here with one message each
(``supports_attn_mask``, ``supports_bias_kv``, ``supports_need_weights``, ``supports_before_softmax``),
and the projections it uses (``uses_queries_keys``: a kind that reads only the values has no
``q_proj`` / ``k_proj``).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq.modules.multihead_attention import MultiheadAttention

from fourierformer_fairseq.ops.inputs import causal_bias


class ProjectedMultiheadAttention(MultiheadAttention):
    """fairseq's ``MultiheadAttention`` constructor, projections and forward; ``attend`` in a subclass.

    Args beyond fairseq's ``MultiheadAttention``:
        causal: the module is causal (decoder) self-attention: set by the decoder layer that builds it.
        max_positions: the longest sequence the module will see (the model's max source / target
            positions; set by the layer, used by kinds whose parameters depend on it).
    """

    #: an ``attn_mask`` other than None can be applied
    supports_attn_mask: bool = True
    #: ``add_bias_kv`` / ``add_zero_attn``
    supports_bias_kv: bool = True
    #: ``need_weights`` / ``need_head_weights`` give the attention weights
    supports_need_weights: bool = True
    #: ``before_softmax=True`` (``scores_before_softmax``)
    supports_before_softmax: bool = False
    #: the kind reads queries and keys (False: no q_proj / k_proj; ``attend`` gets q = k = None)
    uses_queries_keys: bool = True
    #: causal self-attention in incremental decoding runs ``attend_step`` on a state of the kind's own
    own_incremental_state: bool = False

    def __init__(
        self,
        embed_dim,
        num_heads,
        kdim=None,
        vdim=None,
        dropout=0.0,
        bias=True,
        add_bias_kv=False,
        add_zero_attn=False,
        self_attention=False,
        encoder_decoder_attention=False,
        dictionary=None,
        q_noise=0.0,
        qn_block_size=8,
        xformers_att_config: Optional[str] = None,
        xformers_blocksparse_layout: Optional[torch.Tensor] = None,
        xformers_blocksparse_blocksize: Optional[int] = 16,
        causal: bool = False,
        max_positions: Optional[int] = None,
    ):
        name = type(self).__name__
        if xformers_att_config is not None:
            raise ValueError(
                f"{name} computes its own attention and cannot use xFormers "
                "(got xformers_att_config); drop --encoder/--decoder-xformers-att-config"
            )
        if (add_bias_kv or add_zero_attn) and not self.supports_bias_kv:
            raise ValueError(f"{name} does not support add_bias_kv / add_zero_attn")
        super().__init__(
            embed_dim,
            num_heads,
            kdim=kdim,
            vdim=vdim,
            dropout=dropout,
            bias=bias,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=self_attention,
            encoder_decoder_attention=encoder_decoder_attention,
            dictionary=dictionary,
            q_noise=q_noise,
            qn_block_size=qn_block_size,
        )
        self.causal = bool(causal)
        self.max_positions = None if max_positions is None else int(max_positions)
        if not self.uses_queries_keys:
            self.q_proj = None
            self.k_proj = None

    # ------------------------------------------------------------------ what a kind writes

    def attend(
        self,
        q: Optional[Tensor],
        k: Optional[Tensor],
        v: Tensor,
        *,
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        causal: bool,
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The attention of (batch, heads, time, head_dim) inputs: (out, weights or None).

        key_padding_mask: bool (kv_batch, src_len), True = padded; attn_mask: None, bool (True =
        masked) or additive float, (tgt_len, src_len) or per batch and head; causal: key j is
        masked for query i when j > i + src_len - tgt_len. q may have a multiple of the keys'
        batch (beamable encoder-decoder attention folds the beam into the query positions).
        """
        raise NotImplementedError

    def prepare_queries_keys(self, q: Optional[Tensor], k: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """Per-position work on q and k (batch, heads, time, head_dim) before the cache; none by default."""
        return q, k

    def cache_key_table(
        self,
        saved_state: Dict[str, Optional[Tensor]],
        prev_key: Optional[Tensor],
        k: Optional[Tensor],
        static_kv: bool,
    ) -> Optional[Tensor]:
        """In incremental decoding: a table of the cached keys, prev_key (batch, heads, seq,
        head_dim: the keys cached before this call; None at the first) followed by k (this call's
        keys; None for static keys read from the cache), that the kind keeps in saved_state as
        ``prev_key_table`` and ``attend`` then gets as ``key_table=``; None (the default): the kind
        keeps none and ``attend`` gets no such argument. For keys that grow (self-attention) the
        table is the keys' cache: ``prev_key`` is stored as ``key_table_keys(table, seq)``, a view
        of it, so that one copy of the keys is extended a step at a time and reordered with the
        beams (``reorder_incremental_state``)."""
        return None

    def key_table_keys(self, table: Tensor, count: int) -> Tensor:
        """The first ``count`` keys (batch, heads, count, head_dim) of a table of ``cache_key_table``: a view."""
        raise NotImplementedError

    def attend_step(self, q, k, v, key_padding_mask, saved_state: Dict[str, Optional[Tensor]]) -> Tensor:
        """With ``own_incremental_state``: causal self-attention of the new positions over the saved state."""
        raise NotImplementedError

    def scores_before_softmax(self, q, k, v, *, key_padding_mask, attn_mask, causal) -> Tuple[Tensor, Tensor]:
        """With ``supports_before_softmax``: (scores (batch * heads, tgt, src), values (batch * heads, src, head_dim))."""
        raise NotImplementedError

    def attention_dropout_p(self) -> float:
        """The attention dropout to apply now (fairseq's FairseqDropout rule)."""
        return self.dropout_module.p if (self.training or self.dropout_module.apply_during_inference) else 0.0

    # ------------------------------------------------------------------ the template

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
        *,
        causal: Optional[bool] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Input shape: Time x Batch x Channel; the contract of ``MultiheadAttention.forward``.

        causal: whether this call is causal; None (fairseq's layers pass nothing): as the module was
        built (``self.causal``). The decoder passes False for fairseq's ``full_context_alignment``.

        Returns ``(attn, attn_weights)``: attn (tgt_len, batch, embed_dim); attn_weights None
        unless need_weights: (batch, tgt_len, src_len) averaged over heads, or
        (heads, batch, tgt_len, src_len) with need_head_weights. ``before_softmax=True`` returns
        the kind's scores (batch * heads, tgt_len, src_len) and the values instead.
        """
        name = type(self).__name__
        if need_head_weights:
            need_weights = True
        if before_softmax and not self.supports_before_softmax:
            raise ValueError(f"{name} has no scores before a softmax (before_softmax=True)")
        if need_weights and not self.supports_need_weights:
            raise ValueError(
                f"{name} forms no attention weights: call it with need_weights=False (and need_head_weights=False)"
            )
        if attn_mask is not None and not self.supports_attn_mask:
            raise ValueError(
                f"{name} takes attn_mask=None (build it with causal=True for causal self-attention); "
                "it cannot apply other masks"
            )
        tgt_len, bsz, embed_dim = query.size()
        if not self.skip_embed_dim_check:
            assert embed_dim == self.embed_dim, f"query dim {embed_dim} != {self.embed_dim}"
        if key is not None:
            assert value is not None
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None  # fairseq's fork/join placeholder for "no mask"

        saved_state: Optional[Dict[str, Optional[Tensor]]] = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if "prev_key" in saved_state and static_kv:
                # encoder-decoder attention after the first step: keys/values come from the cache
                assert self.encoder_decoder_attention and not self.self_attention
                key = value = None

        q, k, v, key_padding_mask = self._project(query, key, value, key_padding_mask, bsz)
        causal = self.causal if causal is None else bool(causal)
        if causal and (self.bias_k is not None or self.add_zero_attn):
            # the bias and zero keys go after the last key and every query sees them: causality becomes
            # a mask before they are added (incremental steps see every key, as stock decoders ask)
            if saved_state is None:
                attn_mask = _with_causal_mask(attn_mask, tgt_len, tgt_len if k is None else k.size(0), query.device)
            causal = False
        if self.bias_k is not None and k is not None:
            # (with static cached keys, k is None and the bias column is already in the cache)
            assert self.bias_v is not None and v is not None
            k, v, key_padding_mask, attn_mask = self._add_bias(
                k, v, key_padding_mask=key_padding_mask, attn_mask=attn_mask, bsz=bsz
            )

        kv_bsz = bsz if v is None else v.size(1)
        q = None if q is None else self._split_heads(q)
        k = None if k is None else self._split_heads(k)
        q, k = self.prepare_queries_keys(q, k)
        v = None if v is None else self._split_heads(v)

        if saved_state is not None and self.own_incremental_state and self.self_attention:
            assert v is not None
            out = self.attend_step(q, k, v, _as_bool(key_padding_mask), saved_state)
            self._set_input_buffer(incremental_state, saved_state)
            return self._output(out, tgt_len, bsz), None
        key_table: Optional[Tensor] = None
        if saved_state is not None:
            k, v, key_padding_mask, kv_bsz, key_table = self._cache_keys_values(
                saved_state, incremental_state, k, v, key_padding_mask, kv_bsz, static_kv
            )
        assert v is not None
        src_len = v.size(2)
        if key_padding_mask is not None:
            assert key_padding_mask.size(0) == kv_bsz and key_padding_mask.size(1) == src_len
        if attn_mask is not None and not (attn_mask.is_floating_point() or attn_mask.dtype == torch.bool):
            attn_mask = attn_mask != 0  # byte masks: nonzero = masked
        if self.add_zero_attn:
            k, v, key_padding_mask, attn_mask = self._append_zero_attn(
                k=k, v=v, key_padding_mask=key_padding_mask, attn_mask=attn_mask
            )
        key_padding_mask = _as_bool(key_padding_mask)  # the cache keeps float 0/1 masks

        if before_softmax:
            return self.scores_before_softmax(q, k, v, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                              causal=causal)
        beam = bsz // kv_bsz
        if beam != 1:
            # beamable enc-dec attention: the beam_size queries of each sentence share its keys
            q, attn_mask = self._fold_beam(q, attn_mask, kv_bsz, beam)
        extra = {} if key_table is None else {"key_table": key_table}
        out, weights = self.attend(q, k, v, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                   causal=causal, need_weights=need_weights, **extra)
        if beam != 1:
            out = self._unfold_beam(out, kv_bsz, beam)
            weights = None if weights is None else self._unfold_beam(weights, kv_bsz, beam)

        attn = self._output(out, tgt_len, bsz)
        attn_weights: Optional[Tensor] = None
        if need_weights and weights is not None:
            attn_weights = weights.transpose(0, 1)  # (heads, batch, tgt, src), as stock returns them
            if not need_head_weights:
                attn_weights = attn_weights.mean(dim=0)
        return attn, attn_weights

    # ------------------------------------------------------------------ the template's steps

    def _project(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        bsz: int,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """q, k, v in (time, batch, channels), as the stock forward projects them."""
        q = None if self.q_proj is None else self.q_proj(query)
        k_proj = self.k_proj if self.k_proj is not None else (lambda x: None)
        if self.self_attention:
            return q, k_proj(query), self.v_proj(query), key_padding_mask
        if self.encoder_decoder_attention:
            if key is None:  # static keys already cached
                assert value is None
                return q, None, None, key_padding_mask
            if self.beam_size > 1 and bsz == key.size(1):
                # beamable enc-dec attention: the encoder output is repeated beam_size times; keep one copy
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0, :]
            return q, k_proj(key), self.v_proj(key), key_padding_mask
        assert key is not None and value is not None
        return q, k_proj(key), self.v_proj(value), key_padding_mask

    def _split_heads(self, x: Tensor) -> Tensor:
        """(time, batch, heads * head_dim) -> (batch, heads, time, head_dim)."""
        return x.contiguous().view(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _output(self, out: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """(batch, heads, time, head_dim) -> out_proj of (time, batch, heads * head_dim)."""
        attn = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.num_heads * self.head_dim)
        return self.out_proj(attn)

    def _cache_keys_values(
        self,
        saved_state: Dict[str, Optional[Tensor]],
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
        k: Optional[Tensor],
        v: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        kv_bsz: int,
        static_kv: bool,
    ) -> Tuple[Tensor, Tensor, Optional[Tensor], int, Optional[Tensor]]:
        """The stock cache: k, v (batch, heads, seq, head_dim) after the cached ones; stores them,
        with the kind's key table (``cache_key_table``) where it keeps one.

        Returns k, v, the key padding mask over all cached keys (as the stock cache keeps it), the
        keys' batch size and the key table (None if none).
        """
        prev_key = saved_state.get("prev_key")
        if prev_key is not None:
            kv_bsz = prev_key.size(0)
            prev_key = prev_key.reshape(kv_bsz, self.num_heads, -1, self.head_dim)
        # (no table with add_zero_attn: the zero key would join k after it)
        table = None if self.add_zero_attn else self.cache_key_table(saved_state, prev_key, k, static_kv)
        if static_kv and prev_key is not None:
            k = prev_key
        elif table is not None and not static_kv:  # the table holds the keys: k is its view
            assert k is not None
            k = self.key_table_keys(table, (0 if prev_key is None else prev_key.size(2)) + k.size(2))
        elif prev_key is not None:
            k = torch.cat([prev_key, k], dim=2)
        if table is None:
            saved_state.pop("prev_key_table", None)
        else:
            saved_state["prev_key_table"] = table
        if "prev_value" in saved_state:
            prev_value = saved_state["prev_value"]
            assert prev_value is not None and prev_value.size(0) == kv_bsz
            prev_value = prev_value.reshape(kv_bsz, self.num_heads, -1, self.head_dim)
            v = prev_value if static_kv else torch.cat([prev_value, v], dim=2)
        assert k is not None and v is not None
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
            batch_size=kv_bsz,
            src_len=k.size(2),
            static_kv=static_kv,
        )
        # kept contiguous: the heads' split is a view, which every later step would otherwise copy
        # (static encoder-decoder keys: at every step; a concatenation is contiguous already); keys
        # that the table holds stay its view
        if table is None or static_kv:
            k = k.contiguous()
        v = v.contiguous()
        saved_state["prev_key"] = k
        saved_state["prev_value"] = v
        saved_state["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask, kv_bsz, table

    def reorder_incremental_state(
        self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor
    ) -> Dict[str, Dict[str, Optional[Tensor]]]:
        """fairseq's reorder of the cache for beam search; keys that a key table holds (growing
        keys: ``cache_key_table``) are reordered once, with the table, and taken again as its view."""
        saved_state = self._get_input_buffer(incremental_state)
        table, keys = saved_state.get("prev_key_table"), saved_state.get("prev_key")
        if table is None or keys is None or self.encoder_decoder_attention:
            return super().reorder_incremental_state(incremental_state, new_order)
        del saved_state["prev_key"]
        incremental_state = super().reorder_incremental_state(incremental_state, new_order)
        saved_state = self._get_input_buffer(incremental_state)
        table = saved_state["prev_key_table"]
        assert table is not None
        saved_state["prev_key"] = self.key_table_keys(table, keys.size(2))
        return self._set_input_buffer(incremental_state, saved_state)

    @staticmethod
    def _fold_beam(q: Tensor, attn_mask: Optional[Tensor], kv_bsz: int, beam: int):
        """(kv_bsz * beam, H, N, D) -> (kv_bsz, H, beam * N, D); a 2-D mask is tiled to match."""
        _, H, N, D = q.shape
        q = q.view(kv_bsz, beam, H, N, D).transpose(1, 2).reshape(kv_bsz, H, beam * N, D)
        if attn_mask is not None:
            if attn_mask.dim() != 2:
                raise ValueError(
                    "beamable encoder-decoder attention takes a 2-D (tgt_len, src_len) attn_mask, "
                    f"got shape {tuple(attn_mask.shape)}"
                )
            attn_mask = attn_mask.repeat(beam, 1)
        return q, attn_mask

    @staticmethod
    def _unfold_beam(x: Tensor, kv_bsz: int, beam: int) -> Tensor:
        """(kv_bsz, H, beam * N, X) -> (kv_bsz * beam, H, N, X)."""
        _, H, BN, X = x.shape
        return x.view(kv_bsz, H, beam, BN // beam, X).transpose(1, 2).reshape(kv_bsz * beam, H, BN // beam, X)


def _with_causal_mask(attn_mask: Optional[Tensor], tgt_len: int, src_len: int, device) -> Tensor:
    """attn_mask with the causal mask (queries aligned to the last keys) folded in, in attn_mask's kind."""
    future = causal_bias(tgt_len, src_len, device)
    if attn_mask is None:
        return future
    if attn_mask.dtype == torch.bool:
        return attn_mask | torch.isinf(future)
    return attn_mask + future.to(attn_mask.dtype)


def _as_bool(mask: Optional[Tensor]) -> Optional[Tensor]:
    """A key padding mask as bool (True = padded); the stock cache keeps float 0/1 masks."""
    return mask if mask is None or mask.dtype == torch.bool else mask != 0


__all__ = ["ProjectedMultiheadAttention"]
