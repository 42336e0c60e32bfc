"""Model config validation, layer groups and presets."""

from __future__ import annotations

import pytest
from engine_helpers import small_config
from kvfleet.services.engine.config.model_config import ModelConfig, preset


def test_presets_have_the_advertised_shapes():
    """The GPU bench numbers mean something only for the real 1B and 8B shapes."""
    assert preset("1b").num_parameters() == pytest.approx(1.24e9, rel=0.02)
    assert preset("8b").num_parameters() == pytest.approx(8.03e9, rel=0.02)
    assert preset("tiny").groups == {"full": (0, 2), "window": (1,)}


def test_unknown_preset_is_refused():
    """A typo in a model name must list the known ones."""
    with pytest.raises(
        ValueError,
        match=r"unknown model preset 'huge'; known: \['1b', '8b', 'hybrid-8b', 'hybrid-small', "
        r"'hybrid-tiny', 'tiny'\]",
    ):
        preset("huge")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_heads": 6, "num_kv_heads": 4}, "num_heads=6 is not a multiple of num_kv_heads=4"),
        ({"window_layers": (5,)}, r"window_layers \[5\] outside 0..2"),
        ({"window_layers": (1,), "window_size": 0}, "window_layers need window_size > 0"),
        ({"head_dim": 7}, "head_dim=7 must be even"),
        ({"hidden_size": 0}, "hidden_size must be positive"),
    ],
)
def test_invalid_configs_are_refused(changes, message):
    """A malformed shape must fail at config time, not deep in a forward."""
    with pytest.raises(ValueError, match=message):
        small_config().with_changes(**changes)


def test_dict_round_trip():
    """A checkpoint's config.json must give back the same config."""
    config = small_config(window=8)
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert config.layer_window(1) == 8 and config.layer_window(0) is None
