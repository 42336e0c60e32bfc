"""Byte tokenizer by default; a local tokenizer.json through `tokenizers`."""

from __future__ import annotations

import pytest
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.model.tokenizer import ByteTokenizer, JsonTokenizer, load_tokenizer


@pytest.mark.parametrize("text", ["", "hello", "naïve café ☕ 日本語", "a\nb\tc\x00"])
def test_byte_tokenizer_round_trip(text):
    """Text must come back unchanged, or prompts and outputs would be corrupted."""
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_byte_tokenizer_specials_follow_bytes_and_are_dropped_on_decode():
    """Special ids must not collide with bytes nor leak into output text."""
    tok = ByteTokenizer()
    assert (tok.bos_id, tok.eos_id) == (256, 257)
    assert tok.decode([tok.bos_id, 104, 105, tok.eos_id]) == "hi"


def test_tiny_preset_vocab_holds_the_byte_tokenizer():
    """The default model must accept every id the default tokenizer produces."""
    assert preset("tiny").vocab_size >= ByteTokenizer().vocab_size


def test_default_is_the_byte_tokenizer():
    """Text must work out of the box, with no files."""
    assert isinstance(load_tokenizer(), ByteTokenizer)


def test_local_tokenizer_json_round_trip(tmp_path):
    """A local tokenizer.json must load with no download and round-trip text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the cat sat on the mat", "the dog sat"] * 10, trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    loaded = load_tokenizer(path, eos="<eos>")
    assert isinstance(loaded, JsonTokenizer)
    assert loaded.eos_id == 1
    assert loaded.decode(loaded.encode("the cat sat")) == "the cat sat"


def test_missing_tokenizer_file_is_refused(tmp_path):
    """A wrong path must say which file is missing."""
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        load_tokenizer(tmp_path / "tokenizer.json")
