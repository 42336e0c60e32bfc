"""What an engine rank does for the operator: report the drain mark in its heartbeat, and
expose the two gauges the autoscaler reads (names are a contract: docs/operator.md)."""

from __future__ import annotations

import urllib.request

import pytest
from engine_testkit import TEST_CONFIG, wait_until
from kvfleet.operator.metrics import KV_USAGE, RETAINED, metric_sums
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.rank.cli import register
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.engine.rank.podinfo import PodInfo, parse_annotations
from kvfleet.services.engine.request.engine_request import EngineLoad, GenerateCall
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.server import RouterConfig, create_server

# What the kubelet writes for metadata.annotations: sorted `key="value"` lines, Go-quoted.
DOWNWARD_API_FILE = (
    'kubectl.kubernetes.io/note="a \\"quoted\\" word\\nand a line"\n'
    'kvfleet.dev/config-hash="3f2a"\n'
    'kvfleet.dev/draining="true"'
)


def test_downward_api_file_is_parsed_with_go_escapes():
    """A quoted or multi-line annotation would hide the drain mark or break the parse."""
    assert parse_annotations(DOWNWARD_API_FILE) == {
        "kubectl.kubernetes.io/note": 'a "quoted" word\nand a line',
        "kvfleet.dev/config-hash": "3f2a",
        "kvfleet.dev/draining": "true",
    }


def test_unparsable_lines_are_skipped():
    """One odd line must not hide the others (or crash the heartbeat thread)."""
    text = 'garbage\nkey=unquoted\nkvfleet.dev/draining="true"\n=""\n'
    assert parse_annotations(text) == {"kvfleet.dev/draining": "true"}


@pytest.mark.parametrize(
    ("content", "draining"),
    [('kvfleet.dev/draining="true"', True), ('kvfleet.dev/draining="false"', False), ("", False)],
)
def test_drain_mark_is_read_from_the_annotations_file(tmp_path, content, draining):
    """The rank would report the wrong drain state if the mark's value were misread."""
    (tmp_path / "annotations").write_text(content)
    assert PodInfo(tmp_path).draining() is draining


def test_no_podinfo_means_not_draining(tmp_path):
    """Outside Kubernetes (no volume) a rank must not report itself leaving."""
    assert PodInfo(tmp_path / "missing").draining() is False
    assert PodInfo(None).draining() is False


def test_cli_reads_podinfo_from_the_downward_api_volume_by_default():
    """The operator mounts the annotations at /etc/podinfo; another default would never drain."""
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["engine"]).podinfo_dir == "/etc/podinfo"


def test_retained_working_set_is_a_share_of_capacity():
    """The autoscaler's retained signal would be meaningless as a raw page count."""
    assert EngineLoad(4, 0, 0, 0.5, 30, 120).retained_working_set == 0.25
    assert EngineLoad(4, 0, 0, 0.5, 30).retained_working_set == 0.0  # capacity unknown


@pytest.fixture
def router():
    config = RouterConfig(admission=AdmissionConfig(heartbeat_timeout_seconds=1.5))
    server, port = create_server("127.0.0.1:0", config)
    yield server, f"127.0.0.1:{port}"
    server.runtime.store.check_integrity()
    server.stop(0)


def test_rank_reports_the_drain_mark_and_its_gauges(router, tmp_path):
    """Scale-in would strand conversations (or autoscaling go blind) if the rank ignored the
    operator's mark or exposed other metric names."""
    server, address = router
    addresses = RankAddresses(router=address, rank_id="gen-1", metrics_port=0)
    rank = EngineRank(TEST_CONFIG, addresses, podinfo_dir=str(tmp_path)).start()
    try:
        assert rank.link.registered.wait(10)
        ranks = server.runtime.ranks
        wait_until(lambda: "gen-1" in ranks() and not ranks()["gen-1"].load.draining)
        (tmp_path / "annotations").write_text('kvfleet.dev/draining="true"\n')
        wait_until(lambda: ranks()["gen-1"].load.draining)
        (tmp_path / "annotations").write_text("")  # drain cancelled: annotation removed
        wait_until(lambda: not ranks()["gen-1"].load.draining)

        call = GenerateCall("t1", tuple(range(1, 100)), SamplingParams(0.0, max_tokens=2), "c1")
        list(rank.core.submit(call).outputs(30))
        wait_until(lambda: rank.core.load().retained_pages > 0)
        load = rank.core.load()
        url = f"http://127.0.0.1:{rank.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            sums = metric_sums(response.read().decode())
        assert sums[RETAINED] == pytest.approx(load.retained_pages / load.kv_capacity_pages)
        assert 0.0 < sums[RETAINED] <= sums[KV_USAGE] <= 1.0
        rank.core.check_integrity()
    finally:
        rank.stop(grace=0.5)


