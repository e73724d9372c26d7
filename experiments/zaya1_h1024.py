"""A hidden-1024 ZAYA1 (4 layers, 8 experts of width 1024) for the MFU benchmark on CPU
(`python -m launch.bench --suite=train --config=experiments/zaya1_h1024.py --reference=false`)."""

from zaya_jax.config import default_config


def get_config(arg=None):
    config = default_config()
    m = config.model
    m.vocab_size = 8192
    m.hidden_size = 1024
    m.num_layers = 4
    m.num_q_heads = 8
    m.num_kv_heads = 2
    m.head_dim = 128
    m.num_experts = 8
    m.moe_intermediate_size = 1024
    m.router_hidden_size = 256
    m.max_position_embeddings = 4096
    config.train.seq_len = 512
    config.train.global_batch_size = 4
    return config
