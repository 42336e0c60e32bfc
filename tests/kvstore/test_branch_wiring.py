"""keep_root / keep_branch_points reach the kvstore policy and sizing from the sim and engine."""

from kvfleet.kvstore.policies import PerConversation
from kvfleet.services.engine.compute.backends import resolve_model_config
from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict
from kvfleet.services.engine.kv.kv_setup import kvstore_config, typical_step
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_fleet import SimFleet


def test_engine_yaml_reuse_options_build_the_policy_and_count_its_records():
    """engine.yaml's reuse.keep_root / keep_branch_points would be ignored or left unsized."""
    config = engine_config_from_dict(
        {
            "max_batch_size": 2,
            "reuse": {
                "policy": "per_conversation",
                "max_num_turns": 3,
                "keep_root": True,
                "keep_branch_points": 1,
            },
        }
    )
    model = resolve_model_config(config)
    # The engine plans branch points only where requests hint them (discovery off).
    assert kvstore_config(model, config).reuse_policy == PerConversation(3, True, 1, False)
    step = typical_step(model, config)
    assert (step.retained_turns, step.branch_points, step.branch_records) == (2 * 5, True, 2)


def test_engine_without_retention_sizes_no_retained_turns():
    """per_request retains nothing; counting max_num_turns there would waste window pages."""
    config = engine_config_from_dict({"reuse": {"policy": "per_request", "keep_root": True}})
    step = typical_step(resolve_model_config(config), config)
    assert (step.retained_turns, step.branch_points, step.branch_records) == (0, False, 0)


def test_sim_query_options_reach_every_rank_policy():
    """The sim's keep_root / keep_branch_points options would not change what ranks retain."""
    overrides = {"ranks": "2", "max_num_turns": "5", "keep_root": "on", "keep_branch_points": "1"}
    fleet = SimFleet(load_sim_config(None, overrides))
    policies = {rank.manager.config.reuse_policy for rank in fleet.ranks.values()}
    assert policies == {PerConversation(5, True, 1, False)}
