"""Configuration of the TUPE model family: every positional scheme of the paper is one value of `position_scheme`."""

from __future__ import annotations

from transformers import PretrainedConfig

# Kept here (not imported from positional.py) so the config stays importable on its own; positional.py checks
# that its registry matches this tuple.
POSITION_SCHEMES: tuple[str, ...] = (
    "bert-a",
    "bert-r",
    "bert-a-d",
    "tupe-a",
    "tupe-r",
    "tupe-a-tie-cls",
    "tupe-r-tie-cls",
    "rope",
)


class TupeConfig(PretrainedConfig):
    """BERT-style encoder configuration plus the positional scheme.

    Defaults are the released code's BERT-Base (12 x 768, 12 heads, FFN 3072, post-LayerNorm, no token types,
    LayerNorm on the input embedding) with TUPE-A positions.

    Args:
        position_scheme: one of `POSITION_SCHEMES` (see `docs/model.md` for the logits of each).
        relative_attention_num_buckets / relative_attention_max_distance: T5 bucketing of `j - i` for the
            `*-r` schemes (the paper's 32 and 128).
        embedding_layer_norm: LayerNorm on the (word [+ position]) input embedding, as in the released commands.
        sparse_prediction: with labels, run the masked-LM head on masked positions only.
        rope_theta: base of the rotary frequencies for `rope`.
        fold_positional: with SDPA, fold a low-rank content-free term (`tupe-a`, `tupe-a-tie-cls`) into the
            query/key head dimension instead of passing an n x n mask (exact; lets flash kernels run).
    """

    model_type = "tupe"

    def __init__(
        self,
        vocab_size: int = 32768,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        position_scheme: str = "tupe-a",
        relative_attention_num_buckets: int = 32,
        relative_attention_max_distance: int = 128,
        embedding_layer_norm: bool = True,
        layer_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        classifier_dropout: float | None = None,
        sparse_prediction: bool = True,
        rope_theta: float = 10000.0,
        fold_positional: bool = True,
        pad_token_id: int = 0,
        cls_token_id: int = 1,
        sep_token_id: int = 2,
        mask_token_id: int = 3,
        tie_word_embeddings: bool = True,
        **kwargs,
    ):
        if position_scheme not in POSITION_SCHEMES:
            raise ValueError(
                f"unknown position_scheme {position_scheme!r}; valid schemes: {', '.join(POSITION_SCHEMES)}"
            )
        if hidden_size % num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads ({num_attention_heads})"
            )
        if position_scheme == "rope" and (hidden_size // num_attention_heads) % 2 != 0:
            raise ValueError(f"rope needs an even head dimension, got {hidden_size // num_attention_heads}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.position_scheme = position_scheme
        self.relative_attention_num_buckets = relative_attention_num_buckets
        self.relative_attention_max_distance = relative_attention_max_distance
        self.embedding_layer_norm = embedding_layer_norm
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.classifier_dropout = classifier_dropout
        self.sparse_prediction = sparse_prediction
        self.rope_theta = rope_theta
        self.fold_positional = fold_positional
        self.cls_token_id = cls_token_id
        self.sep_token_id = sep_token_id
        self.mask_token_id = mask_token_id
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
