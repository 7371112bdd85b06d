"""The transformers model a plan trains: built from its config.json, with every technique's model
keyword arguments (planner.runtime.model_kwargs)."""


def build_config(config_json: dict, layers: int | None = None):
    """A transformers config from a config.json mapping, at ``layers`` depth when given, no KV cache."""
    import transformers

    cfg_dict = dict(config_json)
    if layers is not None:
        cfg_dict["n_layer" if cfg_dict.get("model_type") == "gpt2" else "num_hidden_layers"] = layers
    cfg = transformers.AutoConfig.for_model(**cfg_dict)
    cfg.use_cache = False
    return cfg


def build_model(cfg, config):
    """The causal LM with random weights, as the plan builds it (dtype, attention implementation)."""
    import transformers

    from planner.runtime import model_kwargs

    return transformers.AutoModelForCausalLM.from_config(cfg, **model_kwargs(config))


def decoder_layers(model):
    """The repeated decoder blocks (``model.layers`` or GPT-2's ``transformer.h``)."""
    body = model.get_decoder()
    return body.layers if hasattr(body, "layers") else body.h
