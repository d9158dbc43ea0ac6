"""The board runs this after boot.py: start the firmware (fw_app) and serve forever."""

import asyncio

import fw_app

asyncio.run(fw_app.start())
