"""How long an admitted request takes to reach its rank, and to be admitted there: the fleet's
host path per request.

On a live fleet a request's first step starts well after its rank's slot frees. Two parts:

- the path to the rank (`dispatch_seconds`): the router's release and admission pass, the
  prompt's token ids over gRPC, and for a conversation's next turn the client's round trip.
  The rank keeps stepping meanwhile; the slot stays reserved.
- the engine's add and admission on its core thread (`admission_seconds`): the prompt's pages
  hashed and matched, pages taken, the host tier's pages onboarded. The core thread runs no
  step meanwhile, so the rank's other sequences wait: the step that admits the request starts
  that much later.

The step logs of the H100 fleet replay show both (docs/sim-vs-live.md, "Twelfth look"): when
a request is admitted while another sequence decodes, the rank runs a median 32 ms of decode
steps after the freed slot (the path, with no trend in the prompt's length), then no step for
a median 30 ms with nothing onboarded and 0.19 ms more per page onboarded from the host tier
(up to a second and more at 5,000 pages). `hardware.dispatch_ms` and `dispatch_ms_per_ktoken`
give the path; `admit_ms`, `admit_ms_per_host_page` and `admit_ms_per_disk_page` the
admission (a disk-tier block is read and checked on the core thread too).
"""

from __future__ import annotations

from ..core.cost_figures import Hardware


def dispatch_seconds(hardware: Hardware, prompt_tokens: int) -> float:
    """Seconds from the router's admission to the rank's queue for a prompt of this length."""
    return (hardware.dispatch_ms + hardware.dispatch_ms_per_ktoken * prompt_tokens / 1e3) / 1e3


def admission_seconds(
    hardware: Hardware, admitted: int, host_pages: int, disk_pages: int = 0
) -> float:
    """Seconds the rank's host spends admitting `admitted` requests that onboard `host_pages`
    pages from the host tier and `disk_pages` from the disk tier, before the step that admits
    them can start."""
    return (
        hardware.admit_ms * admitted
        + hardware.admit_ms_per_host_page * host_pages
        + hardware.admit_ms_per_disk_page * disk_pages
    ) / 1e3


def piece_seconds(hardware: Hardware, host_pages: int, disk_pages: int) -> float:
    """Seconds the rank's host spends bringing a piece of a waiting request's prefix up (no
    admission: its pages only, a host page at the piece's own figure where one is given)."""
    per_host_page = hardware.piece_ms_per_host_page or hardware.admit_ms_per_host_page
    return (per_host_page * host_pages + hardware.admit_ms_per_disk_page * disk_pages) / 1e3
