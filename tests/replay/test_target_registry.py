"""The target registry: http opens, sim and grpc are clear extension points."""

from __future__ import annotations

import pytest
from kvfleet.services.replay.http_target import OpenAICompletionsTarget
from kvfleet.services.replay.target import (
    TARGET_FACTORIES,
    TargetUnavailable,
    open_target,
    target_scheme,
)


def test_scheme_of_specs() -> None:
    """If this fails, --target values reach the wrong factory."""
    assert [target_scheme(s) for s in ("http://h:1", "grpc://h:2", "sim", "sim:fleet.yaml")] == [
        "http",
        "grpc",
        "sim",
        "sim",
    ]


async def test_http_spec_opens_completions_target() -> None:
    """If this fails, http://HOST:PORT does not open the OpenAI completions target."""
    target = open_target("http://127.0.0.1:9")
    try:
        assert isinstance(target, OpenAICompletionsTarget)
    finally:
        await target.aclose()


@pytest.mark.parametrize("spec", ["sim", "grpc://127.0.0.1:1"])
def test_unwired_targets_say_what_they_need(spec: str) -> None:
    """If this fails, sim or grpc fail obscurely instead of naming the missing part."""
    with pytest.raises(TargetUnavailable, match="not wired yet"):
        open_target(spec)


def test_unknown_scheme_lists_known_ones() -> None:
    """If this fails, a typo in --target gives no hint of the valid schemes."""
    with pytest.raises(TargetUnavailable, match=r"known: \['grpc', 'http', 'https', 'sim'\]"):
        open_target("htp://x")
    assert set(TARGET_FACTORIES) == {"grpc", "http", "https", "sim"}
