"""The soak run (the control loop against a simulated robot) and the input-load bench, run for real but short."""

import pytest

from vla_policy_node.bench import input_load, soak


def test_soak_drives_the_control_loop_without_a_violation(capsys):
    assert soak.main(['--steps', '400', '--rate-hz', '100', '--window', '200', '--episode-steps', '120']) == 0
    out = capsys.readouterr().out
    assert "'outside_limits': 0, 'over_max_step': 0, 'stale': 0" in out
    assert 'live prefix caches: at most 1' in out
    assert 'FAIL' not in out


@pytest.mark.dds
def test_input_load_bench_measures_the_node(capsys):
    from ros_harness import next_domain_id
    args = ['--seconds', '1.5', '--joint-hz', '200', '--camera-hz', '30', '--domain-id', str(next_domain_id())]
    assert input_load.main(args) == 0
    out = capsys.readouterr().out
    assert 'cost of the high-rate inputs over the baseline' in out
    rows = [line for line in out.splitlines() if line.startswith('| 200 /')]
    assert rows and float(rows[0].split('|')[4]) > 15.0, out      # the node kept commanding
