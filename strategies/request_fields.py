"""Request fields for every registered technique (the registry's vocabulary, for the engine's
requests): ``TechniqueChoices`` holds one optional value per technique (estimate, probe, check);
``TechniqueLists`` a list per technique (suggest, tune: the values the search may use). Both hold
each technique's settings (LoRA's rank, ...) as one optional value: the search never varies them."""

from typing import TYPE_CHECKING

from pydantic import ConfigDict

from planner.core.record import Record
from planner.core.vocabulary import choice_model
from planner.strategies import SETTINGS, TECHNIQUES


class _Request(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)


if TYPE_CHECKING:  # the same models, written out (strategies/static_types.py)
    from planner.strategies.static_types import TechniqueChoices, TechniqueLists
else:
    TechniqueChoices = choice_model("TechniqueChoices", [(s.field, s.enum) for s in TECHNIQUES], many=False,
                                    base=_Request, settings=SETTINGS)
    TechniqueLists = choice_model("TechniqueLists", [(s.field, s.enum) for s in TECHNIQUES], many=True,
                                  base=_Request, settings=SETTINGS)
