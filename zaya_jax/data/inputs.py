"""Input files of a data preparation: discovery (files, directories, globs) and reading documents.

.txt/.md/.py/... files are one document each, .jsonl one per line (a string field), .parquet one per row
(needs pyarrow). Bytes that are not UTF-8 become U+FFFD; a file where they exceed `UNDECODABLE_WARN` of its
bytes (binary data, another encoding) gets a `DataWarning` naming it, once per file.
"""

from __future__ import annotations

import glob
import json
import os
import re
import warnings
from typing import Any, Iterator, Sequence

from zaya_jax.data.tokenizer import DataError, DataWarning

TEXT_EXTS = (
    ".txt",
    ".text",
    ".md",
    ".markdown",
    ".rst",
    ".py",
    ".pyi",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".hpp",
    ".rs",
    ".go",
    ".java",
    ".js",
    ".ts",
    ".html",
    ".tex",
    ".toml",
    ".yaml",
    ".yml",
)
JSONL_EXTS = (".jsonl", ".ndjson")
PARQUET_EXTS = (".parquet",)
UNDECODABLE_WARN = 0.01  # fraction of a file's bytes that are not UTF-8 above which it is reported
_UNDECODED = re.compile("[\udc80-\udcff]")  # what errors="surrogateescape" makes of undecodable bytes


def _known(path: str) -> bool:
    return path.lower().endswith(TEXT_EXTS + JSONL_EXTS + PARQUET_EXTS)


def _walk(root: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if _known(f) and not f.startswith(".")]
    return out


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Files, directories (recursive, known extensions only) and globs -> sorted unique file list."""
    files: list[str] = []
    for spec in inputs:
        spec = os.path.expanduser(spec)
        if os.path.isdir(spec):
            files += _walk(spec)
        elif os.path.isfile(spec):
            files.append(spec)
        else:
            matched = sorted(glob.glob(spec, recursive=True))
            if not matched:
                raise DataError(f"input {spec!r} matches no file or directory; check the path")
            for m in matched:
                files += _walk(m) if os.path.isdir(m) else [m]
    files = list(dict.fromkeys(os.path.abspath(f) for f in files))
    if not files:
        raise DataError(
            f"no input files found in {list(inputs)}; pass .txt/.md/.py/.jsonl/.parquet files, directories or globs"
        )
    return files


def _read_parquet(path: str, text_key: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataError(f"reading {path} needs pyarrow: pip install pyarrow") from e
    pfile = pq.ParquetFile(path)
    if text_key not in pfile.schema_arrow.names:
        raise DataError(f"{path} has no column {text_key!r} (columns: {pfile.schema_arrow.names}); pass --text_key")
    for batch in pfile.iter_batches(columns=[text_key], batch_size=1024):
        yield from (t for t in batch.column(0).to_pylist() if t)


class _Undecodable:
    """Replaces undecodable bytes of a file's text with U+FFFD, counting them; warns at `close` when they exceed
    `UNDECODABLE_WARN` of the `size` bytes read (default: the whole file)."""

    def __init__(self, path: str, size: int | None = None):
        self.path, self.size, self.count = path, size, 0

    def clean(self, text: str) -> str:
        text, n = _UNDECODED.subn("\ufffd", text)
        self.count += n
        return text

    def close(self) -> None:
        size = os.path.getsize(self.path) if self.size is None else self.size
        if size and self.count / size > UNDECODABLE_WARN:
            warnings.warn(
                f"{self.path}: {self.count / size:.0%} of its bytes are not UTF-8 text (a binary file or "
                "another encoding?); they were prepared as U+FFFD replacement characters",
                DataWarning,
            )


def _lines(f, start: int, stop: int | None) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) of the lines of binary file `f` that start in [start, stop) (stop None: to the end).

    A line belongs to the byte range holding its first byte, so consecutive ranges split a file's lines exactly.
    """
    pos = start
    if start > 0:
        f.seek(start - 1)
        pos = start - 1 + len(f.readline())  # skip the rest of the line that began before `start`
    while stop is None or pos < stop:
        line = f.readline()
        if not line:
            return
        yield pos, line
        pos += len(line)


def jsonl_records(path: str, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for every non-blank line of a JSONL file (or of the lines starting in the byte
    range [start, stop); their "line number" is then the byte offset of the line); DataError naming the file (and
    line) if it cannot be read or a line is not JSON. Undecodable bytes are handled as in `_Undecodable`."""
    try:
        f = open(path, "rb")
        size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}; check the path and permissions") from e
    undecodable = _Undecodable(path, (size if stop is None else min(stop, size)) - start)
    with f:
        for lineno, (offset, raw) in enumerate(_lines(f, start, stop), 1):
            line = undecodable.clean(raw.decode("utf-8", errors="surrogateescape"))
            if not line.strip():
                continue
            where = lineno if start == 0 else offset
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}:{_where(start, lineno, offset)}: invalid JSON ({e.msg}); fix or remove the line"
                ) from e
            yield where, value
    undecodable.close()


def _where(start: int, lineno: int, offset: int) -> str:
    return str(lineno) if start == 0 else f"byte {offset}"


def _read_jsonl(path: str, text_key: str, start: int = 0, stop: int | None = None) -> Iterator[str]:
    for where, record in jsonl_records(path, start, stop):
        if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
            place = where if start == 0 else f"byte {where}"
            raise DataError(f"{path}:{place}: no string field {text_key!r}; pass --text_key")
        yield record[text_key]


def splittable(path: str) -> bool:
    """Whether `path` may be read in byte ranges (one document per line: JSONL)."""
    return path.lower().endswith(JSONL_EXTS)


def _read_file(path: str, text_key: str, start: int = 0, stop: int | None = None) -> Iterator[str]:
    low = path.lower()
    if low.endswith(PARQUET_EXTS):
        yield from _read_parquet(path, text_key)
    elif low.endswith(JSONL_EXTS):
        yield from _read_jsonl(path, text_key, start, stop)
    else:
        undecodable = _Undecodable(path)
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = undecodable.clean(f.read())
        undecodable.close()
        yield text


def iter_documents(files: Sequence[str], text_key: str = "text") -> Iterator[tuple[str, str]]:
    """(path, text) for every non-blank document, in file order."""
    return iter_chunk_documents([(path, 0, None) for path in files], text_key)


def iter_chunk_documents(
    chunks: Sequence[tuple[str, int, int | None]], text_key: str = "text"
) -> Iterator[tuple[str, str]]:
    """(path, text) for every non-blank document of the chunks (path, start byte, stop byte or None), in order.

    Only JSONL files are read in byte ranges (the lines starting in [start, stop)); other chunks are whole files.
    """
    for path, start, stop in chunks:
        try:
            for text in _read_file(path, text_key, start, stop):
                if text.strip():
                    yield path, text
        except OSError as e:
            raise DataError(f"cannot read input {path}: {e.strerror or e}; check the path and permissions") from e
