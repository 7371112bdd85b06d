"""The tiled MLP in a training process (strategies/tiled_mlp.py): each decoder layer's MLP runs
through DeepSpeed's ``TiledMLP``, with the MLP class's own forward as the tiled function, as
DeepSpeed's tutorial patches ``LlamaMLP.forward``. No configuration key says it, so it is applied
at every site: the launch, the measured probe and the traced one (its autograd function is plain
torch, so it runs under fake tensors)."""

from types import MethodType

from planner.runtime import Site
from planner.runtime.model import decoder_layers
from planner.strategies.tiled_mlp import TiledMlp, tiled_mlp_tiles

#: The attribute a tiled MLP module carries (planner.launch.live reads it back): its tile count rule's hidden size.
MARK = "_planner_tiled_mlp"


def _agreed(tiles: int, device, site: Site) -> int:
    """Every rank's tile count, the largest (DeepSpeed's tutorial: a rank running fewer tiles than
    the others would stop supplying its ZeRO-3 weight shards: a deadlock); a rank alone, or the
    traced probe's fake process group, keeps its own."""
    if site == Site.TRACED:
        return tiles
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tiles
    count = torch.tensor(tiles, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _untracked_no_grad(own):
    """The MLP's forward given a detached tile where grad mode is off (``TiledMLP``'s forward): a
    view of a tensor that requires grad, made under no_grad, requires grad with no grad function,
    which the traced probe's module tracker (torch ModTracker) cannot hook. The same tensors and
    bytes; the backward's tiles (grad mode on) pass as they are."""
    import torch

    def forward(self, x):
        return own(self, x if torch.is_grad_enabled() else x.detach())

    return forward


def prepare(model, config, site: Site, **_) -> str | None:
    if config.tiled_mlp != TiledMlp.TILED:
        return None
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    hidden = model.config.hidden_size
    layers = decoder_layers(model)
    for layer in layers:
        mlp = layer.mlp
        own, weights = type(mlp).forward, list(mlp.parameters())
        if site == Site.TRACED:
            own = _untracked_no_grad(own)

        def forward(self, x, _own=own, _weights=weights):
            tiles = _agreed(tiled_mlp_tiles(x.shape[-2], hidden), x.device, site)
            return TiledMLP.apply(_own, self, x, tiles, _weights)

        mlp.forward = MethodType(forward, mlp)
        setattr(mlp, MARK, hidden)
    return f"tiled MLP: DeepSpeed's TiledMLP in {len(layers)} decoder layers, ceil(seq / {hidden}) tiles"
