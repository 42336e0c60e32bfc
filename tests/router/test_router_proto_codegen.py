"""Generated gRPC code comes from the .proto files, package-qualified, committed up to date."""

from __future__ import annotations

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


def test_committed_code_is_what_the_protos_generate(tmp_path):
    """If this fails, a .proto was edited without `kvfleet proto`: the committed (and packaged)
    code is stale, and nothing regenerates it at run time."""
    written = codegen.generate(copy_protos(tmp_path))
    assert {path.name for path in written} == {
        target.name
        for source in codegen.proto_sources()
        for target in codegen.generated_paths(source)
    }
    for path in written:
        committed = codegen.PROTO_DIR / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is stale: run kvfleet proto"
        )


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
        "PrefetchConversation",
    }
