"""The device side: what devices connect to (transports, MQTT broker, OTA, camera uploads).

Also who may connect (``admission``), the session each device gets (``sessions``) and the
device listener's app (``http``).

Imports the core (protocol, devices) and net; never the host side.
"""
