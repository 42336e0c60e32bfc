"""The KV cache's element type, chosen per fleet: `auto` (the model's own dtype), `bf16`, or
`fp8_e4m3` (one byte per element: twice the pages in the same bytes).

No torch here: the simulator sizes pages from these names alone.
"""

from __future__ import annotations

from ...kvstore.tiers.layout import DTYPE_BYTES

# Fleet setting -> the torch dtype name the pages are kept in (None: the model's dtype).
KV_CACHE_DTYPES: dict[str, str | None] = {
    "auto": None,
    "bf16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn",
}


def check_kv_cache_dtype(choice: str, field: str = "kv_cache_dtype") -> str:
    """`choice` if it is a known setting, else a ValueError naming `field` and the choices."""
    if choice not in KV_CACHE_DTYPES:
        raise ValueError(f"{field} must be one of {sorted(KV_CACHE_DTYPES)}, got {choice!r}")
    return choice


def kv_dtype_name(choice: str, model_dtype: str) -> str:
    """The torch dtype name (`float8_e4m3fn`, ...) of the pages for setting `choice` on a model
    whose weights are in `model_dtype` (a torch dtype name)."""
    return KV_CACHE_DTYPES[check_kv_cache_dtype(choice)] or model_dtype


def kv_dtype_bytes(choice: str, model_dtype_bytes: int) -> int:
    """Bytes of one K/V element for setting `choice` (`auto`: the model's own)."""
    name = KV_CACHE_DTYPES[check_kv_cache_dtype(choice)]
    return DTYPE_BYTES[name] if name else model_dtype_bytes
