"""The device tier's bytes: K and V pages of every layer, one allocation per life cycle.

Page `p` of a life cycle's pool is row `p` of each of its layers' K and V tensors, so the page
ids the manager hands out index these tensors directly (page 0, NULL_PAGE, is scratch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .layout import KVLayout


def default_device() -> torch.device:
    """`cuda` where present, else `cpu`."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class DeviceKV:
    """Per life cycle one tensor `[layers, 2, num_pages, page_size, kv_heads, head_dim]` (a
    state life cycle's: `[layers, 1, num_pages, 1, 1, elements]`, see `KVLayout`)."""

    def __init__(
        self, layout: KVLayout, num_pages: Mapping[str, int], device: torch.device | str
    ) -> None:
        missing = sorted(set(layout.layers) - set(num_pages))
        if missing:
            raise ValueError(f"no page count for life cycles {missing}")
        self.layout = layout
        self.device = torch.device(device)
        self.dtype = getattr(torch, layout.dtype)
        # NOTE: zeros, not empty: kernels that load whole pages multiply masked rows by zero,
        # and garbage NaNs there would still poison the output.
        self._storage = {
            name: torch.zeros(
                _with_pages(layout.page_shape(name), num_pages[name]),
                dtype=self.dtype,
                device=self.device,
            )
            for name in layout.layers
        }

    def storage(self, life_cycle: str) -> torch.Tensor:
        """The whole allocation of one life cycle (for copies and tests)."""
        return self._storage[life_cycle]

    def gather(self, life_cycle: str, pages: Sequence[int]) -> torch.Tensor:
        """A contiguous copy `[len(pages), layers, 2, page_size, kv_heads, head_dim]`."""
        index = torch.tensor(pages, dtype=torch.long).to(self.device, non_blocking=True)
        picked = self._storage[life_cycle].index_select(2, index)
        return picked.permute(2, 0, 1, 3, 4, 5).contiguous()

    def scatter(self, life_cycle: str, pages: Sequence[int], data: torch.Tensor) -> None:
        """Write `data` (as `gather` returns it, on this device) into `pages`."""
        index = torch.tensor(pages, dtype=torch.long).to(self.device, non_blocking=True)
        storage, data = self._storage[life_cycle], data.permute(1, 2, 0, 3, 4, 5)
        if storage.dtype.itemsize == 1:  # NOTE: index_copy_ has no fp8 kernel on CPU
            storage, data = storage.view(torch.uint8), data.view(torch.uint8)
        storage.index_copy_(2, index, data)


def _with_pages(page_shape: tuple[int, ...], num_pages: int) -> tuple[int, ...]:
    """A pool's tensor shape: the page count after the layer and K/V dimensions."""
    return (*page_shape[:2], num_pages, *page_shape[2:])