# ---- engine.yaml and the command lines the operator renders


def _operator_spec():
    from kvfleet.operator.spec import parse_spec

    return parse_spec(
        {
            "model": {
                "name": "tiny",
                "path": "",
                "config": {"dtype": "float32", "maxModelLen": 512},
            },
            "pools": {"generation": {"gpusPerPod": 2, "ranksPerPod": 2}},
            "kvTiers": {"hostGiB": 4},
        }
    )


def _yaml_leaves(node, path=()):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _yaml_leaves(value, (*path, key))
    else:
        yield path, node


def _changed(path, value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2
    return {
        "name": "1b",
        "path": "/other/model",
        "policy": "per_request",
        "dtype": "bfloat16",
        "dir": "/other/disk",
    }[path[-1]]


def _set(data, path, value):
    import copy

    out = copy.deepcopy(data)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def _rendered_yaml():
    from kvfleet.operator.render_config import engine_config

    return engine_config(_operator_spec(), "generation")


@pytest.mark.parametrize("path", [p for p, _ in _yaml_leaves(_rendered_yaml())], ids=".".join)
def test_every_rendered_engine_yaml_key_changes_the_engine_config(path):
    """A key the operator renders but the engine ignores is a CR field that does nothing."""
    from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict

    rendered = _rendered_yaml()
    value = dict(_yaml_leaves(rendered))[path]
    changed = _set(rendered, path, _changed(path, value))
    assert engine_config_from_dict(changed) != engine_config_from_dict(rendered), ".".join(path)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"kv_tiers": {"disk": {"gibs": 3}}}, "kv_tiers.disk.gibs"),
        ({"model": {"config": {"max_len": 3}}}, "model.config.max_len"),
        ({"engine": {"pagesize": 16}}, "engine.pagesize"),
        ({"ranks_per_pd": 2}, "ranks_per_pd"),
    ],
)
def test_an_unknown_engine_yaml_key_is_an_error_naming_it(tmp_path, data, key):
    """A misspelt key would run the engine on a default nobody chose."""
    import yaml
    from kvfleet.services.engine.config.engine_yaml import load_engine_config

    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=f"{key}: unknown key"):
        load_engine_config(path)


def test_rendered_engine_yaml_reaches_the_engine():
    """gpuMemoryFraction, ranksPerPod and model.config must arrive, not just be rendered."""
    from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict

    config = engine_config_from_dict(_rendered_yaml())
    assert (config.ranks_per_pod, config.gpu_memory_fraction) == (2, 0.9)
    assert (config.dtype, config.max_model_len, config.host_kv_gib) == ("float32", 512, 4)


def test_ranks_of_a_pod_get_their_own_ports_ids_and_gpus():
    """Two ranks of one pod on the same ports (or GPU, or id) would not start or would collide."""
    from kvfleet.services.engine.config.engine_config import EngineConfig
    from kvfleet.services.engine.rank.pod_ranks import pod_ranks

    addresses = RankAddresses(grpc_port=50061, http_port=8000, metrics_port=9401, rank_id="p-0")
    ranks = pod_ranks(EngineConfig(ranks_per_pod=2, device="cuda"), addresses)
    assert [(a.rank_id, a.grpc_port, a.http_port, a.metrics_port) for _, a in ranks] == [
        ("p-0-0", 50061, 8000, 9401),
        ("p-0-1", 50062, 8001, 9402),
    ]
    assert [c.device for c, _ in ranks] == ["cuda:0", "cuda:1"]
    [(_, same)] = pod_ranks(EngineConfig(), addresses)
    assert same == addresses


