# SPDX-License-Identifier: Apache-2.0
"""``benchmarks.closed_loop`` on the tiny model: what it counts from the node, the log and the scheduler simulation."""

import json

import pytest

from benchmarks import closed_loop
from ros_harness import next_domain_id


def test_holds_are_counted_by_reason_from_the_node_log_after_the_start(tmp_path):
    log = tmp_path / "node.log"
    log.write_text("\n".join([
        "[WARN] [100.000000001] [vla_policy_node]: holding: stale input cam0 (age 0.31 s)",       # before the start
        "[WARN] [200.5] [vla_policy_node]: holding: stale input cam0 (age 0.42 s)",
        "[WARN] [201.25] [arm.vla_policy_node]: holding: no action for this tick (policy late)",
        "[WARN] [202.0] [vla_policy_node]: holding: stale input cam0 (age 1.5 s)",
        "[INFO] [203.0] [vla_policy_node]: holding: not a warning",
        "[WARN] [204.0] [vla_policy_sim_robot]: holding: another node",
    ]))
    assert closed_loop.holds_by_reason(log, since=150.0) == {
        "stale input camN (age N s)": 2, "no action for this tick (policy late)": 1}


def test_the_real_time_verdict_is_the_nodes_last_warning_after_the_start(tmp_path):
    log = tmp_path / "node.log"
    log.write_text("\n".join([
        "[WARN] [100.0] [vla_policy_node]: chunking.refill_threshold 0.2 is too low: chunks take 90 ms (p95)",
        "[INFO] [200.0] [vla_policy_node]: ready: smolvla model with RANDOM weights (no checkpoint)",
    ]))
    assert closed_loop.real_time_verdict(log, since=150.0) == "ok (no warning logged)"
    with log.open("a") as f:
        f.write("\n[WARN] [201.0] [vla_policy_node]: holding: waiting for actions from the policy"
                "\n[WARN] [202.0] [arm.vla_policy_node]: too slow for real time: chunks take 1710 ms (p95), and 50")
    verdict = closed_loop.real_time_verdict(log, since=150.0)
    assert verdict == "too slow for real time: chunks take 1710 ms (p95), and 50"


@pytest.mark.dds
def test_closed_loop_counts_ticks_chunks_and_simulates_a_slow_policy(tmp_path):
    slow = tmp_path / "lerobot.json"
    slow.write_text(json.dumps({"lerobot": {"seconds": [2.0, 2.4, 2.2]}}))     # slower than 50 actions at 30 Hz
    out = tmp_path / "result.json"
    assert closed_loop.main(["--config", "tiny", "--threads", "1", "--duration", "4", "--refill-threshold", "0.5",
                             "--domain-id", str(next_domain_id()), "--lerobot-json", str(slow),
                             "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    c = r["counters"]
    assert 0.5 * 4 * 30 <= c["control_ticks"] <= 1.2 * 4 * 30          # the node's 30 Hz timer, on a busy machine
    assert c["chunks_received"] >= 1 and c["waiting_ticks"] >= 1         # the episode starts without a chunk
    assert c["starved_ticks"] + c["waiting_ticks"] <= c["control_ticks"]
    assert len(r["latencies_s"]) >= 1 and 0 < r["chunk_p50_ms"] <= r["chunk_p95_ms"]
    assert r["real_time"].startswith(("ok", "too slow for real time", "chunking.refill_threshold")), r["real_time"]
    ours = r["ours_scheduler_simulation"]
    assert ours["ticks"] == 120 and ours["chunks_received"] >= 1
    theirs = r["lerobot_scheduler_simulation"]
    assert theirs["threshold_needed"] is None                            # no refill setting feeds the robot
    assert theirs["waiting_ticks"] >= 60
