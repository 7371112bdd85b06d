"""The base of every pydantic model planner defines."""

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """A pydantic model whose validation schema is built on its first use, not at import.

    ``defer_build``: building the schemas of planner's ~60 models at import costs ~0.1 s of the
    0.5 s a planning command may take (docs/architecture.md), and most commands validate a few
    of them. A subclass's ``model_config`` merges with this one (pydantic's config inheritance).
    """

    model_config = ConfigDict(defer_build=True)