def test_rendered_engine_args_parse_with_the_engine_cli():
    """A flag the engine does not know crashes every engine pod at start."""
    import argparse

    from kvfleet.operator.names import FleetRef
    from kvfleet.operator.render_pools import engine_args

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = engine_args(FleetRef("f", "ns", "uid"), _operator_spec(), "generation")
    parsed = parser.parse_args(args[1:])
    assert parsed.drain_seconds == 120
    assert parsed.config == "/etc/kvfleet/engine.yaml"
    assert parsed.kv_cache_dtype == "auto"


def test_the_fleets_kv_cache_dtype_reaches_the_engine_config():
    """`spec.kvTiers.kvCacheDtype: fp8_e4m3` must give the engine an fp8 cache, not bf16."""
    import argparse

    from kvfleet.operator.names import FleetRef
    from kvfleet.operator.render_pools import engine_args
    from kvfleet.operator.spec import parse_spec
    from kvfleet.services.engine.rank.cli import engine_config_from_args

    raw = {"model": {"name": "m", "path": "p"}, "kvTiers": {"kvCacheDtype": "fp8_e4m3"}}
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = engine_args(FleetRef("f", "ns", "uid"), parse_spec(raw), "generation")
    parsed = parser.parse_args(args[1:])
    parsed.config = None  # the rendered engine.yaml is not on this machine
    assert engine_config_from_args(parsed).kv_cache_dtype == "fp8_e4m3"


def test_sigterm_drain_lets_running_requests_finish(router, tmp_path):
    """A pod deletion, eviction or config roll must not cut the requests a rank is running:
    the rank reports draining at once and stops only when they are done (or the budget ends)."""
    import threading

    _, address = router
    addresses = RankAddresses(router=address, rank_id="gen-2", metrics_port=None)
    rank = EngineRank(TEST_CONFIG, addresses, podinfo_dir=str(tmp_path)).start()
    assert rank.link.registered.wait(10)
    call = GenerateCall("t2", tuple(range(1, 40)), SamplingParams(0.0, max_tokens=120), "c2")
    handle = rank.core.submit(call)
    wait_until(lambda: rank.core.load().running == 1)
    leaving = threading.Thread(target=rank.drain_and_stop, args=(120.0,))
    leaving.start()
    outputs = list(handle.outputs(120))
    leaving.join(130)
    assert not leaving.is_alive()
    assert outputs[-1].finished
    assert sum(len(o.token_ids) for o in outputs) == 120
    assert rank.read_draining() is True  # whatever the pod's annotations say


def _router_parser():
    import argparse

    from kvfleet.services.router.cli import register as register_router

    parser = argparse.ArgumentParser()
    register_router(parser.add_subparsers())
    return parser


def test_rendered_router_args_parse_with_the_router_cli():
    """A flag the router does not know crashes every router pod at start."""
    from kvfleet.operator.names import FleetRef
    from kvfleet.operator.render_router import router_args

    args = router_args(FleetRef("f", "ns", "uid"), _operator_spec())
    parsed = _router_parser().parse_args(args[1:])
    assert parsed.replica_id == "$(POD_NAME)"  # expanded by the kubelet


@pytest.mark.parametrize(
    ("redis", "expected_url"),
    [
        ({"mode": "managed"}, "redis://f-redis:6379/0"),
        ({"mode": "external", "url": "redis://:pw-in-url@r:6379/0"}, "redis://:pw-in-url@r:6379/0"),
        ({"mode": "external", "urlSecretRef": {"name": "s", "key": "url"}}, "from-the-secret"),
    ],
    ids=["managed", "external-url", "external-secret"],
)
def test_no_redis_secret_is_on_the_router_command_line(redis, expected_url, monkeypatch):
    """`ps` on the node shows a pod's command line to every process there: the Redis password
    (or a URL holding one) must reach the router through its environment only."""
    from kvfleet.operator.names import FleetRef
    from kvfleet.operator.render_router import render_router
    from kvfleet.operator.spec import parse_spec
    from kvfleet.services.router.cli import router_config

    raw = {"model": {"name": "tiny", "path": ""}, "redis": redis}
    deployment, _service = render_router(FleetRef("f", "ns", "uid"), parse_spec(raw), {})
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    command_line = " ".join(container["args"])
    assert "pw-in-url" not in command_line and "REDIS" not in command_line
    secrets = {"redis-password": "managed-pw", "url": "from-the-secret", "fleet-secret": "f"}
    for entry in container["env"]:  # what the kubelet would set, Secrets resolved
        if "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            monkeypatch.setenv(entry["name"], secrets[entry["valueFrom"]["secretKeyRef"]["key"]])
    config = router_config(_router_parser().parse_args(container["args"][1:]))
    assert config.redis_url == expected_url
    if redis["mode"] == "managed":
        assert config.redis_password == "managed-pw"


