"""Regenerate planner/catalog/data/known_keys.json from the installed libraries.

    python tests/tools/known_keys.py planner/catalog/data/known_keys.json

`planner check` rejects keys these libraries do not know, without importing them at run time;
tests/test_check.py keeps the file equal to what the installed libraries accept.
"""

import dataclasses
import json
import sys
from pathlib import Path

import accelerate
import deepspeed
import transformers
from accelerate.commands.config.config_args import ClusterConfig
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig


def zero_keys() -> list[str]:
    keys = set()
    for name, field in DeepSpeedZeroConfig.model_fields.items():
        keys.add(name)
        if field.alias:
            keys.add(field.alias)
    return sorted(keys)


def main() -> None:
    out = {
        "source": {"accelerate": accelerate.__version__, "transformers": transformers.__version__,
                   "deepspeed": deepspeed.__version__},
        "accelerate": sorted(f.name for f in dataclasses.fields(ClusterConfig)),
        "training_args": sorted(f.name for f in dataclasses.fields(transformers.TrainingArguments)),
        "deepspeed_zero": zero_keys(),
    }
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")  # DeepSpeed prints to stdout


if __name__ == "__main__":
    main()
