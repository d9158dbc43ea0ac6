"""The device side: what devices connect to (transports, MQTT broker, OTA, camera uploads).

Imports the core (protocol, devices) and net; never the host side.
"""
