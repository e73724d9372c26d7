"""The README demo: a ~3M-parameter ZAYA1 pretrained on the Python standard library's source
(the embedded default corpus, byte-level tokens) on 8 emulated CPU devices as 2 data × 4 expert.

    python -m launch.train --config=experiments/zaya1_demo.py --workdir=runs/demo
"""

from zaya_jax.config import default_config


def get_config(arg=None):
    config = default_config()
    m = config.model
    m.vocab_size = 384  # byte-level tokenizer (259 ids) padded to a multiple of 128
    m.hidden_size = 128
    m.num_layers = 4
    m.num_q_heads = 4
    m.num_kv_heads = 2
    m.head_dim = 32
    m.num_experts = 8
    m.moe_intermediate_size = 128
    m.router_hidden_size = 32
    m.max_position_embeddings = 1024
    m.rope_theta = 10_000.0
    m.dispatch = "ep"
    # 2 sequences (512 tokens) per device: even with perfectly balanced global loads, per-device content
    # variation overflows a 2x capacity by up to 1.6% (benchmarks/balancing/README.md); 3x keeps it under 0.1%
    m.capacity_factor = 3.0
    config.mesh.data = 2
    config.mesh.expert = 4
    t = config.train
    t.seq_len = 256
    t.global_batch_size = 16
    t.steps = 200
    t.log_every = 10
    t.eval_every = 100
    t.eval_batches = 4
    o = config.optimizer
    o.learning_rate = 0.02
    o.adam_learning_rate = 3e-3
    o.warmup_steps = 20
    o.weight_decay = 0.01
    config.checkpoint.save_initial = True  # step 0 stays as the baseline for `launch.eval`
    return config
