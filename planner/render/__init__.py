"""Rendering results for people (rich): one renderer per result type. Nothing here plans."""
