"""Core types and units: the vocabulary, specs, the memory and step-time ledgers, errors.

The bottom layer (DESIGN.md): imports the standard library and pydantic only, nothing else of ours.
"""
