"""The runtime: applies a plan inside a training process where no configuration key can say it.

Imports core and strategies; torch, transformers and accelerate only when a function is called.
"""
