"""Performer language models: fairseq's ``transformer_lm`` with FAVOR+ causal attention.

Registered model ``performer_lm`` (``transformer_lm``'s options plus ``--performer-*``) and the
shapes of the FourierFormer WikiText-103 models and their softmax twins:

    performer_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256 (twin softmax_lm_wiki103_small)
    performer_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384 (twin softmax_lm_wiki103_medium)

Train and evaluate with ``--tokens-per-sample`` equal to the context. Incremental decoding keeps
a constant-size state per layer (see ``PerformerMultiheadAttention``).
"""
from dataclasses import dataclass

from omegaconf import II

from fairseq import options
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
)
from fairseq.modules import AdaptiveInput, CharacterTokenEmbedder
from fairseq.utils import safe_getattr

from .fourierformer_lm import paper_lm_sizes
from .performer_options import (
    PerformerAttentionOptions,
    PerformerConfig,
    seed_performer_features,
    set_performer_defaults,
)
from .performer_transformer import PerformerTransformerDecoder

LM_SITES = ("decoder",)


@dataclass
class PerformerLanguageModelConfig(TransformerLanguageModelConfig, PerformerConfig):
    """``transformer_lm``'s options plus the --performer-* ones (declared in PerformerConfig)."""

    seed: int = II("common.seed")  # the features' seed (no option of its own: --seed)


@register_model("performer_lm", dataclass=PerformerLanguageModelConfig)
class PerformerLanguageModel(TransformerLanguageModel):
    """fairseq's Transformer language model with FAVOR+ (random-feature) causal self-attention."""

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def build_model(cls, args, task):
        """``TransformerLanguageModel.build_model`` with the Performer decoder.

        Mirrors the stock method step for step (same modules built in the same order), so a
        Performer LM and its softmax twin initialise identically under one seed.
        """
        performer = PerformerAttentionOptions.from_args(args, LM_SITES)
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

        decoder = PerformerTransformerDecoder(
            TransformerConfig.from_namespace(args), task.target_dictionary, embed_tokens, performer,
            no_encoder_attn=True,
        )
        model = cls(decoder)
        seed_performer_features(model, safe_getattr(args, "seed", 1))
        return model


@register_model_architecture("performer_lm", "performer_lm_wiki103_small")
def performer_lm_wiki103_small(args):
    set_performer_defaults(args, fourier_power=4, fourier_radius_init=2.0)
    paper_lm_sizes(args, embed_dim=128, context=256)


@register_model_architecture("performer_lm", "performer_lm_wiki103_medium")
def performer_lm_wiki103_medium(args):
    set_performer_defaults(args, fourier_power=4, fourier_radius_init=2.0)
    paper_lm_sizes(args, embed_dim=256, context=384)
