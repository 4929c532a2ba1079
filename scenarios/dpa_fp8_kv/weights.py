"""Seeded weights for the tiny DeepSeek-V3: a model.safetensors in which attention changes the logits.

    python weights.py --model-dir DIR --seed 0 --scale 0.05

Runs in the user's python (torch and safetensors, which vLLM needs anyway); the layout itself is
stdlib-only so the scenario can read it. Names and shapes are DeepSeek-V3's checkpoint layout (per-expert
MLP tensors, `kv_a_proj_with_mqa`, `e_score_correction_bias`), which vLLM's loader maps onto its fused
modules; vLLM then checks that every parameter was loaded. Matrices are uniform in [-scale, scale]
(vLLM's dummy loader uses 1e-3, at which attention does not move the logits), norm weights 1, the
router's correction bias 0. Each tensor has its own generator, seeded from seed and its position, so the
file is the same wherever it is written. Writes model.safetensors and weights.json (seed, scale, tensor
and parameter counts, sha256 of the file).
"""
import argparse
import hashlib
import json
import os
import sys

FORMAT = 1  # bump when the layout or the fill changes: model dirs are keyed by it


def checkpoint_layout(config):
    """[(name, shape, fill)] for config.json's dict; fill is "uniform", "ones" or "zeros"."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, nope, rope, v_dim = (config["num_attention_heads"], config["qk_nope_head_dim"],
                                config["qk_rope_head_dim"], config["v_head_dim"])
    kv_lora, q_lora = config["kv_lora_rank"], config["q_lora_rank"]
    layout = [("model.embed_tokens.weight", (vocab, hidden), "uniform"),
              ("model.norm.weight", (hidden,), "ones"),
              ("lm_head.weight", (vocab, hidden), "uniform")]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        layout += [(prefix + "input_layernorm.weight", (hidden,), "ones"),
                   (prefix + "post_attention_layernorm.weight", (hidden,), "ones")]
        attention = prefix + "self_attn."
        if q_lora:
            layout += [(attention + "q_a_proj.weight", (q_lora, hidden), "uniform"),
                       (attention + "q_a_layernorm.weight", (q_lora,), "ones"),
                       (attention + "q_b_proj.weight", (heads * (nope + rope), q_lora), "uniform")]
        else:
            layout.append((attention + "q_proj.weight", (heads * (nope + rope), hidden), "uniform"))
        layout += [(attention + "kv_a_proj_with_mqa.weight", (kv_lora + rope, hidden), "uniform"),
                   (attention + "kv_a_layernorm.weight", (kv_lora,), "ones"),
                   (attention + "kv_b_proj.weight", (heads * (nope + v_dim), kv_lora), "uniform"),
                   (attention + "o_proj.weight", (hidden, heads * v_dim), "uniform")]
        mlp = prefix + "mlp."
        moe = layer >= config["first_k_dense_replace"] and layer % config["moe_layer_freq"] == 0
        if not moe:
            layout += _mlp(mlp, hidden, config["intermediate_size"])
            continue
        experts, width = config["n_routed_experts"], config["moe_intermediate_size"]
        layout += [(mlp + "gate.weight", (experts, hidden), "uniform")]
        if config.get("topk_method") == "noaux_tc":
            layout.append((mlp + "gate.e_score_correction_bias", (experts,), "zeros"))
        for expert in range(experts):
            layout += _mlp(f"{mlp}experts.{expert}.", hidden, width)
        if config.get("n_shared_experts"):
            layout += _mlp(mlp + "shared_experts.", hidden, width * config["n_shared_experts"])
    return layout


def _mlp(prefix, hidden, width):
    return [(prefix + "gate_proj.weight", (width, hidden), "uniform"),
            (prefix + "up_proj.weight", (width, hidden), "uniform"),
            (prefix + "down_proj.weight", (hidden, width), "uniform")]


def write_weights(model_dir, seed, scale):
    """Write model_dir/model.safetensors and model_dir/weights.json from model_dir/config.json."""
    import torch
    from safetensors.torch import save_file

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    tensors, parameters = {}, 0
    for index, (name, shape, fill) in enumerate(checkpoint_layout(config)):
        if fill == "ones":
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        elif fill == "zeros":
            tensor = torch.zeros(shape, dtype=torch.bfloat16)
        else:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
            tensor = ((torch.rand(shape, generator=generator, dtype=torch.float32) * 2 - 1) * scale
                      ).to(torch.bfloat16)
        tensors[name] = tensor
        parameters += tensor.numel()
    path = os.path.join(model_dir, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    manifest = {"format": FORMAT, "seed": seed, "scale": scale, "tensors": len(tensors),
                "parameters": parameters, "sha256": digest.hexdigest(), "torch": torch.__version__}
    with open(os.path.join(model_dir, "weights.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--scale", type=float, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(write_weights(args.model_dir, args.seed, args.scale)))


if __name__ == "__main__":
    main(sys.argv[1:])
