"""Where clients connect: addresses, listener limits, descriptors, request rates, listeners.

Shared by both listeners; imports only the foundation (errors, config).
"""
