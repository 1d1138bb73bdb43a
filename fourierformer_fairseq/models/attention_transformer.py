"""fairseq's Transformer, shared by every attention kind: the attention of each site is the kind's or softmax.

The kind's options object (see ``attention_options``), read from the args once per model by
``build_model`` and handed to the encoder, the decoder and each of their layers, decides, per site
("encoder", "decoder", "cross"), which attention module is built. Only the attention modules differ from the stock model:
the layers below (``AttentionKindEncoderLayer``, ``AttentionKindDecoderLayer``) override
``build_self_attention`` / ``build_encoder_attention`` and nothing else, so parameter names match
the softmax twin's and, under one seed, every shared weight initialises identically.
``AttentionKindEncoder`` / ``AttentionKindDecoder`` stack them; ``AttentionKindTransformerModel``
(translation) and ``AttentionKindLanguageModel`` build the models, and each kind's models subclass
them, naming their options class in ``options_class``.
"""
from __future__ import annotations

import contextvars
from typing import Dict, List, Optional, Type

from torch import Tensor

from fairseq import options
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoderBase
from fairseq.models.transformer.transformer_legacy import TransformerModel
from fairseq.models.transformer_lm import DEFAULT_MAX_TARGET_POSITIONS, TransformerLanguageModel, base_lm_architecture
from fairseq.modules import AdaptiveInput, CharacterTokenEmbedder
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.projected_attention import ProjectedMultiheadAttention

from . import lm_options
from .attention_options import LM_SITES, SITES, AttentionOptions, PluginVersionConfig


def paper_lm_sizes(args, embed_dim: int, context: int) -> None:
    """The paper's WikiText-103 LM shape (shared by every kind's models and the softmax twins)."""
    args.decoder_layers = safe_getattr(args, "decoder_layers", 16)
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", embed_dim)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 2048)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", 8)
    # present but None when the language_modeling task left it unset
    if safe_getattr(args, "max_target_positions", None) is None:
        args.max_target_positions = context
    args.dropout = safe_getattr(args, "dropout", 0.1)
    args.attention_dropout = safe_getattr(args, "attention_dropout", 0.0)
    base_lm_architecture(args)

