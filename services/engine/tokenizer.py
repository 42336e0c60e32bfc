"""Tokenizers: a byte-level default that works with no files, and a local `tokenizer.json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

BYTE_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    "<|user|>",
    "<|assistant|>",
)


class Tokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; special tokens are left out."""
        ...


@dataclass
class ByteTokenizer:
    """Ids 0..255 are the UTF-8 bytes; the special tokens follow them."""

    special_tokens: tuple[str, ...] = BYTE_SPECIAL_TOKENS
    special_ids: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.special_ids = {tok: 256 + i for i, tok in enumerate(self.special_tokens)}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.special_tokens)

    @property
    def bos_id(self) -> int:
        return self.special_ids["<|bos|>"]

    @property
    def eos_id(self) -> int:
        return self.special_ids["<|eos|>"]

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of `text`."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes back to text; special and out-of-range ids are dropped, bad UTF-8 replaced."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class JsonTokenizer:
    """A local `tokenizer.json` (Hugging Face `tokenizers`); nothing is downloaded."""

    def __init__(self, path: str | Path, bos: str | None = None, eos: str | None = None) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        self._tok = HFTokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_id = self._tok.token_to_id(bos) if bos else None
        self.eos_id = self._tok.token_to_id(eos) if eos else None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; special tokens are left out."""
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(path: str | Path | None = None, **kwargs: str) -> Tokenizer:
    """The tokenizer at `path` (a `tokenizer.json`), or the byte tokenizer when `path` is None."""
    if path is None:
        return ByteTokenizer()
    return JsonTokenizer(path, **kwargs)
