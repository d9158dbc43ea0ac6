"""Replicas of the gateway on an MQTT broker cluster (docs/cluster.md)."""
