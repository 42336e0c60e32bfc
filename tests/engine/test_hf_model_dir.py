"""`kvfleet model-dir --arch ARCH DIR` writes a checkpoint that transformers loads and agrees
with: same logits, same tokenizer, same chat template rendering."""

from __future__ import annotations

import json

import pytest
import torch
from hf_testkit import hf_logits, paged_logits, random_tokens
from kvfleet.services.cli import main
from kvfleet.services.engine.api.chat_template import render_chat
from kvfleet.services.engine.model.model_dir import ARCHITECTURES
from kvfleet.services.engine.model.registry import ARCHITECTURES as REGISTRY
from kvfleet.services.engine.model.tokenizer import load_model_tokenizer, stop_ids_of
from kvfleet.services.engine.model.weights import load_checkpoint

pytest.importorskip("transformers")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ☕"}]
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


def test_cli_offers_every_registered_architecture():
    assert sorted(ARCHITECTURES) == sorted(REGISTRY)


@pytest.mark.parametrize("arch", sorted(REGISTRY))
def test_written_checkpoint_loads_in_transformers_with_equal_logits(tmp_path, arch):
    """Wrong names, a wrong config key or an unsharded dump would fail or differ here."""
    from transformers import AutoModelForCausalLM

    assert main(["model-dir", "--arch", arch, "--dtype", "float32", str(tmp_path)]) == 0
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ours = load_checkpoint(tmp_path)
    tokens = random_tokens(90, seed=1, vocab=320)
    torch.testing.assert_close(
        paged_logits(ours, tokens, [33]), hf_logits(hf, tokens), atol=2e-5, rtol=1e-4
    )


def test_written_tokenizer_and_template_match_transformers(tmp_path):
    from transformers import AutoTokenizer

    main(["model-dir", "--arch", "Qwen3ForCausalLM", str(tmp_path)])
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert next(load_checkpoint(tmp_path).parameters()).dtype == torch.bfloat16
    hf, ours = AutoTokenizer.from_pretrained(tmp_path), load_model_tokenizer(tmp_path)
    for tools in (None, TOOLS):
        text = hf.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=True,
                                      tokenize=False)  # fmt: skip
        assert (
            render_chat(MESSAGES, ours, tools=tools)
            == hf(text, add_special_tokens=False)["input_ids"]
        )
    assert stop_ids_of(ours) == (258, 256)  # <|im_end|>, <|endoftext|>
    assert ours.decode(ours.encode("Hi ☕")) == "Hi ☕"


def test_written_checkpoint_teaches_the_hermes_tool_syntax_and_a_rank_parses_it(tmp_path):
    """A tiny checkpoint must get its calls parsed like the Qwen models whose template it
    copies; `--tool-call-parser none` must turn that off."""
    from kvfleet.services.engine.config.engine_config import EngineConfig
    from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses

    main(["model-dir", "--arch", "LlamaForCausalLM", str(tmp_path)])
    config = EngineConfig(model_path=str(tmp_path), compute_backend="sim", kv_pages=16)
    assert EngineRank(config, RankAddresses()).tool_family == "hermes"
    assert EngineRank(config, RankAddresses(), tool_call_parser="none").tool_family is None
