"""A tiny model folder as a user has one: config, random weights and a tokenizer (a byte-level BPE
trained on planner's sample text), built offline from tests/data/tiny-llama/config.json."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CONFIG = ROOT / "tests" / "data" / "tiny-llama" / "config.json"


def make_tiny_model(out: Path, seed: int = 0) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from planner.launch.data import SAMPLE_FILE

    config = json.loads(CONFIG.read_text())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(SAMPLE_FILE)], trainers.BpeTrainer(vocab_size=config["vocab_size"], special_tokens=["</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="</s>")
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    model.save_pretrained(out)
    return out
