"""The built wheel, installed as each image installs it, holds every module and starts.

One wheel is built (from a copy of what the Dockerfiles copy) and installed non-editable into a
fresh venv per extra, under docker/constraints.txt. The editable dev install maps whole folders,
so it imports a subpackage the wheel left out: only a real install shows that an image would
crash on start. Minutes: three venvs, one with torch.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from listening_process import ListeningProcess, http_json
from wheel_build import ROOT, build_wheel, clean_env, fresh_venv, package_roots

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def run(command: list[str], cwd: Path) -> str:
    result = subprocess.run(
        command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_wheel_holds_every_file_under_the_package_roots(wheel: Path) -> None:
    """If this fails, the wheel lacks a module or data file the checkout has (the list names
    them): the package list or [tool.setuptools.package-data] leaves it out."""
    expected = {
        "/".join([*name.split("."), *path.relative_to(ROOT / folder).parts])
        for name, folder in package_roots().items()
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    missing = sorted(expected - set(zipfile.ZipFile(wheel).namelist()))
    assert not missing, missing


def start_router(kvfleet: Path, work: Path) -> None:
    """The router on free ports, its OpenAI front healthy; SIGTERM ends it cleanly."""
    router = ListeningProcess(
        [str(kvfleet), "router", "--host", "127.0.0.1", "--grpc-port", "0", "--rank-port", "0",
         "--metrics-port", "0", "--http-port", "0", "--insecure-rank-port",
         "--grace-seconds", "1"],
        work, clean_env(), work / "router.log",
    )  # fmt: skip
    try:
        router.wait_for(r"router listening on port \d+", timeout=120)
        port = router.wait_for(r"OpenAI API on http port (\d+)", timeout=120).group(1)
        assert http_json(f"http://127.0.0.1:{port}/health")["status"] == "ok"
        assert router.stop() == 0, router.stderr_tail()
    finally:
        router.kill()


def start_engine(kvfleet: Path, work: Path) -> None:
    """The engine with the default (tiny) preset on CPU on free ports answers a completion;
    SIGTERM drains and ends it cleanly."""
    engine = ListeningProcess(
        [str(kvfleet), "engine", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
         "--metrics-port", "0", "--device", "cpu", "--cpu-kv-gib", "0.25",
         "--podinfo-dir", str(work / "podinfo"), "--drain-seconds", "1"],
        work, clean_env(), work / "engine.log",
    )  # fmt: skip
    try:
        port = engine.wait_for(r"model tiny\): grpc \d+, http (\d+)", timeout=300).group(1)
        base = f"http://127.0.0.1:{port}"
        assert http_json(f"{base}/health")["status"] == "ok"
        reply = http_json(
            f"{base}/v1/completions",
            {"model": "tiny", "prompt": "hi", "max_tokens": 2, "ignore_eos": True},
        )
        assert reply["usage"]["completion_tokens"] == 2, reply
        assert engine.stop() == 0, engine.stderr_tail()
    finally:
        engine.kill()


def operator_imports(kvfleet: Path, work: Path) -> None:
    """The operator needs a Kubernetes API to start; its handlers must import."""
    run([str(kvfleet.parent / "python"), "-c", "import kvfleet.operator.handlers"], work)


STARTS = {"router": start_router, "engine": start_engine, "operator": operator_imports}


@pytest.fixture
def venv_path(tmp_path: Path):
    """Where the test's venv goes; removed afterwards (with torch it is GBs, and pytest keeps
    its last runs' folders), the commands' logs beside it kept."""
    yield tmp_path / "venv"
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


@pytest.mark.parametrize("extra", sorted(STARTS))
def test_fresh_install_of_each_extra_starts(
    extra: str, wheel: Path, venv_path: Path, tmp_path: Path
) -> None:
    """If this fails, the image installing `kvfleet[extra]` would not start: a module missing
    from the wheel, a dependency missing from the extra, or a command that crashes."""
    bin_dir = fresh_venv(venv_path, f"{wheel}[{extra}]")
    where = run([str(bin_dir / "python"), "-c", "import kvfleet.services as s; print(s.__file__)"],
                tmp_path)  # fmt: skip
    assert where.startswith(str(venv_path)), where  # the wheel, not the checkout
    kvfleet = bin_dir / "kvfleet"
    assert "usage: kvfleet" in run([str(kvfleet), "--help"], tmp_path)
    assert f"usage: kvfleet {extra}" in run([str(kvfleet), extra, "--help"], tmp_path)
    STARTS[extra](kvfleet, tmp_path)
