"""The transformers model a plan trains: built from its config.json, with every technique's model
keyword arguments (planner.runtime.model_kwargs)."""


def build_config(config_json: dict, layers: int | None = None):
    """A transformers config from a config.json mapping, at ``layers`` depth when given, no KV cache."""
    import transformers

    from planner.catalog.families import with_depth

    cfg = transformers.AutoConfig.for_model(**with_depth(config_json, layers))
    cfg.use_cache = False
    return cfg


def build_model(cfg, config):
    """The causal LM with random weights, as the plan builds it (dtype, attention implementation)."""
    import transformers

    from planner.runtime import model_kwargs

    # (from_config cannot quantize: a QLoRA plan's 4-bit load is from_pretrained's, which the probes
    # that build from a config stand in for: probes/traced.py computes the NF4 bytes)
    kwargs = {k: v for k, v in model_kwargs(config).items() if k != "quantization_config"}
    return transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)


def decoder_layers(model):
    """The repeated decoder blocks (``model.layers`` or GPT-2's ``transformer.h``)."""
    body = model.get_decoder()
    return body.layers if hasattr(body, "layers") else body.h
