"""Tokenizers for offline data preparation: a byte-level default and a Hugging Face JSON wrapper.

Both share one small interface (`encode`, `encode_array`, `decode`, `vocab_size`, `pad_id`,
`eos_id`, `bos_id`, `name`, `describe()`). `load_tokenizer("byte")` needs nothing on disk;
`load_tokenizer("/path/tokenizer.json")` reads a local `tokenizers` file. Nothing is ever
downloaded.
"""

from __future__ import annotations

import hashlib
import os
from typing import Protocol, Sequence

import numpy as np

from zaya_jax.errors import ZayaError

VOCAB_MULTIPLE = 128
# Special-token spellings tried, in order, when a tokenizer.json does not name its ids explicitly.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "[SEP]", "<|end_of_text|>")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")
PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")


class DataError(ZayaError, ValueError):
    """Bad data input or preparation state; the message says what is wrong and what to do."""


class DataWarning(UserWarning):
    """Suspicious input that is still usable (e.g. a file that is mostly not text)."""


def round_up(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Smallest multiple of `multiple` that is >= n."""
    return -(-int(n) // multiple) * multiple


class Tokenizer(Protocol):
    """The interface data preparation relies on."""

    name: str
    vocab_size: int
    pad_id: int
    eos_id: int
    bos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def describe(self) -> dict: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: 0 = pad, 1 = eos, 2 = bos, byte b -> b + 3; vocab padded to 384."""

    name = "byte"
    pad_id, eos_id, bos_id = 0, 1, 2
    offset = 3
    vocab_size = round_up(256 + 3)  # 384

    def encode_array(self, text: str) -> np.ndarray:
        """Token ids of `text`, int32 [num_bytes]."""
        raw = np.frombuffer(text.encode("utf-8", errors="replace"), dtype=np.uint8)
        return raw.astype(np.int32) + self.offset

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode_array` of each text."""
        return [self.encode_array(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Inverse of `encode`; special and out-of-range ids are dropped."""
        arr = np.asarray(ids, dtype=np.int64)
        arr = arr[(arr >= self.offset) & (arr < self.offset + 256)] - self.offset
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def describe(self) -> dict:
        return dict(
            name=self.name,
            kind="byte",
            vocab_size=self.vocab_size,
            pad_id=self.pad_id,
            eos_id=self.eos_id,
            bos_id=self.bos_id,
        )

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=384)"


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class HFTokenizer:
    """A `tokenizers.Tokenizer` loaded from a local tokenizer.json.

    `vocab_size` defaults to the tokenizer's size (with added tokens) rounded up to a multiple
    of 128; pass `vocab_size` to force a value (ids >= it are rejected during preparation).
    Special ids are looked up by the usual spellings unless given by token string.
    """

    def __init__(
        self,
        path: str,
        *,
        vocab_size: int | None = None,
        eos_token: str | None = None,
        bos_token: str | None = None,
        pad_token: str | None = None,
    ):
        try:
            import tokenizers
        except ImportError as e:  # pragma: no cover - tokenizers is a hard dependency
            raise DataError("the `tokenizers` package is missing: pip install tokenizers") from e
        if not os.path.isfile(path):
            raise DataError(f"tokenizer file {path!r} does not exist; pass 'byte' or a local tokenizer.json")
        try:
            self._tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise DataError(f"cannot load tokenizer {path!r} ({e}); pass a Hugging Face tokenizer.json") from e
        self.path = os.path.abspath(path)
        self.sha256 = _file_sha256(path)
        self.raw_vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.vocab_size = int(vocab_size) if vocab_size else round_up(self.raw_vocab_size)
        self.eos_id = self._special(eos_token, EOS_CANDIDATES, "eos", required=True)
        self.bos_id = self._special(bos_token, BOS_CANDIDATES, "bos", required=False)
        pad = self._special(pad_token, PAD_CANDIDATES, "pad", required=False)
        self.pad_id = self.eos_id if pad is None else pad
        self.name = f"hf:{os.path.basename(path)}"

    def _special(self, token: str | None, candidates: Sequence[str], what: str, required: bool) -> int | None:
        for cand in [token] if token else candidates:
            idx = self._tok.token_to_id(cand)
            if idx is not None:
                return int(idx)
        if required:
            raise DataError(
                f"tokenizer {self.path!r} has no {what} token among {list(candidates)}; "
                f"add one or pass {what}_token=..."
            )
        return None

    def encode_array(self, text: str) -> np.ndarray:
        """Token ids of `text` (no special tokens added), int32 [num_tokens]."""
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, int32 arrays; `tokenizers` encodes the batch on several threads."""
        return [
            np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)
        ]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def describe(self) -> dict:
        return dict(
            name=self.name,
            kind="hf",
            sha256=self.sha256,
            vocab_size=self.vocab_size,
            raw_vocab_size=self.raw_vocab_size,
            pad_id=self.pad_id,
            eos_id=self.eos_id,
            bos_id=self.bos_id,
        )

    def __repr__(self) -> str:
        return f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size})"


def load_tokenizer(spec: "str | Tokenizer", *, vocab_size: int | None = None) -> Tokenizer:
    """`"byte"` -> `ByteTokenizer`; a path to a tokenizer.json -> `HFTokenizer`; objects pass through."""
    if not isinstance(spec, str):
        return spec
    if spec == "byte":
        if vocab_size and vocab_size != ByteTokenizer.vocab_size:
            raise DataError(f"the byte tokenizer has vocab_size 384, not {vocab_size}; drop the override")
        return ByteTokenizer()
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    return HFTokenizer(path, vocab_size=vocab_size)
