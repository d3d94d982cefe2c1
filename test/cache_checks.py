# SPDX-License-Identifier: Apache-2.0
"""A check the tests make of a frozen prefix cache after the denoising steps."""

from vla_policy_node.model.prefix_cache import VLAPrefixCache


def assert_frozen_prefix_unchanged(cache: VLAPrefixCache) -> None:
    """Read every layer through the cache, which raises ReadOnlyCacheError if one was written in place."""
    assert cache.read_only
    for i, (k, v) in enumerate(cache.layers):
        cache.update(k[..., :1, :].clone(), v[..., :1, :].clone(), i)
