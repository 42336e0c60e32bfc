"""The reuse section of a fleet: CRD schema, operator checks, and what reaches engine.yaml."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from kvfleet.operator.names import FleetRef
from kvfleet.operator.render_config import config_hash, engine_config, render_engine_configmap
from kvfleet.operator.spec import SpecError, parse_spec
from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict
from operator_testkit import crd_schema

MODEL = {"name": "m", "path": "/m"}
FLEET = FleetRef("f", "ns", "uid")


def reuse_schema() -> dict:
    """The CRD's schema of spec.reuse."""
    return crd_schema()["properties"]["spec"]["properties"]["reuse"]


def test_defaults_render_the_engine_defaults():
    """A fleet that says nothing must render keep_root false and the two branch points that
    hold the tools' and the system prompt's ends."""
    reuse = engine_config(parse_spec({"model": MODEL}), "generation")["reuse"]
    assert reuse == {
        "policy": "per_conversation",
        "max_num_turns": 5,
        "checkpoint": True,
        "keep_root": False,
        "keep_branch_points": 2,
    }


def test_options_reach_every_pool_engine_yaml_and_the_engine_reads_them():
    """keepRoot/keepBranchPoints must land in each pool's engine.yaml as the engine reads it."""
    spec = parse_spec(
        {"model": MODEL, "reuse": {"maxNumTurns": 5, "keepRoot": True, "keepBranchPoints": 2}}
    )
    [configmap] = render_engine_configmap(FLEET, spec, {"context": 1, "generation": 1})
    assert sorted(configmap["data"]) == ["context.yaml", "generation.yaml"]
    for text in configmap["data"].values():
        rendered = yaml.safe_load(text)
        assert rendered["reuse"]["keep_root"] is True
        assert rendered["reuse"]["keep_branch_points"] == 2
        engine = engine_config_from_dict(rendered)
        assert (engine.max_num_turns, engine.keep_root, engine.keep_branch_points) == (5, True, 2)


def test_changing_branch_points_rolls_the_pools():
    """A new keepBranchPoints must change the config hash in the pod template."""
    before = parse_spec({"model": MODEL})
    after = parse_spec({"model": MODEL, "reuse": {"keepBranchPoints": 1}})
    assert config_hash(before, "generation") != config_hash(after, "generation")


def test_crd_accepts_the_retention_options():
    """The CRD must admit keepRoot true and keepBranchPoints 1 under reuse."""
    jsonschema.Draft4Validator(reuse_schema()).validate({"keepRoot": True, "keepBranchPoints": 1})


@pytest.mark.parametrize(
    "reuse", [{"keepBranchPoints": -1}, {"keepBranchPoints": 1.5}, {"keepRoot": "yes"}]
)
def test_crd_rejects_bad_retention_options(reuse):
    """The API server must refuse a negative/fractional keepBranchPoints or a non-bool keepRoot."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(reuse_schema()).validate(reuse)


def test_operator_rejects_negative_branch_points_with_the_number():
    """Without the API server's schema the operator must still refuse keepBranchPoints -1."""
    with pytest.raises(SpecError, match=r"reuse\.keepBranchPoints: .*greater than or equal to 0"):
        parse_spec({"model": MODEL, "reuse": {"keepBranchPoints": -1}})


@pytest.mark.parametrize("policy", ["per_request", "all_reusable"])
def test_retention_options_need_per_conversation(policy):
    """keepRoot/keepBranchPoints under a policy that keeps no turns must be an InvalidSpec."""
    reuse = {"policy": policy, "keepRoot": True, "keepBranchPoints": 1}
    with pytest.raises(SpecError) as raised:
        parse_spec({"model": MODEL, "reuse": reuse})
    assert str(raised.value) == (
        "spec.reuse.keepRoot=true, keepBranchPoints=1: only policy per_conversation keeps turns"
        f" (got {policy})"
    )


def test_other_policies_run_with_the_options_off():
    """per_request with both options at their defaults must stay a valid spec (the branch
    points' default is per_conversation's only), as must an explicit 0."""
    for reuse in ({"policy": "per_request"}, {"policy": "per_request", "keepBranchPoints": 0}):
        rendered = engine_config(parse_spec({"model": MODEL, "reuse": reuse}), "generation")
        assert rendered["reuse"]["policy"] == "per_request"
        assert rendered["reuse"]["keep_branch_points"] == 0
