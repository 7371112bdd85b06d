"""The attention implementation: transformers' ``attn_implementation`` (sdpa or eager)."""


def model_kwargs(config) -> dict:
    return {"attn_implementation": str(config.attention)}
