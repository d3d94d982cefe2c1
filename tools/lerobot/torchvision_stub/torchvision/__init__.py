# SPDX-License-Identifier: Apache-2.0
"""Stand-in for ``torchvision`` in the LeRobot fixture venvs (tools/lerobot/setup_env.sh).

LeRobot >= 0.5 imports torchvision at module level in places that the SmolVLA / pi0 / pi0.5 *inference* paths
import but never call. The torchvision wheel that matches torch 2.13 on PyPI is CUDA-linked and does not import
on this CPU-only machine, so this package stands in for it: every ``torchvision.*`` submodule can be imported,
every attribute exists, classes can even be subclassed, but calling or instantiating anything raises
``RuntimeError``, so any use on a path that matters fails loudly instead of silently. There is no
``torchvision-*.dist-info`` (``importlib.metadata`` does not see it), but transformers 5 detects packages with
``importlib.util.find_spec`` only, so ``transformers.utils.is_torchvision_available()`` returns True; nothing on the
SmolVLA / pi0 / pi0.5 inference paths calls into torchvision (the fixture generator and checker run with it).

One transform is real: ``torchvision.transforms.ToTensor``, which LeRobot's image (non-video) datasets call
on every PIL frame they read (``lerobot.datasets.io_utils.pil_to_chw_tensor``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+lerobot.fixture.stub"
STUB = True


def _fail(what: str):
    raise RuntimeError(
        f"{what}: torchvision is a stub in this environment (tools/lerobot/torchvision_stub); "
        "the policy inference paths are not supposed to call it"
    )


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        _fail(f"{cls.__qualname__}(...)")


def _make(qualname: str):
    return _StubMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": __name__})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        obj = _make(full)
        setattr(self, name, obj)
        return obj


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        setattr(sys.modules[parent], child, module)
        if module.__name__ == __name__ + ".transforms":
            module.ToTensor = ToTensor


class ToTensor:
    """torchvision's ToTensor: a PIL image or (H, W, C) array -> float32 (C, H, W), uint8 scaled to [0, 1]."""

    def __call__(self, pic):
        import numpy as np
        import torch

        array = np.array(pic)
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
        return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "transforms":
        import importlib

        return importlib.import_module(f"{__name__}.transforms")
    obj = _make(f"{__name__}.{name}")
    globals()[name] = obj
    return obj
