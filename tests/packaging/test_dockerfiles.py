"""The images' recipes (docker/*.Dockerfile, .dockerignore) are pinned and build what the wheel
test builds. No image is built here (no Docker daemon): these read the files."""

from __future__ import annotations

import re
import shlex
from itertools import pairwise
from pathlib import Path

import pytest
from wheel_build import ROOT, build_inputs

DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))
# pip options followed by a value (the value is not a requirement).
PIP_VALUE_OPTIONS = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url"}
EXACT_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[a-z,]+\])?==[A-Za-z0-9.+]+$")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split()[0].upper(), line.partition(" ")[2])
        for line in lines
        if line and not line.startswith("#")
    ]


def base_images(dockerfile: Path) -> list[str]:
    """Each FROM's image, with ARG defaults put in."""
    defaults, images = {}, []
    for instruction, arguments in instructions(dockerfile):
        if instruction == "ARG" and "=" in arguments:
            name, _, value = arguments.partition("=")
            defaults[name] = value
        elif instruction == "FROM":
            image = arguments.split()[0]
            images.append(re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], image))
    return images


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments of each `pip install` the RUN instructions make."""
    installs = []
    for instruction, arguments in instructions(dockerfile):
        if instruction != "RUN":
            continue
        for command in re.split(r"&&|;|\bthen\b", arguments):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"]:
                installs.append(words[2:])
    return installs


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_base_image_is_an_exact_version_or_digest(dockerfile: Path) -> None:
    """If this fails, a FROM names a moving tag (python:3.11-slim, latest): a rebuild of the
    same commit could get another OS or interpreter."""
    for image in base_images(dockerfile):
        _, _, tag = image.partition(":")
        assert "@sha256:" in image or re.search(r"\d+\.\d+\.\d+", tag), image


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_pip_install_is_pinned_exactly(dockerfile: Path) -> None:
    """If this fails, a pip install names a package without `==`, installs the project
    without docker/constraints.txt, or reads a requirements file with a loose line."""
    assert pip_installs(dockerfile), "no pip install found"
    for words in pip_installs(dockerfile):
        values = {value for option, value in pairwise(words) if option in PIP_VALUE_OPTIONS}
        for word in words:
            if word.startswith("-") or word in values:
                continue
            if word.startswith("/src"):  # the project: its dependencies come from -c
                assert "-c" in words, words
            else:
                assert EXACT_PIN.match(word), f"{word} is not pinned exactly"
        for value in values:
            if not value.startswith("/src/"):
                continue  # an index URL
            for line in (ROOT / Path(value).relative_to("/src")).read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    assert EXACT_PIN.match(line.strip()), f"{value}: {line}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_image_copies_what_the_build_reads(dockerfile: Path) -> None:
    """If this fails, an image builds kvfleet without one of its build inputs (setup.py lists
    the packages; without it the wheel has none) or a package folder."""
    copied = {
        source
        for instruction, arguments in instructions(dockerfile)
        if instruction == "COPY"
        for source in arguments.split()[:-1]
    }
    assert set(build_inputs()) <= copied, set(build_inputs()) - copied


def test_engine_base_image_and_torch_index_are_build_arguments() -> None:
    """If this fails, the engine image's CUDA base or torch wheel index is fixed in its recipe
    (or no longer defaults to CUDA 13 / cu130)."""
    engine = ROOT / "docker" / "engine.Dockerfile"
    text = engine.read_text()
    assert "FROM ${BASE_IMAGE}" in text and '--index-url "$TORCH_INDEX_URL"' in text
    assert base_images(engine) == ["nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04"]
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130" in text


def ignore_pattern(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex on context-relative paths; a matched folder takes
    its contents with it."""
    regex, rest = "", pattern.strip("/")
    while rest:
        for token, replacement in (("**/", "(?:.*/)?"), ("**", ".*"), ("*", "[^/]*"),
                                   ("?", "[^/]")):  # fmt: skip
            if rest.startswith(token):
                regex, rest = regex + replacement, rest[len(token) :]
                break
        else:
            regex, rest = regex + re.escape(rest[0]), rest[1:]
    return re.compile(regex + "(?:/.*)?$")


def dockerignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:  # the last matching pattern decides; `!` takes back
        if ignore_pattern(pattern.removeprefix("!")).match(path):
            ignored = not pattern.startswith("!")
    return ignored


def test_dockerignore_leaves_out_local_state_but_nothing_a_build_reads() -> None:
    """If this fails, .dockerignore drops a file an image COPYs (the build then lacks it or
    fails), or no longer leaves out the venv and git history."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    needed = []
    for name in [*build_inputs(), "docker"]:
        path = ROOT / name
        files = path.rglob("*") if path.is_dir() else [path]
        needed += [
            str(file.relative_to(ROOT))
            for file in files
            if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc"
        ]
    dropped = [path for path in needed if dockerignored(path, patterns)]
    assert not dropped, dropped
    for local in (".venv/bin/python", ".git/HEAD", "services/__pycache__/cli.cpython-311.pyc"):
        assert dockerignored(local, patterns), local
