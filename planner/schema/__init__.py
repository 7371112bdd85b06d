"""The request and result models every command speaks.

The engine answers requests with these results; render, emit, check, probes and the command line
read them by type from here, not from the engine that computes them.
"""
