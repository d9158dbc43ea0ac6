"""Where clients connect: addresses, listener limits, descriptors, request rates.

Shared by both listeners; imports only the foundation (errors, config).
"""
