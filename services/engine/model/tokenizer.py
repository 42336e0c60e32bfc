"""Tokenizers: a byte-level default that works with no files, and a local `tokenizer.json`.

`load_model_tokenizer(DIR)` reads a Hugging Face model directory the way transformers does:
`tokenizer.json` (through `tokenizers`), the special tokens and `chat_template` of
`tokenizer_config.json` (or `chat_template.jinja` / `chat_template.json`, as newer
transformers saves them), and `generation_config.json`'s `eos_token_id` (one id or a list),
which become the stop tokens of every request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# The named special tokens transformers passes to a chat template (its special_tokens_map).
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip

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

    def to_json(self) -> str:
        """The vocabulary as a `tokenizers` JSON (what the grammar library builds masks from)."""
        ...


def stop_ids_of(tokenizer: Tokenizer) -> tuple[int, ...]:
    """Tokens that end a generation: the model's stop ids, else the tokenizer's eos."""
    stops = tuple(getattr(tokenizer, "stop_ids", ()) or ())
    eos = getattr(tokenizer, "eos_id", None)
    return stops or ((eos,) if eos is not None else ())


def byte_to_unicode() -> dict[int, str]:
    """The byte-level pre-tokenizer's printable stand-in for each byte (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer_json(special_tokens: tuple[str, ...] = BYTE_SPECIAL_TOKENS) -> str:
    """A `tokenizers` JSON whose ids are the UTF-8 bytes, then `special_tokens`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in byte_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(special_tokens))
    return tokenizer.to_str()


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

    def to_json(self) -> str:
        """This vocabulary as a `tokenizers` JSON (what the grammar library reads)."""
        return byte_tokenizer_json(self.special_tokens)


class JsonTokenizer:
    """A local `tokenizer.json` (Hugging Face `tokenizers`); nothing is downloaded."""

    def __init__(
        self,
        path: str | Path,
        bos: str | None = None,
        eos: str | None = None,
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
        stop_ids: tuple[int, ...] = (),
    ) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        self._tok = HFTokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_id = self._token_id(bos)
        self.eos_id = self._token_id(eos)
        self.chat_template = chat_template
        # bos_token, eos_token, ... as strings: what a chat template sees.
        self.special_tokens = dict(special_tokens or {})
        self.stop_ids = tuple(stop_ids) or ((self.eos_id,) if self.eos_id is not None else ())
        # Named special_token_ids, not special_ids: the built-in chat format keeps writing `role: `
        # markers for local tokenizer.json files (peers render the same prompt text).
        self.special_token_ids = {
            t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special
        }

    def _token_id(self, token: str | None) -> int | None:
        if not token:
            return None
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"special token {token!r} is not in the tokenizer's vocabulary")
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; special tokens are left out."""
        return self._tok.decode(ids, skip_special_tokens=True)

    def to_json(self) -> str:
        """The `tokenizers` JSON (what the grammar library reads)."""
        return self._tok.to_str()


def tokenizer_for_model(model_path: str | Path | None) -> Tokenizer:
    """The tokenizer of a model directory that has a tokenizer.json, else the byte tokenizer."""
    if model_path and (Path(model_path) / "tokenizer.json").is_file():
        return load_model_tokenizer(model_path)
    return ByteTokenizer()


def load_tokenizer(path: str | Path | None = None, **kwargs: str) -> Tokenizer:
    """The tokenizer at `path` (a `tokenizer.json`), or the byte tokenizer when `path` is None."""
    if path is None:
        return ByteTokenizer()
    return JsonTokenizer(path, **kwargs)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def read_chat_template(directory: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The default chat template: chat_template.jinja, chat_template.json, or the config's
    `chat_template` (a string, or a list of {name, template} of which "default" is used)."""
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text()
    template = _read_json(directory / "chat_template.json").get("chat_template")
    template = template or tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ValueError(f"{directory}: chat templates {sorted(named)} have no 'default'")
        template = named["default"]
    return template


def _generation_stop_ids(directory: Path) -> tuple[int, ...]:
    eos = _read_json(directory / "generation_config.json").get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(i) for i in (eos if isinstance(eos, list) else [eos]))


def load_model_tokenizer(directory: str | Path) -> JsonTokenizer:
    """The tokenizer of a Hugging Face model directory (see the module docstring)."""
    directory = Path(directory)
    config = _read_json(directory / "tokenizer_config.json")
    specials = {**_read_json(directory / "special_tokens_map.json"), **config}
    names = {name: _token_text(specials.get(name)) for name in SPECIAL_TOKEN_NAMES}
    names = {name: text for name, text in names.items() if text}
    return JsonTokenizer(
        directory / "tokenizer.json",
        bos=names.get("bos_token"),
        eos=names.get("eos_token"),
        chat_template=read_chat_template(directory, config),
        special_tokens=names,
        stop_ids=_generation_stop_ids(directory),
    )
