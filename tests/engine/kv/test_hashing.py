from __future__ import annotations

import subprocess
import sys

from engine.core.kv.hashing import DIGEST_SIZE, block_keys, root_key

from .conftest import toks


def test_keys_are_chained_and_incremental(bs: int) -> None:
    ids = toks(4 * bs + 1, base=7)
    root = root_key("tenant-a")
    full = block_keys(root, ids, bs, 0, 4)
    assert len(full) == 4 and all(len(k) == DIGEST_SIZE for k in full)
    assert len(set(full)) == 4
    # computing the tail from the last kept key gives the same keys (no rehash of the prefix)
    assert block_keys(full[1], ids, bs, 2, 4) == full[2:]
    assert block_keys(root, ids, bs, 0, 0) == []


def test_key_depends_on_namespace_parent_and_tokens(bs: int) -> None:
    ids = toks(2 * bs)
    a = block_keys(root_key("a"), ids, bs, 0, 2)
    b = block_keys(root_key("b"), ids, bs, 0, 2)
    assert not set(a) & set(b)
    changed = [*ids[:-1], ids[-1] + 1]
    c = block_keys(root_key("a"), changed, bs, 0, 2)
    assert c[0] == a[0] and c[1] != a[1]
    assert block_keys(root_key("a"), ids, bs, 0, 2) == a  # deterministic


def test_importing_engine_kv_does_not_import_torch() -> None:
    code = "import sys, engine.core.kv; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
