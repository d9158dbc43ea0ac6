"""The coverage gate of scripts/test, fair on a machine without some of the suite's programs.

A full run (every program of tests/programs.py present) measures, per test (coverage contexts:
pytest-cov's ``--cov-context=test``, and tests/conftest.py names the same context in the
subprocesses a test starts), which lines and branches of gateway/ only tests that use some
program reach, and records them in tests/coverage_map.json with the programs those tests use.
A run where programs were missing leaves out of the gate exactly what the skipped tests would
have covered, as recorded, and still asks COVERAGE_GATE% of the rest. Nothing is kept by hand:
a program another branch adds to tests/programs.py counts as soon as a full run records it.

The map names lines by their text (and which occurrence of that text in the file), not their
number, so an edit elsewhere in a file does not make it stale; code that only program-using
tests reach and that changed since the map was recorded counts against the gate until a full
run records it again (the gate says so).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "tests" / "coverage_map.json"
MAP_ENV = "GATEWAY_TESTS_COVERAGE_MAP"  # another place to record to or read from (.ci/run)
COVERAGE_GATE = 90

Arc = tuple[int, int]
# A line or arc of a file named by text: "<occurrence>:<stripped text>", "-" in front for an
# arc's end that leaves a code object (coverage's negative line numbers).
Key = str


def line_keys(source: str) -> list[Key]:
    """Each line's key, by line number - 1."""
    seen: dict[str, int] = {}
    keys = []
    for line in source.splitlines():
        text = line.strip()
        seen[text] = seen.get(text, 0) + 1
        keys.append(f"{seen[text]}:{text}")
    return keys


def _key(keys: list[Key], number: int) -> Key | None:
    index = abs(number) - 1
    if not 0 <= index < len(keys):
        return None
    return ("-" if number < 0 else "") + keys[index]


def _group(alternatives: Iterable[frozenset[str]]) -> str:
    """The programs-sets of the tests reaching a line, as one string: "a+b;c" (a and b, or c)."""
    return ";".join(sorted({"+".join(sorted(a)) for a in alternatives}))


def lost(group: str, missing: set[str]) -> bool:
    """Whether nothing reaches a line of ``group`` without a program of ``missing``."""
    return all(missing & set(alternative.split("+")) for alternative in group.split(";"))


def _test_of(context: str) -> str:
    return context.split("|", 1)[0]  # pytest-cov's "nodeid|run"; subprocesses: the nodeid


def measured_arcs(data_file: Path, root: Path = ROOT) -> dict[str, dict[Arc, set[str]]]:
    """Each file's arcs (relative path), with the contexts (tests) that ran them."""
    arcs: dict[str, dict[Arc, set[str]]] = {}
    with sqlite3.connect(f"file:{data_file}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT file.path, context.context, arc.fromno, arc.tono FROM arc"
            " JOIN file ON file.id = arc.file_id JOIN context ON context.id = arc.context_id"
        )
        for path, context, start, end in rows:
            relative = os.path.relpath(path, root)
            arcs.setdefault(relative, {}).setdefault((start, end), set()).add(_test_of(context))
    return arcs


def _only_with_programs(
    keys: list[Key], arcs: Mapping[Arc, set[str]], programs: Mapping[str, frozenset[str]]
) -> dict[str, dict[str, set[Any]]]:
    """A file's lines and arcs that only program-using tests reach, by group (``_group``)."""
    line_tests: dict[int, set[str]] = {}
    for arc, tests in arcs.items():
        for number in arc:
            if number > 0:
                line_tests.setdefault(number, set()).update(tests)
    groups: dict[str, dict[str, set[Any]]] = {}

    def note(tests: set[str], kind: str, item: Any) -> None:
        if all(programs.get(test) for test in tests):  # none reached it without a program
            group = _group(programs[test] for test in tests)
            groups.setdefault(group, {"lines": set(), "arcs": set()})[kind].add(item)

    for number, tests in line_tests.items():
        if (key := _key(keys, number)) is not None:
            note(tests, "lines", key)
    for (start, end), tests in arcs.items():
        ends = (_key(keys, start), _key(keys, end))
        if None not in ends:
            note(tests, "arcs", ends)
    return groups


def record(data_file: Path, uses: Mapping[str, Iterable[str]], root: Path = ROOT) -> dict[str, Any]:
    """The map of a full run: what only program-using tests reach, and which programs they use.

    ``uses``: test id -> the programs it uses (tests/conftest.py ``programs_used``).
    """
    programs = {test: frozenset(names) for test, names in uses.items()}
    files: dict[str, dict[str, dict[str, list[Any]]]] = {}
    for path, arcs in sorted(measured_arcs(data_file, root).items()):
        if not (root / path).is_file():
            continue
        keys = line_keys((root / path).read_text())
        groups = _only_with_programs(keys, arcs, programs)
        if groups:
            files[path] = {
                group: {"lines": sorted(found["lines"]), "arcs": sorted(map(list, found["arcs"]))}
                for group, found in sorted(groups.items())
            }
    return {
        "about": "Written by scripts/test's full runs (tests/coverage_gate.py): what only tests "
        "using a program of tests/programs.py cover. Commit it when it changes.",
        "files": files,
        "tests": {test: sorted(names) for test, names in sorted(programs.items())},
    }


