"""Tokenizer and generation files of an exported transformers directory.

`save_tokenizer_files(path, spec, model_cfg)` makes a `save_pretrained` directory usable on its own with
`AutoTokenizer.from_pretrained(path)` + `AutoModelForCausalLM.from_pretrained(path)`:

* `tokenizer.json` — the run's tokenizer: a copy of its `tokenizer.json`, or, for the project's byte tokenizer
  (`zaya_jax.data.tokenizer.ByteTokenizer`: pad 0, eos 1, bos 2, byte b → b + 3), the same mapping written as a
  `tokenizers` byte-level BPE without merges (each UTF-8 byte is one token), so ids agree exactly (except for
  text that spells a special token, which `tokenizers` maps to its id);
* `tokenizer_config.json` — `PreTrainedTokenizerFast` with its special tokens;
* `generation_config.json` — bos / eos / pad ids, greedy by default.
"""

from __future__ import annotations

import json
import os
import shutil

import ml_collections
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from zaya_jax.data.tokenizer import ByteTokenizer, load_tokenizer

# the byte tokenizer's ids 0, 1, 2; `tokenizers` matches special tokens inside text too, so the spellings are ones
# source text rarely contains (the byte tokenizer itself never produces ids 0-2 from text)
SPECIAL_TOKENS = {"pad": "<|pad|>", "eos": "<|endoftext|>", "bos": "<|begin_of_text|>"}


def byte_chars() -> list[str]:
    """The printable character standing for each byte 0..255 in byte-level BPE vocabularies: printable
    Latin-1 bytes stand for themselves, the others for code points 256, 257, ... in byte order."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def byte_tokenizer():
    """`tokenizers.Tokenizer` with `ByteTokenizer`'s ids: specials 0-2, byte b → b + 3 (no merges)."""
    byte = ByteTokenizer()
    vocab = {SPECIAL_TOKENS["pad"]: byte.pad_id, SPECIAL_TOKENS["eos"]: byte.eos_id, SPECIAL_TOKENS["bos"]: byte.bos_id}
    vocab.update({char: b + byte.offset for b, char in enumerate(byte_chars())})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS.values()])
    return tok


def _chmod_like_umask(path: str) -> None:
    """rw for the owner and, as the umask allows, for group / others (some writers create files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def normalize_permissions(directory: str) -> None:
    """Give every file directly in `directory` the permissions a plain `open()` would have."""
    for name in os.listdir(directory):
        if os.path.isfile(os.path.join(directory, name)):
            _chmod_like_umask(os.path.join(directory, name))


def run_tokenizer(data_cfg: ml_collections.ConfigDict) -> str | None:
    """The tokenizer spec a run used: `data.tokenizer` for the built-in corpus; for prepared `data.sources`,
    "byte" if the first one was tokenized by bytes, `data.tokenizer` if that file's SHA-256 matches the one
    recorded in its manifest, else None (unknown: pass the file explicitly)."""
    sources = tuple(data_cfg.get("sources", ()))
    if not sources:
        return str(data_cfg.get("tokenizer", "byte"))
    try:
        with open(os.path.join(os.path.expanduser(sources[0]), "manifest.json"), encoding="utf-8") as f:
            recorded = json.load(f).get("tokenizer", {})
    except (OSError, ValueError):
        return None
    if recorded.get("kind") == "byte":
        return "byte"
    spec = str(data_cfg.get("tokenizer", ""))
    if spec and spec != "byte" and recorded.get("sha256") == getattr(load_tokenizer(spec), "sha256", None):
        return spec
    return None


def save_tokenizer_files(path: str, spec: str, model_cfg: ml_collections.ConfigDict) -> dict[str, int | None]:
    """Write tokenizer.json / tokenizer_config.json / generation_config.json into `path` for the tokenizer
    `spec` ("byte" or a tokenizer.json path, as in `config.data.tokenizer`); returns its special ids."""
    tok = load_tokenizer(spec)
    target = os.path.join(path, "tokenizer.json")
    if isinstance(tok, ByteTokenizer):
        byte_tokenizer().save(target)
        names = {
            "pad_token": SPECIAL_TOKENS["pad"],
            "eos_token": SPECIAL_TOKENS["eos"],
            "bos_token": SPECIAL_TOKENS["bos"],
        }
    else:
        shutil.copyfile(tok.path, target)
        names = {
            f"{what}_token": tok._tok.id_to_token(i)
            for what, i in (("pad", tok.pad_id), ("eos", tok.eos_id), ("bos", tok.bos_id))
            if i is not None
        }
    ids = {"pad_token_id": tok.pad_id, "eos_token_id": tok.eos_id, "bos_token_id": tok.bos_id}
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": int(model_cfg.get("max_position_embeddings", 131_072)),
                "add_bos_token": False,
                "add_eos_token": False,
                **names,
            },
            f,
            indent=2,
        )
    with open(os.path.join(path, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({**{k: v for k, v in ids.items() if v is not None}, "do_sample": False}, f, indent=2)
    return ids
