"""Test-only, for processes the end-to-end tests start (on PYTHONPATH there): no C++ is compiled.

On a machine without a GPU, DeepSpeed's torch backend JIT-compiles a shared-memory all-reduce op
(``deepspeed_shm_comm``, a C++ extension) when it starts. It only speeds up CPU collectives, which
GPU jobs never use; the CPU runs in CI go over gloo without it. This makes DeepSpeed's
``build_shm_op`` return None (DeepSpeed's own answer when the op is unavailable) as soon as
``deepspeed.comm.torch`` is imported; everything else DeepSpeed does is untouched.
"""

import importlib.abc
import importlib.machinery
import sys

TARGET = "deepspeed.comm.torch"


class _SkipShmOp(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.build_shm_op = lambda: None

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _SkipShmOp())
