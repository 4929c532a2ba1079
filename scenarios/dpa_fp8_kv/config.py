"""A tiny DeepSeek-V3 config.json: the MLA shapes AITER requires, a small body."""
from __future__ import annotations

from scenarios.dpa_fp8_kv.options import Options

KV_LORA_RANK = 512  # AITER MLA decode kernels are built for kv_lora_rank 512 + rope 64
QK_ROPE_HEAD_DIM = 64
# Per-rank MLP widths; vLLM shards dense MLPs over TP and, with data parallel, experts over DP x TP.
MLP_WIDTH_PER_RANK = 256
VOCAB_SIZE = 4096


def deepseek_v3_config(options: Options) -> dict:
    """The config.json dict for options (num_attention_heads = options.heads, shared by tp ranks)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "torch_dtype": "bfloat16",
        "hidden_size": 1024,
        "hidden_act": "silu",
        "num_hidden_layers": options.layers,
        "num_attention_heads": options.heads,
        "num_key_value_heads": options.heads,
        "kv_lora_rank": KV_LORA_RANK,
        "q_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "v_head_dim": 128,
        "attention_bias": False,
        "first_k_dense_replace": options.layers - 1,  # the last layer is always MoE
        "moe_layer_freq": 1,
        "intermediate_size": MLP_WIDTH_PER_RANK * options.tp,
        "moe_intermediate_size": MLP_WIDTH_PER_RANK * options.tp * options.dp,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": 0,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": options.max_model_len,
        "rope_theta": 10000,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "initializer_range": 0.02,
        "use_cache": True,
    }

