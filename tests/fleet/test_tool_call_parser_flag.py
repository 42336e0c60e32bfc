"""`--tool-call-parser` reaches the OpenAI app of `kvfleet router` and `kvfleet up`: a flag
that is parsed but not passed on leaves every call of the fleet as text."""

from __future__ import annotations

import json

from kvfleet.services.cli import build_parser
from kvfleet.services.engine.model.tokenizer import byte_tokenizer_json
from kvfleet.services.fleet.router_command import start_front
from kvfleet.services.fleet.up import fleet_config


def front_family(*flags: str) -> str | None:
    args = build_parser().parse_args(["router", "--host", "127.0.0.1", "--http-port", "0", *flags])
    front = start_front(args, grpc_port=1)  # the app is built without a router to call
    try:
        return front.tool_family
    finally:
        front.stop()


def test_router_front_takes_the_flag_or_reads_the_checkpoints_template(tmp_path):
    # A checkpoint's tokenizer files, with a template that asks for <tool_call> blocks.
    template = "{{ messages[0].content }} Answer calls in <tool_call></tool_call> tags."
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert front_family("--model-path", str(tmp_path)) == "hermes"
    assert front_family("--model-path", str(tmp_path), "--tool-call-parser", "mistral") == "mistral"
    assert front_family("--model-path", str(tmp_path), "--tool-call-parser", "none") is None
    assert front_family() is None  # the presets' byte tokenizer has no template


def test_up_passes_the_flag_to_its_fleet():
    args = build_parser().parse_args(["up", "--tool-call-parser", "qwen3_coder"])
    assert fleet_config(args).tool_call_parser == "qwen3_coder"
    assert fleet_config(build_parser().parse_args(["up"])).tool_call_parser == "auto"
