"""Catalogs: model and GPU facts shipped as data files (one file each, each with a source)."""

from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
