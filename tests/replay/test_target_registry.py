"""The target registry: http, grpc and sim open their targets; bad specs say why."""

from __future__ import annotations

import pytest
from kvfleet.services.replay.http_target import OpenAICompletionsTarget
from kvfleet.services.replay.target import TARGET_FACTORIES, open_target, target_scheme
from kvfleet.services.replay.target_types import TargetUnavailable


def test_scheme_of_specs() -> None:
    """If this fails, --target values reach the wrong factory."""
    assert [
        target_scheme(s) for s in ("http://h:1", "grpc://h:2", "sim", "sim:f.yaml", "sim?ranks=2")
    ] == [
        "http",
        "grpc",
        "sim",
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


@pytest.mark.parametrize(
    ("spec", "match"),
    [("sim?rankz=2", "sim option 'rankz' unknown"), ("sim:/no/such.yaml", "No such file")],
)
def test_bad_sim_specs_say_why(spec: str, match: str) -> None:
    """If this fails, a mistyped sim option or file fails obscurely instead of naming it."""
    with pytest.raises(TargetUnavailable, match=match):
        open_target(spec)


def test_unknown_scheme_lists_known_ones() -> None:
    """If this fails, a typo in --target gives no hint of the valid schemes."""
    with pytest.raises(TargetUnavailable, match=r"known: \['grpc', 'http', 'https', 'sim'\]"):
        open_target("htp://x")
    assert set(TARGET_FACTORIES) == {"grpc", "http", "https", "sim"}
