# SPDX-License-Identifier: Apache-2.0
"""The server's Fast DDS profile (release_reader_memory): its readers free what they took, unless the user sets one."""

from __future__ import annotations

from pathlib import Path

from vla_policy_node.ros.server.node import FASTDDS_SETTINGS, release_reader_memory


def test_the_server_readers_free_their_samples_unless_the_user_configures_fast_dds():
    environ: dict[str, str] = {}
    path = release_reader_memory(environ)
    text = Path(path).read_text()
    assert '<historyMemoryPolicy>DYNAMIC</historyMemoryPolicy>' in text and 'data_reader' in text
    assert environ == {'FASTDDS_DEFAULT_PROFILES_FILE': path, 'FASTRTPS_DEFAULT_PROFILES_FILE': path,
                       'RMW_FASTRTPS_USE_QOS_FROM_XML': '1'}
    for name in FASTDDS_SETTINGS:                   # the user's own profile wins
        assert release_reader_memory({name: 'theirs'}) is None
    assert release_reader_memory({'RMW_IMPLEMENTATION': 'rmw_cyclonedds_cpp'}) is None
