"""Generated gRPC code comes from the .proto files, package-qualified, regenerated when stale."""

from __future__ import annotations

import os
import shutil

from kvfleet.proto import codegen


def copy_protos(tmp_path):
    for source in codegen.proto_sources():
        shutil.copy2(source, tmp_path / source.name)
    return tmp_path


def test_generated_imports_are_package_qualified(tmp_path):
    """Bare `import common_pb2` in generated code would break every import of kvfleet.proto."""
    codegen.generate(copy_protos(tmp_path))
    text = (tmp_path / "router_pb2_grpc.py").read_text()
    assert "from kvfleet.proto import router_pb2" in text
    assert "from kvfleet.proto import common_pb2" in (tmp_path / "router_pb2.py").read_text()


def test_missing_or_older_output_is_stale(tmp_path):
    """A fresh clone (no generated files) or an edited .proto would run stale code."""
    proto_dir = copy_protos(tmp_path)
    assert codegen.is_stale(proto_dir)
    assert codegen.ensure_generated(proto_dir) is True
    assert codegen.is_stale(proto_dir) is False
    assert codegen.ensure_generated(proto_dir) is False
    later = (tmp_path / "router_pb2.py").stat().st_mtime + 10
    os.utime(tmp_path / "router.proto", (later, later))
    assert codegen.is_stale(proto_dir)


def test_contracts_have_the_fields_other_parts_use():
    """The engine and the operator would be built against a contract missing these."""
    from kvfleet.proto import engine_pb2, router_pb2

    generate = router_pb2.GenerateRequest.DESCRIPTOR.fields_by_name
    assert {
        "conversation_id",
        "prompt_token_ids",
        "prompt_text",
        "sampling",
        "max_tokens",
        "rank_id",
        "relax_rank",
        "child_samples",
    } <= set(generate)
    assert set(router_pb2.DESCRIPTOR.services_by_name) == {"Router", "RankRegistry"}
    assert set(engine_pb2.DESCRIPTOR.services_by_name["Engine"].methods_by_name) == {
        "Generate",
        "PullKvBlocks",
    }
