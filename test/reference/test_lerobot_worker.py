# SPDX-License-Identifier: Apache-2.0
"""bench/lerobot_worker.py: its pipe protocol, with a stand-in ``lerobot`` package (the real one needs LeRobot)."""

import json
from pathlib import Path
import subprocess
import sys

from safetensors.torch import load_file, save_file
import torch

from vla_policy_node.bench import lerobot_worker

FAKE = '''
import torch
class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.config = "cfg"
    @classmethod
    def from_pretrained(cls, path, strict=False):
        return cls()
    def reset(self):
        pass
    def predict_action_chunk(self, batch, noise):
        return noise + batch["observation.state"][:, None, :]
def get_policy_class(name):
    assert name == "smolvla"
    return Policy
def make_pre_post_processors(config, pretrained_path=None):
    return (lambda raw: {"observation.state": raw["observation.state"] * 0 + len(raw["task"])},
            lambda actions: actions * 2)
'''


def test_worker_answers_ready_run_actions_and_quit(tmp_path):
    pkg = tmp_path / 'fake' / 'lerobot' / 'policies'
    pkg.mkdir(parents=True)
    (tmp_path / 'fake' / 'lerobot' / '__init__.py').write_text('')
    (pkg / '__init__.py').write_text('')
    (pkg / 'factory.py').write_text(FAKE)
    ckpt = tmp_path / 'ckpt'
    ckpt.mkdir()
    (ckpt / 'config.json').write_text(json.dumps({'type': 'smolvla'}))
    save_file({'w': torch.ones(1)}, str(ckpt / 'model.safetensors'))
    inputs = tmp_path / 'inputs.safetensors'
    save_file({'batch.observation.state': torch.ones(2, 3), 'raw.observation.state': torch.ones(2, 3),
               'noise': torch.zeros(2, 4, 3)}, str(inputs), metadata={'tasks': json.dumps(['a', 'b'])})
    proc = subprocess.run(
        [sys.executable, lerobot_worker.__file__, str(ckpt), str(inputs)],
        input=f'run\nactions {tmp_path / "out.safetensors"}\nbogus\nquit\n', capture_output=True, text=True,
        env={'PYTHONPATH': str(tmp_path / 'fake'), 'PATH': '/usr/bin:/bin'}, timeout=120)
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, proc.stderr
    assert replies[0]['ready'] and replies[0]['type'] == 'smolvla' and replies[0]['unexpected'] == []
    assert replies[1]['pipeline_seconds'] >= replies[1]['seconds'] > 0
    saved = load_file(str(Path(replies[2]['saved'])))
    torch.testing.assert_close(saved['actions'], torch.ones(2, 4, 3))          # noise + normalized state
    torch.testing.assert_close(saved['pipeline_actions'], torch.full((2, 4, 3), 4.0))   # (0 + 2 tasks) * 2
    assert 'unknown command' in replies[3]['error'] and len(replies) == 4
