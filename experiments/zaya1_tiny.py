"""A CPU-sized ZAYA1 (~1M parameters) for tests, debugging and the demo."""

from zaya_jax.config import default_config


def get_config(arg=None):
    config = default_config()
    m = config.model
    m.vocab_size = 384  # byte-level tokenizer (259 ids) padded to a multiple of 128
    m.hidden_size = 64
    m.num_layers = 2
    m.num_q_heads = 4
    m.num_kv_heads = 2
    m.head_dim = 16
    m.num_experts = 4
    m.moe_intermediate_size = 64
    m.router_hidden_size = 16
    m.max_position_embeddings = 1024
    m.rope_theta = 10_000.0
    config.train.seq_len = 128
    config.train.global_batch_size = 8
    config.train.steps = 100
    config.optimizer.warmup_steps = 10
    return config
