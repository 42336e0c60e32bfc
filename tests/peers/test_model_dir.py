"""The weightless model directory that peer routers load their tokenizer from."""

from __future__ import annotations

import dataclasses

import pytest
from kvfleet.services.engine.compute.backends import resolve_model_config
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.model.model_dir import write_model_dir
from kvfleet.services.engine.model.tokenizer import ByteTokenizer, JsonTokenizer
from peers_testkit import SIM_CONFIG, tiny_model_dir


def test_tokenizer_json_gives_the_byte_tokenizer_ids(tmp_path):
    """A router tokenising differently from the engine would match prefixes that differ."""
    tokenizer = JsonTokenizer(tiny_model_dir(tmp_path) / "tokenizer.json")
    text = "héllo\n\t wörld ~\x01"
    assert tokenizer.encode(text) == ByteTokenizer().encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.vocab_size == ByteTokenizer().vocab_size


def test_special_tokens_keep_the_byte_tokenizer_ids(tmp_path):
    """Special ids out of place would let a stop token land inside prompts."""
    tokenizer = JsonTokenizer(tiny_model_dir(tmp_path) / "tokenizer.json", eos="<|eos|>")
    assert tokenizer.eos_id == ByteTokenizer().eos_id == 257


def test_config_json_loads_back_as_the_same_model(tmp_path):
    """The engine must see the preset's shape through `model_path` (limits, vocabulary)."""
    model_dir = tiny_model_dir(tmp_path)
    config = dataclasses.replace(SIM_CONFIG, model_path=str(model_dir))
    assert resolve_model_config(config) == preset("tiny")


def test_a_vocabulary_smaller_than_the_bytes_is_refused(tmp_path):
    """Token ids past the model's vocabulary would be rejected on every request."""
    small = preset("tiny").with_changes(vocab_size=200)
    with pytest.raises(ValueError, match="vocab_size 200 < 261"):
        write_model_dir(tmp_path / "m", small)


def test_model_dir_command_writes_a_loadable_directory(tmp_path):
    """`kvfleet model-dir` is how operators make a --model-path for sim ranks and peers."""
    from kvfleet.services.cli import main

    assert (
        main(["model-dir", str(tmp_path / "m"), "--model", "8b", "--max-model-len", "40000"]) == 0
    )
    config = dataclasses.replace(SIM_CONFIG, model_path=str(tmp_path / "m"))
    assert resolve_model_config(config) == preset("8b").with_changes(max_position=40000)
    assert (tmp_path / "m" / "tokenizer.json").is_file()
