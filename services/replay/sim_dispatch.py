"""How long an admitted request takes to reach its rank: the fleet's host path per request.

On a live fleet a request's first step starts well after its rank's slot frees: the router's
release and admission pass, the prompt's token ids over gRPC, the engine's add (its pages
hashed and matched), and for a conversation's next turn the client's round trip too. Each
walks the prompt in Python, so the delay grows with its length.
The step logs of the H100 fleet replay show it (`bench/step_mix.py --starts`): a rank's slot
that frees starts its next request 34 ms later at 16-32k tokens and 95 ms at 112-128k (lower
quartiles), where the simulator started it at once. `hardware.dispatch_ms` and
`dispatch_ms_per_ktoken` give the delay; the slot stays reserved while it runs.
"""

from __future__ import annotations

from ..core.cost_figures import Hardware


def dispatch_seconds(hardware: Hardware, prompt_tokens: int) -> float:
    """Seconds from the router's admission to the rank's queue for a prompt of this length."""
    return (hardware.dispatch_ms + hardware.dispatch_ms_per_ktoken * prompt_tokens / 1e3) / 1e3
