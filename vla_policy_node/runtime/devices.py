# SPDX-License-Identifier: Apache-2.0
"""
The names a user gives a device and a dtype: written once, for the parameters and the runtime.

No torch here: the parameters are checked against these names before anything is loaded; the
runtime turns them into torch's objects (``runtime/policy.py`` ``resolve_device``, ``resolve_dtype``).
"""

from __future__ import annotations

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
DTYPES = FLOAT_DTYPES + ("int8",)     # int8: a float32 model with int8 weights in its CPU matmuls
DEVICES = "auto, cpu, cuda or cuda:N"


def is_device_name(name: str) -> bool:
    """Whether ``name`` is one of DEVICES: 'auto', 'cpu', 'cuda' or 'cuda:N'."""
    return name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())
