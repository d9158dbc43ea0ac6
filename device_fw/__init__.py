"""device_fw on CPython: lets the simulator run the firmware's own modules.

On a board the firmware's files sit flat at the root and import each other by plain names
(``import fw_envelope``). Importing this package puts its directory on ``sys.path`` (at the
end, so it shadows nothing) and makes ``device_fw.fw_x`` the very module the firmware imports
as ``fw_x``, so every module is loaded once whichever way it is named::

    from device_fw.fw_mcp import McpServer

MicroPython never runs this file; ``board_files()`` lists what goes onto a board.
"""

import importlib
import importlib.util
import os
import sys

FIRMWARE_DIR = os.path.dirname(os.path.abspath(__file__))
if FIRMWARE_DIR not in sys.path:
    sys.path.append(FIRMWARE_DIR)


class _Alias:
    """A meta path finder: ``device_fw.fw_x`` is the top-level module ``fw_x``."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.startswith(__name__ + ".fw_"):
            return importlib.util.spec_from_loader(fullname, cls)
        return None

    @staticmethod
    def create_module(spec):
        return importlib.import_module(spec.name.rpartition(".")[2])

    @staticmethod
    def exec_module(module):
        """Nothing to run: the top-level import ran the module."""


if _Alias not in sys.meta_path:
    sys.meta_path.insert(0, _Alias)


def board_files():
    """Paths of the files that go onto a board: the firmware's .py files, not this one."""
    return [
        os.path.join(FIRMWARE_DIR, name)
        for name in sorted(os.listdir(FIRMWARE_DIR))
        if name.endswith(".py") and name != "__init__.py"
    ]
