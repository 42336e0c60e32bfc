"""Every `kvfleet ...` command line that README.md and docs/*.md show parses with the current
command (parsed only, never run), so the docs cannot drift from the flags."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from kvfleet.services.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
README_TWO_COMMANDS = re.compile(r"^## Two commands\n(.*?)^## ", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")  # a span may wrap onto the next line
PROGRAM = re.compile(r"^[($\s]*(?:\S*/)?kvfleet(?:\s+|$)")
# A synopsis (`--role context|generation|both`, `--model NAME`, `[--json OUT]`, `TRACE...`)
# names placeholders rather than values: its command and flags must exist, values aside.
SYNOPSIS = re.compile(r"\.\.\.|[\[\]|<>{}]|(?<![\w/.-])[A-Z][A-Z_0-9]*(?![\w/.-])")


def invocations(text: str) -> list[tuple[str, bool]]:
    """(command line, shown in a fenced block) of one page: blocks with backslash
    continuations joined and `&&` / `;` chains split, then inline code spans."""
    found = []
    blocks = [
        line for block in FENCE.findall(text) for line in block.replace("\\\n", " ").split("\n")
    ]
    spans = [" ".join(span.split()) for span in INLINE.findall(FENCE.sub("", text))]
    for pieces, fenced in ((blocks, True), (spans, False)):
        for piece in pieces:
            for part in re.split(r"&&|;|\|\|", piece.split(" # ")[0]):
                if PROGRAM.match(part.strip()):
                    found.append((PROGRAM.sub("kvfleet ", part.strip()).strip(), fenced))
    return found


def documented() -> list[tuple[str, str, bool]]:
    return [
        (doc.name, line, fenced) for doc in DOCS for line, fenced in invocations(doc.read_text())
    ]


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert name in action.choices, f"no command kvfleet {name}"
    return action.choices[name]


def test_the_docs_show_commands_to_parse() -> None:
    """If this fails, the extraction finds no full command lines and the check is vacuous."""
    full = [line for _, line, fenced in documented() if fenced and not SYNOPSIS.search(line)]
    assert len(full) >= 4, full


@pytest.mark.parametrize(("page", "line", "fenced"), documented())
def test_documented_command_parses(page: str, line: str, fenced: bool) -> None:
    """If this fails, a page shows a command or flag the current `kvfleet` does not have, or a
    command line it rejects."""
    words = shlex.split(line)[1:]
    if fenced and not SYNOPSIS.search(line):
        try:
            build_parser().parse_args(words)
        except SystemExit as stopped:
            assert stopped.code == 0, f"{page}: {line!r} does not parse"
        return
    if not words:  # `kvfleet` alone
        return
    known = {option for action in subcommand(words[0])._actions for option in action.option_strings}
    for flag in (w.split("=")[0].strip("[]") for w in words[1:] if w.lstrip("[").startswith("-")):
        assert flag in known, f"{page}: {line!r}: kvfleet {words[0]} has no {flag}"


def test_docs_speak_of_the_product_not_of_issues():
    """If this fails, a doc says where a feature came from ("issue 6") instead of what it is."""
    cited = [
        f"{doc.relative_to(ROOT)}:{number}: {line.strip()}"
        for doc in DOCS
        for number, line in enumerate(doc.read_text().splitlines(), 1)
        if re.search(r"\bissues? #?\d+", line, re.IGNORECASE)
    ]
    assert not cited, cited


def test_no_file_holds_a_merge_conflict_marker():
    """A conflict resolved in a hurry once left both sides and the markers in a doc."""
    import subprocess

    markers = subprocess.run(
        ["git", "grep", "-n", "-E", "^(<<<<<<<|>>>>>>>) "],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
    )  # fmt: skip
    assert markers.stdout == ""


def test_readme_test_command_is_what_ci_runs():
    """README's "Two commands" are the main job and the test command; .ci/run must run that
    test command itself, so a newcomer runs what CI runs."""
    section = README_TWO_COMMANDS.search((ROOT / "README.md").read_text()).group(1)
    commands = [block.strip() for block in FENCE.findall(section) if "pip install" in block]
    assert len(commands) == 2, commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands[1] in ci, f"{commands[1]!r} is not a line of .ci/run"
