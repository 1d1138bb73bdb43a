"""``ProjectedMultiheadAttention``: fairseq's ``MultiheadAttention`` whose attention a subclass computes.

The part that ``FourierMultiheadAttention`` and ``PerformerMultiheadAttention`` share with the stock
forward: the constructor (fairseq's arguments; xFormers refused, since the subclass computes the
attention itself), the inherited projections (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``),
splitting and merging heads, beamable encoder-decoder attention, and the stock incremental cache of
projected keys and values (``prev_key`` / ``prev_value`` of shape (batch, heads, seq, head_dim)).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq.modules.multihead_attention import MultiheadAttention

from fourierformer_fairseq.ops.inputs import causal_bias


class ProjectedMultiheadAttention(MultiheadAttention):
    """fairseq's ``MultiheadAttention`` constructor and projections, for attentions computed in a subclass.

    ``causal_self_attention``: set (True) by the decoder layer that builds this module as its
    self-attention (models/attention_transformer.py). fairseq's decoder then passes its future mask
    as ``attn_mask``, and the module runs causal attention instead of applying the mask: see
    ``_causal_from_future_mask``. Left False, an ``attn_mask`` is a mask like any other.
    """

    causal_self_attention: bool = False

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
    ):
        if xformers_att_config is not None:
            raise ValueError(
                f"{type(self).__name__} computes its own attention and cannot use xFormers "
                "(got xformers_att_config); drop --encoder/--decoder-xformers-att-config"
            )
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

    def _project(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        bsz: int,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """q, k, v in (time, batch, channels), as the stock forward projects them."""
        q = self.q_proj(query)
        if self.self_attention:
            return q, self.k_proj(query), self.v_proj(query), key_padding_mask
        if self.encoder_decoder_attention:
            if key is None:  # static keys already cached
                assert value is None
                return q, None, None, key_padding_mask
            if self.beam_size > 1 and bsz == key.size(1):
                # beamable enc-dec attention: the encoder output is repeated beam_size times; keep one copy
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0, :]
            return q, self.k_proj(key), self.v_proj(key), key_padding_mask
        assert key is not None and value is not None
        return q, self.k_proj(key), self.v_proj(value), key_padding_mask

    def _is_future_mask(self, attn_mask: Tensor, tgt_len: int, src_len: int) -> bool:
        """Whether attn_mask is fairseq's future mask for queries aligned to the last keys: (tgt_len,
        src_len), -inf (or True) exactly where key j > query i + src_len - tgt_len, 0 (False) elsewhere.

        The values are compared only when attn_mask is not the tensor last found to be one (same
        storage, shape, strides, dtype and version): fairseq's decoder passes views of one cached
        buffer, so the comparison (a host sync on a GPU) runs once, not on every forward.
        """
        if attn_mask.dim() != 2 or tuple(attn_mask.shape) != (tgt_len, src_len) or tgt_len > src_len:
            return False
        if not (attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
            return False
        try:
            identity = (attn_mask.data_ptr(), attn_mask.stride(), attn_mask.dtype, attn_mask.device,
                        attn_mask._version, tgt_len, src_len)
        except RuntimeError:  # inference tensors keep no version counter: compare every time
            identity = None
        known = self.__dict__.get("_known_future_mask")
        if identity is not None and known is not None and known[1] == identity:
            return True
        expected = causal_bias(tgt_len, src_len, attn_mask.device)
        if attn_mask.dtype == torch.bool:
            expected = torch.isinf(expected)
        if not torch.equal(attn_mask, expected.to(attn_mask.dtype)):
            return False
        if identity is not None:
            # (the reference keeps the storage alive, so no other tensor can take its address)
            self.__dict__["_known_future_mask"] = (attn_mask, identity)
        return True

    def _causal_from_future_mask(
        self, attn_mask: Optional[Tensor], tgt_len: int, src_len: int
    ) -> Tuple[Optional[Tensor], bool]:
        """(attn_mask, causal) for the attention: with ``causal_self_attention``, fairseq's future
        mask becomes causal=True (the kernels skip the masked keys, no mask is read); any other
        mask, or any mask of a module without the flag, is kept and applied as given."""
        if attn_mask is not None and self.causal_self_attention and self._is_future_mask(attn_mask, tgt_len, src_len):
            return None, True
        return attn_mask, False

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
    ) -> Tuple[Tensor, Tensor, Optional[Tensor], int]:
        """The stock cache: k, v (batch, heads, seq, head_dim) after the cached ones; stores them.

        Returns k, v, the key padding mask over all cached keys (as the stock cache keeps it) and
        the keys' batch size.
        """
        if "prev_key" in saved_state:
            prev_key = saved_state["prev_key"]
            assert prev_key is not None
            kv_bsz = prev_key.size(0)
            prev_key = prev_key.reshape(kv_bsz, self.num_heads, -1, self.head_dim)
            k = prev_key if static_kv else torch.cat([prev_key, k], dim=2)
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
        saved_state["prev_key"] = k
        saved_state["prev_value"] = v
        saved_state["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask, kv_bsz

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


__all__ = ["ProjectedMultiheadAttention"]
