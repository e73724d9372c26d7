"""Train a byte-level BPE tokenizer (a `tokenizers` tokenizer.json) on local text.

The byte tokenizer spends one token per UTF-8 byte, so a few bytes (the space is 29% of the embedded
standard-library corpus) dominate the token stream: no router can spread one token value that makes up a
quarter of a batch over 16 experts at the first MoE layer (docs/balancing.md). A BPE vocabulary of the
model's size fixes that and makes each of the `seq_len` positions carry ≈ 3.6× more text.

    tok = train_bpe(corpus.stdlib_files(), vocab_size=8192, output="/data/bpe8k/tokenizer.json")

Special tokens: `<pad>` = 0, `<|endoftext|>` = 1 (eos), `<s>` = 2 (bos), as in the byte tokenizer.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from zaya_jax.data.inputs import expand_inputs, iter_documents
from zaya_jax.data.tokenizer import DataError, HFTokenizer, load_tokenizer

SPECIAL_TOKENS = ("<pad>", "<|endoftext|>", "<s>")
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet + specials


def train_bpe(inputs: Sequence[str], vocab_size: int, output: str, text_key: str = "text") -> HFTokenizer:
    """Train a byte-level BPE with at most `vocab_size` ids (specials included; fewer when the inputs run out
    of pairs to merge) on the documents of `inputs` (files, directories or globs) and save it to `output`
    (a tokenizer.json path or a directory). Training is deterministic.

    An existing file at `output` is never overwritten: it is reused when it is exactly the tokenizer these
    inputs and size give, and refused otherwise (DataError saying what to do)."""
    if vocab_size < MIN_VOCAB:
        raise DataError(f"vocab_size {vocab_size} is too small for a byte-level BPE; use at least {MIN_VOCAB}")
    path = os.path.expanduser(output)
    if os.path.isdir(path) or not path.endswith(".json"):
        path = os.path.join(path, "tokenizer.json")
    files = expand_inputs(inputs)
    if not files:
        raise DataError(f"no input files found in {list(inputs)}; pass files, directories or globs")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((text for _, text in iter_documents(files, text_key)), trainer=trainer)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            same = json.loads(tok.to_str()) == json.load(f)
        if not same:
            raise DataError(
                f"{path} already holds a different tokenizer ({load_tokenizer(path).raw_vocab_size} ids); pick "
                "another --output (an existing tokenizer is never overwritten)"
            )
        return HFTokenizer(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    tok.save(tmp)
    os.replace(tmp, path)
    return HFTokenizer(path)
