"""A model folder as a user has one (config.json, random weights as safetensors, a tokenizer),
built offline from an architecture's config.json: what a launch loads where no hub is reachable
(the tests' tiny model, the GPU validation's Llama-3.2-1B).

The tokenizer is a byte-level BPE trained on planner's sample text (planner/launch/sample.txt),
with at most the model's vocabulary; a smaller one only leaves embedding rows unused, which
changes neither memory nor speed.
"""

from pathlib import Path

#: Largest tokenizer trained: the sample text holds far fewer merges than a 128k vocabulary.
MAX_TOKENIZER_VOCAB = 4096


def make_model_folder(config: dict, out: Path, *, dtype: str | None = None, device: str = "cpu",
                      seed: int = 0) -> Path:
    """Write ``config`` (a config.json mapping), random weights in ``dtype`` (None: the config's
    own, else fp32) built on ``device``, and a tokenizer to ``out``; returns ``out``."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    tokenizer(min(int(config["vocab_size"]), MAX_TOKENIZER_VOCAB)).save_pretrained(out)
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(**config)
    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)
    model.save_pretrained(out)
    return out


def tokenizer(vocab_size: int):
    """A fast tokenizer trained on the sample text: byte-level BPE, ``</s>`` as end and padding."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from planner.launch.data import SAMPLE_FILE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(SAMPLE_FILE)], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="</s>")
