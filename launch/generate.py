r"""Generate text with a ZAYA1 model (cached decoding, `zaya_jax.inference.generate`).

    python -m launch.generate --hf=/path/to/hf_dir --prompt="Once upon a time" --max_new_tokens=64
    python -m launch.generate --checkpoint=/runs/x/ckpt --prompt="def f(" --temperature=0.8 --top_p=0.95 \
        --tokenizer=byte

Several --prompt flags form one left-padded batch. The tokenizer defaults to the --hf directory's
tokenizer.json if it has one, else the byte tokenizer.
"""

from __future__ import annotations

import sys
import time

from absl import flags

from launch import cli
from launch.model_flags import define_model_flags

FLAGS = flags.FLAGS
define_model_flags()
flags.DEFINE_multi_string("prompt", None, "prompt text (repeat for a batch)")
flags.DEFINE_integer("max_new_tokens", 64, "tokens to generate per prompt", lower_bound=0)
flags.DEFINE_float("temperature", 0.0, "0 = greedy; > 0 samples", lower_bound=0.0)
flags.DEFINE_integer("top_k", 0, "keep the k most likely tokens (0 = off)", lower_bound=0)
flags.DEFINE_float("top_p", 1.0, "nucleus sampling mass in (0, 1] (1 = off)", upper_bound=1.0)
flags.DEFINE_integer("seed", 0, "sampling seed")
flags.DEFINE_boolean("stop_at_eos", True, "stop a prompt's continuation at the tokenizer's eos")
flags.DEFINE_boolean("bos", False, "prepend the tokenizer's bos id to every prompt")
flags.mark_flags_as_required(["prompt"])
flags.register_validator("top_p", lambda p: p > 0, "--top_p must be in (0, 1]")
cli.require_numbers("temperature", "top_p")


def main(argv: list[str]) -> None:
    del argv
    from zaya_jax.inference import generate, left_pad
    from zaya_jax.inference.loading import default_tokenizer, load_model

    _, model = load_model(FLAGS.hf, FLAGS.checkpoint, dtype=FLAGS.dtype, skip_output=FLAGS.skip_output)
    tok = default_tokenizer(FLAGS.tokenizer, FLAGS.hf)
    prefix = [tok.bos_id] if FLAGS.bos and tok.bos_id is not None else []
    prompts = [prefix + tok.encode(p) for p in FLAGS.prompt]
    if any(not p for p in prompts):
        cli.fail("generate", "an empty prompt; give some text or --bos")
    too_big = [i for p in prompts for i in p if i >= model.cfg.vocab_size]
    if too_big:
        cli.fail("generate", f"token id {too_big[0]} >= model vocab_size {model.cfg.vocab_size}; wrong --tokenizer?")
    positions = int(model.cfg.max_position_embeddings)
    longest = max(len(p) for p in prompts)
    if longest + FLAGS.max_new_tokens > positions:
        cli.fail(
            "generate",
            f"--max_new_tokens={FLAGS.max_new_tokens} after a {longest}-token prompt runs past the model's "
            f"{positions} positions; use --max_new_tokens <= {max(positions - longest, 0)}",
        )
    ids, lengths = left_pad(prompts, tok.pad_id)
    start = time.perf_counter()
    out = generate(
        model,
        ids,
        max_new_tokens=FLAGS.max_new_tokens,
        temperature=FLAGS.temperature,
        top_k=FLAGS.top_k,
        top_p=FLAGS.top_p,
        seed=FLAGS.seed,
        prompt_lengths=lengths,
        eos_id=tok.eos_id if FLAGS.stop_at_eos else None,
        pad_id=tok.pad_id,
    )
    new = out[:, ids.shape[1] :].tolist()
    seconds = time.perf_counter() - start
    for text, cont in zip(FLAGS.prompt, new):
        if FLAGS.stop_at_eos and tok.eos_id in cont:
            cont = cont[: cont.index(tok.eos_id)]
        print(f"=== {text!r}\n{text}{tok.decode(cont)}")
    print(f"[{len(new)} x {FLAGS.max_new_tokens} new tokens in {seconds:.2f}s incl. compilation]", file=sys.stderr)


if __name__ == "__main__":
    cli.run(main, "generate")
