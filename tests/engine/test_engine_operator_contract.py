"""What an engine rank does for the operator: report the drain mark in its heartbeat, and
expose the two gauges the autoscaler reads (names are a contract: docs/operator.md)."""

from __future__ import annotations

import urllib.request

import pytest
from engine_testkit import TEST_CONFIG, wait_until
from kvfleet.operator.metrics import KV_USAGE, RETAINED, metric_sums
from kvfleet.services.engine.cli import register
from kvfleet.services.engine.engine_request import EngineLoad, GenerateCall
from kvfleet.services.engine.podinfo import PodInfo, parse_annotations
from kvfleet.services.engine.rank import EngineRank, RankAddresses
from kvfleet.services.engine.sampling import SamplingParams
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
        wait_until(lambda: ranks()["gen-1"].load.draining, timeout=5)
        (tmp_path / "annotations").write_text("")  # drain cancelled: annotation removed
        wait_until(lambda: not ranks()["gen-1"].load.draining, timeout=5)

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