def test_engines_register_on_the_routers_rank_port_and_its_service_exposes_it():
    """The router serves RankRegistry only on its rank port: engines pointed at the client
    port would never register, and a Service without the port would not reach it."""
    from kvfleet.operator.names import FleetRef
    from kvfleet.operator.render_pools import engine_args
    from kvfleet.operator.render_router import render_router, router_args

    fleet, spec = FleetRef("f", "ns", "uid"), _operator_spec()
    router = _router_parser().parse_args(router_args(fleet, spec)[1:])
    engine = engine_args(fleet, spec, spec.enabled_pools()[0])
    registry = engine[engine.index("--router") + 1]
    assert registry == f"f-router:{router.rank_port}" != f"f-router:{router.grpc_port}"
    _deployment, service = render_router(fleet, spec, {})
    assert router.rank_port in [p["port"] for p in service["spec"]["ports"]]
    assert router.model == spec.model.name


def _tensor_parallel_spec(**changes):
    from kvfleet.operator.spec import parse_spec

    raw = {
        "model": {"name": "m", "path": "/models/m"},
        "kvTiers": {"hostGiB": 4, "disk": {"enabled": False}},
        "pools": {
            "context": {"enabled": False},
            "generation": {"gpusPerPod": 1, "tensorParallel": 2},
        },
        **changes,
    }
    return parse_spec(raw)


def test_tensor_parallel_pool_runs_one_rank_of_workers_under_torchrun():
    """The pod asks for a GPU per worker, torchrun starts the workers with the engine's own
    command line, and the rendered engine.yaml gives the engine its tensor_parallel."""
    import argparse

    from kvfleet.operator.names import FleetRef
    from kvfleet.operator.render_config import engine_config
    from kvfleet.operator.render_pools import engine_args, render_pool
    from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict

    fleet, spec = FleetRef("f", "ns", "uid"), _tensor_parallel_spec()
    args = engine_args(fleet, spec, "generation")
    assert args[:3] == ["torchrun", "--standalone", "--nproc-per-node=2"]
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    module = args.index("kvfleet.services.cli")
    assert args[module - 1] == "-m" and parser.parse_args(args[module + 1 :]).config
    assert engine_config_from_dict(engine_config(spec, "generation")).tensor_parallel == 2
    objects = render_pool(fleet, spec, "generation", 1)
    containers = [
        c
        for o in objects
        if o["kind"] == "StatefulSet"
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
    assert containers[0]["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_tensor_parallel_pool_needs_one_rank_a_checkpoint_and_no_disk_tier():
    from kvfleet.operator.spec import SpecError

    with pytest.raises(SpecError, match=r"tensorParallel=2 runs one rank per pod"):
        _tensor_parallel_spec(pools={"generation": {"tensorParallel": 2, "ranksPerPod": 2,
                                                    "gpusPerPod": 4}})  # fmt: skip
    with pytest.raises(SpecError, match=r"tensorParallel=2 needs kvTiers.disk.enabled=false"):
        _tensor_parallel_spec(kvTiers={"hostGiB": 4})
    with pytest.raises(SpecError, match=r"tensorParallel=2 needs pools.context.enabled=false"):
        _tensor_parallel_spec(pools={"generation": {"tensorParallel": 2}})
    with pytest.raises(SpecError, match=r"tensorParallel=2 needs model.path"):
        _tensor_parallel_spec(model={"name": "m", "path": ""})
