"""Regenerate planner/catalog/data/known_keys.json from the installed libraries.

    python tests/tools/known_keys.py planner/catalog/data/known_keys.json

`planner check` rejects keys these libraries do not know, without importing them at run time;
tests/test_check.py keeps the file equal to what the installed libraries accept.
"""

import ast
import dataclasses
import json
import re
import sys
from pathlib import Path

import accelerate
import deepspeed
import transformers
from accelerate.commands.config.config_args import ClusterConfig, SageMakerConfig
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

IDENT = re.compile(r"[a-z][a-z0-9_]*")


def zero_keys() -> list[str]:
    keys = set()
    for name, field in DeepSpeedZeroConfig.model_fields.items():
        keys.add(name)
        if field.alias:
            keys.add(field.alias)
    return sorted(keys)


def deepspeed_top_keys() -> list[str]:
    """Every name DeepSpeed's config code could read at the JSON's top level: the identifier-like
    string literals and annotated fields of its constants and config modules (a superset: nested
    keys too). DeepSpeed ignores a top-level key it does not read, so planner warns on the rest."""
    root = Path(deepspeed.__file__).parent
    files = sorted({*root.rglob("constants.py"), *root.rglob("config.py"), *(root / "runtime").glob("*config*.py")})
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and IDENT.fullmatch(node.value):
                names.add(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and IDENT.fullmatch(node.target.id):
                names.add(node.target.id)
    return sorted(names)


def main() -> None:
    out = {
        "source": {"accelerate": accelerate.__version__, "transformers": transformers.__version__,
                   "deepspeed": deepspeed.__version__},
        "accelerate": sorted(f.name for f in dataclasses.fields(ClusterConfig)),
        # compute_environment AMAZON_SAGEMAKER: accelerate reads the file as its SageMakerConfig
        "accelerate_sagemaker": sorted(f.name for f in dataclasses.fields(SageMakerConfig)),
        "training_args": sorted(f.name for f in dataclasses.fields(transformers.TrainingArguments)),
        "deepspeed_zero": zero_keys(),
        "deepspeed_top": deepspeed_top_keys(),
    }
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")  # DeepSpeed prints to stdout


if __name__ == "__main__":
    main()
