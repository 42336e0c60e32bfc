"""A request's sequences (`samples_of`): one per sample, their keys, seeds and parent."""

from __future__ import annotations

from kvfleet.services.engine.core.request_samples import samples_of
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.engine.request.sampling_params import SamplingParams


def test_children_follow_the_parent_with_seeds_of_their_own():
    """Children sharing the parent's seed sample the same tokens; without their parent they
    recompute its prompt."""
    sampling = SamplingParams(temperature=1.0, seed=11)
    parent, *children = samples_of(GenerateCall("r", (1, 2), sampling, num_samples=3), 5.0)
    assert [s.key for s in (parent, *children)] == ["r#0", "r#1", "r#2"]
    assert [s.sampling.seed for s in (parent, *children)] == [11, 12, 13]
    assert parent.parent is None and all(child.parent is parent for child in children)
    assert all(s.generator is not None and s.arrived_at == 5.0 for s in (parent, *children))


def test_a_greedy_sample_needs_no_generator_and_a_count_overrides_num_samples():
    """A hand-off decodes one sample of a call however many it asked for."""
    (only,) = samples_of(GenerateCall("g", (1,), SamplingParams(), num_samples=2), 0.0, count=1)
    assert (only.key, only.generator, only.grammar, only.sampling.seed) == ("g#0", None, None, None)
