# SPDX-License-Identifier: Apache-2.0
"""A Hugging Face hub cache laid out as ``huggingface_hub`` writes it, built from a checkpoint folder."""

import hashlib
import os
from pathlib import Path

REPO_ID = 'lerobot/tiny_test'
REVISION = 'a' * 40


def make_cache(cache: Path, source: Path, repo_id: str = REPO_ID, revision: str = REVISION) -> Path:
    """Copy ``source`` into a hub cache as ``huggingface_hub`` lays it out; return the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / 'snapshots' / revision
    (repo / 'blobs').mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in source.rglob('*') if p.is_file()):
        data = file.read_bytes()
        blob = repo / 'blobs' / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / 'refs').mkdir(exist_ok=True)
    (repo / 'refs' / 'main').write_text(revision)
    return snapshot
