"""What an engine core does per role, from a registry (no role checks inside the core).

| role         | after a sample's first token           | receives hand-offs |
|--------------|----------------------------------------|--------------------|
| `both`       | keeps decoding                         | yes                |
| `context`    | parks single-sample requests (hand-off) | yes                |
| `generation` | keeps decoding (plain requests)        | yes                |

Every rank can receive a hand-off (`GenerationSide`) and pull a moved turn's prefix from its
home (`PrefixPull`); only the router decides who gets one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core.model_disk import model_disk_root
from .blocks import kv_layout
from .context_side import HANDOFF_REASON, ContextSide
from .disk_handoff import DiskHandoff
from .generation_side import GenerationSide
from .grpc_pull import GrpcPull
from .prefix_pull import PrefixPull
from .transport_types import TransportContext
from .transports import build_transports

log = logging.getLogger(__name__)


def handoff_disk_root(core) -> str:
    """The shared disk tier's folder for this model ('' without a disk tier): hand-off files
    are the tier's block files, so a rank's tier can match them too."""
    if not core.config.disk_tier_dir:
        return ""
    config = core.config
    return model_disk_root(
        config.disk_tier_dir, core.model_config.name, config.model_path, config.seed
    )


class AggregatedRole:
    """Decode where the prefill ran."""

    name = "both"

    def __init__(self, core) -> None:
        self.core = core
        self._receiver: GenerationSide | None = None
        config = core.config
        self.prefix_pull = PrefixPull(
            core,
            GrpcPull(tuple(core.manager.life_cycles)),
            config.handoff_timeout_seconds,
            config.handoff_hold_seconds,
        )

    def after_first_token(self, sequence, output) -> bool:
        """True when the role took the request over (the core then forgets it)."""
        return False

    def tick(self) -> None:
        """Once per core loop (expiry of holds)."""

    def receiver(self) -> GenerationSide:
        """The rank's hand-off receiver, built on first use (it opens connections)."""
        if self._receiver is None:
            config = self.core.config
            cache = self.core.compute.cache
            context = TransportContext(
                tuple(self.core.manager.life_cycles), kv_layout(cache), handoff_disk_root(self.core)
            )
            transports = build_transports(config.handoff_transports, context)
            self._receiver = GenerationSide(self.core, transports, config.handoff_timeout_seconds)
        return self._receiver

    def close(self) -> None:
        """Release what the role holds (the core is stopping)."""
        if self._receiver is not None:
            for transport in self._receiver.transports:
                transport.close()
        self.prefix_pull.transport.close()


class ContextRole(AggregatedRole):
    """Prefill, then park single-sample requests for a generation rank to pull."""

    name = "context"

    def __init__(self, core) -> None:
        super().__init__(core)
        config = core.config
        disk = None
        if config.disk_tier_dir and "disk" in config.handoff_transports:
            try:
                disk = DiskHandoff(handoff_disk_root(core), kv_layout(core.compute.cache))
            except OSError as error:
                log.warning("hand-off disk %s unusable (%s)", config.disk_tier_dir, error)
        self.side = ContextSide(core, config.handoff_hold_seconds, disk)

    def after_first_token(self, sequence, output) -> bool:
        call = sequence.call
        if call.num_samples != 1 or len(sequence.output) != 1:
            return False
        handoff = type(output)(
            output.request_id,
            output.sample_index,
            output.token_ids,
            True,
            HANDOFF_REASON,
            self.core.usage_of(sequence),
        )
        self.side.park(sequence, handoff)
        return True

    def tick(self) -> None:
        self.side.tick()

    def close(self) -> None:
        self.side.close()
        super().close()


ROLE_HOOKS: dict[str, Callable[[object], AggregatedRole]] = {
    "both": AggregatedRole,
    "generation": AggregatedRole,
    "context": ContextRole,
}
