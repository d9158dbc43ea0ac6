"""Live device connections, the device registry, and the calls routed to devices."""
