"""The coverage gate on a machine without some programs: it leaves out what a full run measured
only their tests cover (tests/coverage_gate.py), found again by text after edits elsewhere.

Each test measures a small module for real with coverage.py, one context per "test", as
pytest-cov's ``--cov-context=test`` does in a full run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import coverage

from tests import coverage_gate
from tests.coverage_gate import adjusted_total, left_out, line_keys, lost, record
from tests.programs import HINTS

MODULE = """\
def handle(kind):
    if kind == "plain":
        return 1
    if kind == "broker":
        started = "broker"
        return started
    return 0
"""


def measure(root: Path, runs: dict[str, str]) -> Path:
    """Import root/mod.py and call ``handle(kind)`` once per context; the data file."""
    (root / "mod.py").write_text(MODULE)
    data = root / ".coverage"
    cov = coverage.Coverage(
        data_file=str(data), data_suffix=False, branch=True, source=[str(root)], config_file=False
    )
    cov.start()
    try:
        sys.path.insert(0, str(root))
        import mod  # type: ignore[import-not-found]

        for context, kind in runs.items():
            cov.switch_context(f"{context}|run")
            mod.handle(kind)
    finally:
        cov.stop()
        sys.path.remove(str(root))
        sys.modules.pop("mod", None)
    cov.save()
    return data


def test_only_what_program_using_tests_reach_is_recorded_with_their_programs(
    tmp_path: Path,
) -> None:
    data = measure(tmp_path, {"t_plain": "plain", "t_broker": "broker"})
    recorded = record(data, {"t_broker": ["mosquitto"]}, root=tmp_path)
    (group,) = recorded["files"]["mod.py"].values()
    assert list(recorded["files"]["mod.py"]) == ["mosquitto"]
    # The plain call returns before the second test: only the broker's test reaches it.
    assert set(group["lines"]) == {'1:if kind == "broker":', '1:started = "broker"',
                                   "1:return started"}  # fmt: skip
    assert recorded["tests"] == {"t_broker": ["mosquitto"]}
    # A line some test reaches without a program is never left out.
    assert not any("plain" in line for line in group["lines"])


def test_the_record_survives_edits_elsewhere_in_the_file(tmp_path: Path) -> None:
    data = measure(tmp_path, {"t_plain": "plain", "t_broker": "broker"})
    recorded = record(data, {"t_broker": ["mosquitto"]}, root=tmp_path)
    (tmp_path / "mod.py").write_text('"""Now with a docstring."""\n\n\n' + MODULE)
    found, stale = left_out(recorded, {"mosquitto"}, root=tmp_path)
    out, arcs = found["mod.py"]
    assert out == {4 + 3, 5 + 3, 6 + 3} and stale == 0
    assert (5 + 3, 6 + 3) in arcs


def test_a_line_is_left_out_only_when_every_test_reaching_it_lacks_a_program() -> None:
    assert lost("mosquitto", {"mosquitto"})
    assert lost("mosquitto+openssl;socat", {"openssl", "socat"})
    assert not lost("mosquitto;socat", {"mosquitto"})  # a socat test still reaches it
    assert not lost("chromium", {"mosquitto"})


def test_the_gate_leaves_out_missing_lines_and_branches_and_asks_90_of_the_rest() -> None:
    """5 of 10 lines covered (50%); leaving out 4 missing lines asks 5 of 6."""
    report = {
        "files": {
            "gateway/a.py": {
                "summary": {"covered_lines": 5, "num_statements": 10},
                "missing_lines": [6, 7, 8, 9, 10],
            }
        }
    }
    total, lines, branches = adjusted_total(report, {"gateway/a.py": ({6, 7, 8, 9, 99}, set())})
    assert (lines, branches) == (4, 0) and round(total, 2) == round(100 * 5 / 6, 2)


def test_without_skips_the_gate_is_coverage_s_own(tmp_path: Path) -> None:
    assert coverage_gate.COVERAGE_GATE == 90
    report = {"files": {"gateway/a.py": {"summary": {"covered_lines": 9, "num_statements": 10},
                                         "missing_lines": [3]}}}  # fmt: skip
    assert adjusted_total(report, {}) == (90.0, 0, 0)


def test_the_committed_map_names_only_known_programs_and_current_files() -> None:
    """A full run keeps tests/coverage_map.json current; it names no program tests/programs.py
    does not know, and each of its files exists."""
    recorded = json.loads(coverage_gate.MAP.read_text())
    for path, groups in recorded["files"].items():
        assert (coverage_gate.ROOT / path).is_file(), path
        for group in groups:
            assert set(group.replace(";", "+").split("+")) <= set(HINTS), group
    assert line_keys("a\n a\nb") == ["1:a", "2:a", "1:b"]
