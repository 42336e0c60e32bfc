"""The registry that opens a target from a `--target` spec (types: `target_types.py`).

A target serves `generate(conversation_id, tokens, max_tokens)`; turns of one conversation share
the id so that a router can keep them on one rank. Factories are registered per scheme: `http`
(OpenAI completions), `grpc` (the router's Generate stream) and `sim` (a simulated fleet).
"""

from __future__ import annotations

from .target_types import Target, TargetFactory, TargetOptions, TargetUnavailable

HTTP_APIS = ("completions", "chat", "anthropic", "text")


def _open_http(spec: str, options: TargetOptions) -> Target:
    """The http target of `options.api`: token ids to /v1/completions, the same content as a
    text chat to /v1/chat/completions or Anthropic's /v1/messages, or the ids as ASCII text to
    /v1/completions."""
    common = {"model": options.model, "timeout_s": options.request_timeout_s}
    if options.api == "chat":
        from .chat_target import OpenAIChatTarget

        return OpenAIChatTarget(spec, **common)
    if options.api == "anthropic":
        from .messages_target import AnthropicMessagesTarget

        return AnthropicMessagesTarget(spec, session=options.anthropic_session, **common)
    if options.api == "text":
        from .text_target import TextCompletionsTarget

        return TextCompletionsTarget(spec, **common)
    if options.api != "completions":
        raise TargetUnavailable(f"--api {options.api!r}: not one of {HTTP_APIS}")
    from .http_target import OpenAICompletionsTarget

    return OpenAICompletionsTarget(spec, **common)


def _open_grpc(spec: str, options: TargetOptions) -> Target:
    from .grpc_target import RouterGenerateTarget

    return RouterGenerateTarget(spec, timeout_s=options.request_timeout_s)


def _open_sim(spec: str, options: TargetOptions) -> Target:
    from .sim_config import SimConfigError
    from .sim_target import open_sim_target

    try:
        return open_sim_target(spec, options)
    except (SimConfigError, OSError) as error:
        raise TargetUnavailable(f"target {spec!r}: {error}") from error


# Scheme -> factory. The scheme is what precedes "://" (or the whole spec, as in "sim").
TARGET_FACTORIES: dict[str, TargetFactory] = {
    "http": _open_http,
    "https": _open_http,
    "grpc": _open_grpc,
    "sim": _open_sim,
}


def target_scheme(spec: str) -> str:
    """The registry key of a spec: 'http' for 'http://h:p'; 'sim' for 'sim', 'sim:f', 'sim?k=v'."""
    if "://" in spec:
        return spec.split("://", 1)[0]
    return spec.split(":", 1)[0].split("?", 1)[0]


def open_target(spec: str, options: TargetOptions | None = None) -> Target:
    """Open the target a spec names."""
    options = options or TargetOptions()
    scheme = target_scheme(spec)
    factory = TARGET_FACTORIES.get(scheme)
    if factory is None:
        raise TargetUnavailable(
            f"target {spec!r}: unknown scheme {scheme!r}; known: {sorted(TARGET_FACTORIES)}"
        )
    if options.api != "completions" and scheme not in ("http", "https"):
        # Only an HTTP server has those APIs; replaying token ids instead would mislabel the run.
        raise TargetUnavailable(f"target {spec!r}: --api {options.api} needs an http:// target")
    return factory(spec, options)
