"""A tool of your own: one small file (the README walks through it).

List the module in config.json ("tools": ["tool_dice"]) and the device offers
``self.dice.roll``. A module of tools has one function, ``tools(board)``, returning fw_mcp Tools;
``board`` gives access to the hardware (fw_board.Board) if the tool needs it.
"""

import fw_compat as compat
from fw_mcp import Prop, Tool


def tools(board):
    def roll(args):
        sides = args["sides"]
        return [1 + int(compat.uniform(0, sides - 0.001)) for _ in range(args["count"])]

    return [
        Tool(
            "self.dice.roll",
            "Roll dice and return the faces, e.g. [3, 6].",
            [
                Prop("sides", "integer", 6, 2, 100, "faces per die"),
                Prop("count", "integer", 1, 1, 10, "how many dice"),
            ],
            roll,
        )
    ]
