"""Tensor shapes of real model architectures, for benchmark checkpoints."""


def qwen3_attention(p, hidden, q, kv, head_dim):
    """A Qwen3 layer's norms and attention (with q and k norms), names prefixed by `p`."""
    return {
        p + "input_layernorm.weight": (hidden,),
        p + "post_attention_layernorm.weight": (hidden,),
        p + "self_attn.q_proj.weight": (q, hidden),
        p + "self_attn.k_proj.weight": (kv, hidden),
        p + "self_attn.v_proj.weight": (kv, hidden),
        p + "self_attn.o_proj.weight": (hidden, q),
        p + "self_attn.q_norm.weight": (head_dim,),
        p + "self_attn.k_norm.weight": (head_dim,),
    }


def experts_of(p, experts, hidden, expert_mlp):
    """A MoE layer's experts (gate, up and down projections each), names prefixed by `p`."""
    shapes = {}
    for e in range(experts):
        x = f"{p}mlp.experts.{e}."
        shapes.update({
            x + "gate_proj.weight": (expert_mlp, hidden),
            x + "up_proj.weight": (expert_mlp, hidden),
            x + "down_proj.weight": (hidden, expert_mlp),
        })
    return shapes


def qwen3_0_6b():
    """Qwen3-0.6B: 310 bf16 tensors, tied embeddings."""
    hidden, layers, head_dim, mlp, vocab = 1024, 28, 128, 3072, 151936
    q, kv = 16 * head_dim, 8 * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(qwen3_attention(p, hidden, q, kv, head_dim))
        shapes.update({
            p + "mlp.gate_proj.weight": (mlp, hidden),
            p + "mlp.up_proj.weight": (mlp, hidden),
            p + "mlp.down_proj.weight": (hidden, mlp),
        })
    return shapes


def llama_layer(p, hidden, kv, mlp):
    """One Llama decoder layer's tensors, names prefixed by `p`."""
    return {
        p + "input_layernorm.weight": (hidden,),
        p + "post_attention_layernorm.weight": (hidden,),
        p + "self_attn.q_proj.weight": (hidden, hidden),
        p + "self_attn.k_proj.weight": (kv, hidden),
        p + "self_attn.v_proj.weight": (kv, hidden),
        p + "self_attn.o_proj.weight": (hidden, hidden),
        p + "mlp.gate_proj.weight": (mlp, hidden),
        p + "mlp.up_proj.weight": (mlp, hidden),
        p + "mlp.down_proj.weight": (hidden, mlp),
    }


def llama(hidden, layers, mlp, vocab, kv):
    """A Llama-architecture checkpoint: embeddings, layers, norm, untied lm_head."""
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        shapes.update(llama_layer(f"model.layers.{i}.", hidden, kv, mlp))
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def llama3_8b():
    """Llama-3-8B: 291 bf16 tensors, untied lm_head."""
    return llama(hidden=4096, layers=32, mlp=14336, vocab=128256, kv=8 * 128)


def moe_16x64():
    """A Qwen3-MoE-style checkpoint cut to 16 layers of 64 experts (3 projections each): 3,219
    bf16 tensors, 11.5 GB in 5 shards, most of them 3 MB expert matrices."""
    hidden, layers, experts, expert_mlp, vocab, head_dim = 2048, 16, 64, 768, 151936, 128
    q, kv = 32 * head_dim, 4 * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(qwen3_attention(p, hidden, q, kv, head_dim))
        shapes[p + "mlp.gate.weight"] = (experts, hidden)
        shapes.update(experts_of(p, experts, hidden, expert_mlp))
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def sized(gigabytes):
    """Llama-shaped layers (hidden 4096, 32k vocabulary) stacked to about `gigabytes` GB, for
    the load-time-against-size sweep."""
    def shapes():
        hidden, mlp, vocab, kv = 4096, 14336, 32000, 1024
        per_layer = 2 * (2 * hidden * hidden + 2 * kv * hidden + 3 * mlp * hidden + 2 * hidden)
        layers = max(1, round((gigabytes * 1e9 - 2 * 2 * vocab * hidden) / per_layer))
        return llama(hidden, layers, mlp, vocab, kv)
    return shapes


def one_file_8gb():
    """One 8.3 GB file whose first tensor is a 2.1 GB embedding (a 262,144-token vocabulary, tied
    head) followed by 14 Llama-3-8B layers: 128 bf16 tensors (the first-load benchmark's)."""
    hidden, layers, mlp, vocab, kv = 4096, 14, 14336, 262144, 8 * 128
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        shapes.update(llama_layer(f"model.layers.{i}.", hidden, kv, mlp))
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def moe_3k():
    """An 11.5 GB MoE of 3,155 bf16 tensors in 4 shards: 16 layers of 64 experts (3 MB matrices),
    attention without norms, router, embeddings and head (the first-load benchmark's)."""
    hidden, layers, experts, expert_mlp, vocab, head_dim = 2048, 16, 64, 768, 151936, 128
    q, kv = 32 * head_dim, 4 * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, q),
            p + "mlp.gate.weight": (experts, hidden),
        })
        shapes.update(experts_of(p, experts, hidden, expert_mlp))
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def scaled(shapes, scale):
    """`shapes` with each tensor's first dimension scaled (at least 1): the bytes scale, the
    tensor count and layout do not."""
    if scale == 1:
        return dict(shapes)
    return {n: (max(1, round(s[0] * scale)),) + tuple(s[1:]) for n, s in shapes.items()}


MODELS = {"qwen3-0.6b": (qwen3_0_6b, 1), "llama3-8b": (llama3_8b, 4), "moe-16x64": (moe_16x64, 5)}
# Checkpoint size sweep: name -> (shapes, shards); shards of about 4 GB as transformers writes.
SIZES = {f"sized-{gb}gb": (sized(gb), max(1, gb // 4)) for gb in (1, 4, 16, 32)}
# The first-load benchmark's (bench/first_load.py): shapes ferry's suite did not use before.
FIRST_LOAD = {"one-file-8gb": (one_file_8gb, 1), "moe-3k": (moe_3k, 4)}
ALL = {**MODELS, **SIZES, **FIRST_LOAD}