def left_out(
    recorded: Mapping[str, Any], missing: set[str], root: Path = ROOT
) -> tuple[dict[str, tuple[set[int], set[Arc]]], int]:
    """Per file, the lines and arcs (current numbers) that only tests needing ``missing``
    reach; and how many recorded ones are no longer in the source (stale)."""
    result: dict[str, tuple[set[int], set[Arc]]] = {}
    stale = 0
    for path, groups in recorded.get("files", {}).items():
        source = root / path
        numbers: dict[Key, int] = {}
        if source.is_file():
            for number, key in enumerate(line_keys(source.read_text()), start=1):
                numbers[key] = number
                numbers["-" + key] = -number
        lines: set[int] = set()
        arcs: set[Arc] = set()
        for group, found in groups.items():
            if not lost(group, missing):
                continue
            for key in found["lines"]:
                if key in numbers:
                    lines.add(numbers[key])
                else:
                    stale += 1
            for start, end in found["arcs"]:
                if start in numbers and end in numbers:
                    arcs.add((numbers[start], numbers[end]))
                else:
                    stale += 1
        if lines or arcs:
            result[path] = (lines, arcs)
    return result, stale


def adjusted_total(
    report: Mapping[str, Any], leave_out: Mapping[str, tuple[set[int], set[Arc]]]
) -> tuple[float, int, int]:
    """coverage's total percentage of a JSON ``report`` with ``leave_out``'s missing lines and
    branches taken out of the count; and how many lines and branches that took out."""
    covered = counted = out_lines = out_branches = 0
    for path, file in report["files"].items():
        summary = file["summary"]
        lines, arcs = leave_out.get(os.path.relpath(os.path.join(ROOT, path), ROOT), ((), ()))
        missing_lines = len(set(file["missing_lines"]) & set(lines))
        missing_branches = len({tuple(b) for b in file.get("missing_branches", [])} & set(arcs))
        out_lines += missing_lines
        out_branches += missing_branches
        covered += summary["covered_lines"] + summary.get("covered_branches", 0)
        counted += summary["num_statements"] + summary.get("num_branches", 0)
        counted -= missing_lines + missing_branches
    return (100.0 * covered / counted if counted else 100.0), out_lines, out_branches


def _map_path() -> Path:
    return Path(os.environ.get(MAP_ENV) or MAP)


def gate(data_file: Path, skipped_for: set[str], uses_file: Path | None, *, no_skips: bool) -> int:
    """scripts/test's gate; returns its exit status. Records the map after a full run."""
    import coverage  # the venv's (this module's other functions run without it)
    from coverage.results import should_fail_under

    cov = coverage.Coverage(data_file=str(data_file))
    cov.load()
    listing = ["--skip-covered", "--show-missing"]
    coverage_bin = Path(sys.executable).parent / "coverage"
    if not skipped_for or no_skips:
        if uses_file is not None and uses_file.exists() and not skipped_for:
            recorded = record(data_file, json.loads(uses_file.read_text()))
            _write_if_changed(_map_path(), recorded)
        import subprocess

        arguments = [f"--fail-under={COVERAGE_GATE}", *listing]
        command = [str(coverage_bin), "report", f"--data-file={data_file}", *arguments]
        return subprocess.run(command, check=False).returncode
    map_path = _map_path()
    recorded = json.loads(map_path.read_text()) if map_path.exists() else {}
    leave_out, stale = left_out(recorded, skipped_for)
    with tempfile.TemporaryDirectory() as scratch:
        cov.json_report(outfile=str(Path(scratch) / "coverage.json"), show_contexts=False)
        report = json.loads((Path(scratch) / "coverage.json").read_text())
    total, out_lines, out_branches = adjusted_total(report, leave_out)
    failed = should_fail_under(total, COVERAGE_GATE, 0)
    if failed:
        cov.report(skip_covered=True, show_missing=True)
    print(
        f"coverage gate: tests skipped for want of {', '.join(sorted(skipped_for))}; it leaves "
        f"out the {out_lines} lines and {out_branches} branches only those tests reach "
        f"(measured: {os.path.relpath(map_path, ROOT)}, in {len(leave_out)} files) and asks "
        f"{COVERAGE_GATE}% of the rest: {total:.2f}%",
        file=sys.stderr,
    )
    if stale:
        print(
            f"coverage gate: {stale} recorded lines or branches are no longer in the source; "
            f"a full run of scripts/test (every program installed) records them again",
            file=sys.stderr,
        )
    if failed:
        print(f"coverage gate: {total:.2f}% is less than {COVERAGE_GATE}%", file=sys.stderr)
    return 2 if failed else 0


def _write_if_changed(path: Path, recorded: Mapping[str, Any]) -> None:
    text = json.dumps(recorded, indent=1, sort_keys=True) + "\n"
    if path.exists() and path.read_text() == text:
        return
    path.write_text(text)
    print(
        f"coverage gate: recorded what only program-using tests cover in "
        f"{os.path.relpath(path, ROOT)} (commit it)",
        file=sys.stderr,
    )
