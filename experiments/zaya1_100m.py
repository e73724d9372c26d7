"""A ~114M-parameter ZAYA1 for CPU benchmarks (the config of the transformers comparison, benchmarks/README.md):
hidden 512, 8 layers, 4 q / 2 kv heads of 128, 16 experts of width 512, router 128, vocab 8192."""

from zaya_jax.config import default_config


def get_config(arg=None):
    config = default_config()
    m = config.model
    m.vocab_size = 8192
    m.hidden_size = 512
    m.num_layers = 8
    m.num_q_heads = 4
    m.num_kv_heads = 2
    m.head_dim = 128
    m.num_experts = 16
    m.moe_intermediate_size = 512
    m.router_hidden_size = 128
    m.max_position_embeddings = 4096
    config.train.seq_len = 256
    config.train.global_batch_size = 8
    return config