NO_ALIGNMENT_LAYER = -1  # an alignment_layer index that matches no layer: no weights are requested


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's build_{en,de}coder_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # if we are checkpointing, enforce that FSDP always wraps the checkpointed layer
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class AttentionKindEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer; self-attention ("encoder") from ``attention_options``."""

    def __init__(self, cfg, attention_options: AttentionOptions, return_fc=False):
        self.attention_options = attention_options  # read by build_self_attention during super().__init__
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return self.attention_options.build_attention(
            "encoder",
            embed_dim,
            cfg.encoder.attention_heads,
            dropout=cfg.attention_dropout,
            self_attention=True,
            max_positions=cfg.max_source_positions,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class AttentionKindDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer; self-attention ("decoder") and encoder attention ("cross") from the options."""

    def __init__(self, cfg, attention_options: AttentionOptions, no_encoder_attn=False, add_bias_kv=False,
                 add_zero_attn=False):
        self.attention_options = attention_options
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        # causal: this layer's self-attention is the decoder's; a kind computes causality itself and
        # gets no future mask (AttentionKindDecoder.buffered_future_mask), softmax gets fairseq's
        return self.attention_options.build_attention(
            "decoder",
            embed_dim,
            cfg.decoder.attention_heads,
            causal=True,
            max_positions=cfg.max_target_positions,
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return self.attention_options.build_attention(
            "cross",
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class AttentionKindEncoder(TransformerEncoderBase):
    """fairseq's encoder with layers from ``attention_options``."""

    def __init__(self, cfg, dictionary, embed_tokens, attention_options: AttentionOptions, return_fc=False):
        self.attention_options = attention_options
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        return wrap_layer(AttentionKindEncoderLayer(cfg, self.attention_options, return_fc=self.return_fc), cfg)


class AttentionKindDecoder(TransformerDecoderBase):
    """fairseq's decoder with layers from ``attention_options``.

    One difference in training mode: fairseq's decoder always asks its last layer's encoder
    attention for its weights (``extra["attn"]``), which ordinary criteria discard. Fourier and
    random-feature attention have to materialise them outside their own computation (for Fourier
    attention several times the cost of the attention itself), so in training, when the encoder
    attention is not softmax, they are computed only when the caller names an ``alignment_layer``
    (as fairseq's alignment models do); otherwise ``extra["attn"]`` is ``[None]``. In eval mode
    (validation, generation, ``--print-alignment``, analysis) the weights are returned exactly as stock.
    """

    def __init__(self, cfg, dictionary, embed_tokens, attention_options: AttentionOptions, no_encoder_attn=False,
                 output_projection=None):
        self.attention_options = attention_options
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(AttentionKindDecoderLayer(cfg, self.attention_options, no_encoder_attn), cfg)

    def buffered_future_mask(self, tensor):
        """fairseq's future mask for softmax self-attention; None where the self-attention is a kind
        built with ``causal=True``, which is causal by construction and would apply a mask as a mask."""
        if "decoder" in self.attention_options.sites:
            return None
        return super().buffered_future_mask(tensor)

    def _causal_self_attention(self) -> List[ProjectedMultiheadAttention]:
        return [m for m in self.modules() if isinstance(m, ProjectedMultiheadAttention) and m.causal]

    def extract_features(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        if self.training and alignment_layer is None and "cross" in self.attention_options.sites:
            alignment_layer = NO_ALIGNMENT_LAYER  # see the class docstring
        # full_context_alignment: fairseq's decoder then passes no future mask, and self-attention sees
        # every position; a kind built causal is called with causal=False (an argument of its forward
        # that fairseq's layer does not pass: a pre-hook adds it to this call's self-attention calls)
        hooks = [module.register_forward_pre_hook(_full_context, with_kwargs=True)
                 for module in (self._causal_self_attention() if full_context_alignment else [])]
        try:
            return super().extract_features(
                prev_output_tokens,
                encoder_out,
                incremental_state=incremental_state,
                full_context_alignment=full_context_alignment,
                alignment_layer=alignment_layer,
                alignment_heads=alignment_heads,
            )
        finally:
            for hook in hooks:
                hook.remove()


def _full_context(module, args, kwargs):
    """Forward pre-hook: the call's ``causal`` argument is False (see ``AttentionKindDecoder.extract_features``)."""
    return args, {**kwargs, "causal": False}


# The options of the translation model being built: fairseq's build_model calls build_encoder and
# build_decoder with the args alone, so AttentionKindTransformerModel.build_model puts the options it
# read here for them (None outside a build_model).
_MODEL_OPTIONS: contextvars.ContextVar = contextvars.ContextVar("attention_options", default=None)


class AttentionKindTransformerModel(TransformerModel):
    """fairseq's Transformer (legacy argparse model) with the attention of ``options_class``."""

    options_class: Type[AttentionOptions]

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        cls.options_class.add_args(parser)
        gen_parser_from_dataclass(parser, PluginVersionConfig())  # recorded in the checkpoints' cfg.model

    @classmethod
    def build_model(cls, args, task):
        # read and validated once (errors name the flags), before anything is built; the encoder and
        # the decoder that fairseq's build_model asks build_encoder / build_decoder for share them
        token = _MODEL_OPTIONS.set(cls.options_class.from_args(args, SITES))
        try:
            model = super().build_model(args, task)
        finally:
            _MODEL_OPTIONS.reset(token)
        cls.options_class.prepare_model(model, args)
        return model

    @classmethod
    def _attention_options(cls, args) -> AttentionOptions:
        """The options of the model being built (build_model's); read from args when called on its own."""
        options = _MODEL_OPTIONS.get()
        return options if isinstance(options, cls.options_class) else cls.options_class.from_args(args, SITES)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return AttentionKindEncoder(cfg, src_dict, embed_tokens, cls._attention_options(args))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return AttentionKindDecoder(
            cfg, tgt_dict, embed_tokens, cls._attention_options(args), no_encoder_attn=cfg.no_cross_attention,
        )


class AttentionKindLanguageModel(TransformerLanguageModel):
    """fairseq's Transformer language model with the decoder self-attention of ``options_class``."""

    options_class: Type[AttentionOptions]

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def build_model(cls, args, task):
        """``TransformerLanguageModel.build_model`` with the decoder of ``options_class``.

        Mirrors the stock method step for step (same modules built in the same order), so the
        language model and its softmax twin initialise identically under one seed; then the
        ``lm_options`` (LayerNorm placement before, biases and init after).
        """
        attention_options = cls.options_class.from_args(args, LM_SITES)
        lm_options.prepare_args(args)
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)

        if args.character_embeddings:
            embed_tokens = CharacterTokenEmbedder(
                task.source_dictionary,
                eval(args.character_filters),
                args.character_embedding_dim,
                args.decoder_embed_dim,
                args.char_embedder_highway_layers,
            )
        elif args.adaptive_input:
            embed_tokens = AdaptiveInput(
                len(task.source_dictionary),
                task.source_dictionary.pad(),
                args.decoder_input_dim,
                args.adaptive_input_factor,
                args.decoder_embed_dim,
                options.eval_str_list(args.adaptive_input_cutoff, type=int),
                args.quant_noise_pq,
                args.quant_noise_pq_block_size,
            )
        else:
            embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)

        if args.tie_adaptive_weights:
            if not args.adaptive_input:
                raise ValueError("--tie-adaptive-weights needs --adaptive-input")
            if args.adaptive_input_factor != args.adaptive_softmax_factor:
                raise ValueError("--tie-adaptive-weights needs --adaptive-input-factor == --adaptive-softmax-factor")
            if args.adaptive_softmax_cutoff != args.adaptive_input_cutoff:
                raise ValueError(
                    f"--tie-adaptive-weights needs --adaptive-softmax-cutoff == --adaptive-input-cutoff, "
                    f"got {args.adaptive_softmax_cutoff} != {args.adaptive_input_cutoff}"
                )
            if args.decoder_input_dim != args.decoder_output_dim:
                raise ValueError("--tie-adaptive-weights needs --decoder-input-dim == --decoder-output-dim")

        decoder = AttentionKindDecoder(
            TransformerConfig.from_namespace(args), task.target_dictionary, embed_tokens, attention_options,
            no_encoder_attn=True,
        )
        model = cls(decoder)
        cls.options_class.prepare_model(model, args)
        lm_options.finish_model(model, args)
        return model


__all__ = [
    "NO_ALIGNMENT_LAYER",
    "AttentionKindDecoder",
    "AttentionKindDecoderLayer",
    "AttentionKindEncoder",
    "AttentionKindEncoderLayer",
    "AttentionKindLanguageModel",
    "AttentionKindTransformerModel",
    "paper_lm_sizes",
    "wrap_layer",
]
