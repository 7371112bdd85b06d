"""Stand-ins that let a launch run on a machine without CUDA (tests and CI, a user's CPU smoke test).
Nothing here acts when CUDA is available.

- transformers refuses bf16 Trainer arguments without a GPU unless ``use_cpu`` is set, and
  ``use_cpu`` would also switch DeepSpeed and FSDP off; the bf16 capability check is answered
  "yes" instead (torch's CPU autocast runs bf16).
- accelerate hands FSDP only to accelerators: launched with ACCELERATE_USE_CPU=1 it runs the
  processes over gloo as MULTI_CPU, and the FSDP plugin the Trainer built from its arguments is
  then given to accelerate here, so accelerate's own FSDP2 preparation runs.
- DeepSpeed runs without ACCELERATE_USE_CPU (it brings up gloo itself); accelerate then counts one
  process, so it is told the real process count.
- FSDP2's CPU offload pins host memory, which needs an accelerator: unpinned here.
- accelerate validates a parallelism config (hybrid FSDP's replicate x shard mesh) before the
  Trainer hands it the FSDP plugin, and refuses MULTI_CPU there: it validates the processes as the
  multi-device run they stand in for (every other check, the mesh's size included, still runs).
- activation-checkpoint offload packs into pinned host memory, which needs an accelerator: the
  ``save_on_cpu`` transformers' and torch's offload wrapper call packs unpinned here (the tensors
  are host tensors already; the packing, and what the live check sees, are the same).
- ring attention (``cp_size`` above 1) has no stand-in: torch's context-parallel dispatcher has no
  sharding rule for the CPU attention kernel, so such a launch is refused before any work.
"""

import os


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def before_training_arguments() -> None:
    if not _no_cuda():
        return
    import transformers.training_args as ta

    if int(os.environ.get("PARALLELISM_CONFIG_CP_SIZE", "1") or 1) > 1:
        from planner.core.errors import PlannerInputError

        raise PlannerInputError("ring attention (parallelism_config_cp_size above 1) does not run without CUDA: torch's "
                                "context-parallel dispatcher has no rule for the CPU attention kernel",
                                hint="Launch it on the GPUs it was planned for.")
    ta.is_torch_bf16_gpu_available = lambda: True
    _unpinned_checkpoint_offload()
    _validate_parallelism_as_multi_device()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        # the arguments make their own PartialState and check DeepSpeed's batch sizes against it at once
        ta.PartialState = _deepspeed_partial_state()


def _unpinned_checkpoint_offload() -> None:
    import torch.distributed.algorithms._checkpoint.checkpoint_wrapper as wrapper
    import transformers.modeling_utils as modeling
    from torch.autograd.graph import save_on_cpu

    class Unpinned(save_on_cpu):
        def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
            super().__init__(pin_memory=False, device_type=device_type)

    modeling.save_on_cpu = wrapper.save_on_cpu = Unpinned


def _validate_parallelism_as_multi_device() -> None:
    from types import SimpleNamespace

    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType

    validate = ParallelismConfig._validate_accelerator

    def as_multi_device(self, accelerator):
        if accelerator.distributed_type != DistributedType.MULTI_CPU:
            return validate(self, accelerator)
        return validate(self, SimpleNamespace(multi_device=True, is_fsdp2=False, num_processes=accelerator.num_processes,
                                              distributed_type=accelerator.distributed_type,
                                              is_main_process=accelerator.is_main_process))

    ParallelismConfig._validate_accelerator = as_multi_device


def _deepspeed_partial_state():
    """accelerate's PartialState, told DeepSpeed's real process count when it is made."""
    from accelerate.state import PartialState

    def made(*args, **kwargs):
        state = PartialState(*args, **kwargs)
        _deepspeed_world()
        return state

    return made


def _deepspeed_world() -> None:
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    state = PartialState()
    if (state.distributed_type == DistributedType.DEEPSPEED and dist.is_initialized()
            and state.num_processes != dist.get_world_size()):
        for shared in (PartialState._shared_state, AcceleratorState._shared_state):
            if shared:  # (an AcceleratorState not made yet takes PartialState's values when it is)
                shared.update(num_processes=dist.get_world_size(), process_index=dist.get_rank(),
                              local_process_index=int(os.environ.get("LOCAL_RANK", "0")))


def after_accelerator(trainer) -> None:
    if not _no_cuda():
        return
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    acc = trainer.accelerator
    shared = (PartialState._shared_state, AcceleratorState._shared_state)
    if trainer.args.fsdp_plugin_args is not None and acc.distributed_type == DistributedType.MULTI_CPU:
        plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
        if isinstance(plugin.cpu_offload, CPUOffloadPolicy):  # pinned host memory needs an accelerator
            plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)
        AcceleratorState._shared_state["fsdp_plugin"] = plugin
        for state in shared:
            state["distributed_type"] = DistributedType.FSDP
        trainer.is_fsdp_enabled = True
    _deepspeed_world()
