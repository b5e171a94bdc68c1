"""The trainer's own fp32 weights and EMA in last.pt are packed: one flat tensor per dtype, with
each entry's name, dtype and shape, so a checkpoint pickles a few tensors instead of one per
entry. Unpacked, they are the state dict as it was, bit for bit; a checkpoint written before
packing still loads; and the file still unpickles without this package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from trainer import checkpoint


def state() -> dict[str, torch.Tensor]:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(2, 5))
    model[0].weight.data.normal_()
    sd = dict(model.state_dict())
    sd["half"] = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    sd["scalar"] = torch.tensor(3.5)
    return sd


def test_unpack_gives_back_every_entry_bit_for_bit_in_order() -> None:
    sd = state()
    packed = checkpoint.pack(sd)
    assert sorted(packed["flat"]) == ["float16", "float32", "int64"]  # num_batches_tracked is int64
    back = checkpoint.unpack(packed)
    assert list(back) == list(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(2, 5))
    model.load_state_dict({k: v for k, v in back.items() if k not in ("half", "scalar")})


def test_each_unpacked_entry_pickles_alone_not_with_the_whole_flat_tensor() -> None:
    """The resume broadcasts the unpacked state dict (pickled): an entry that was a view of the
    flat tensor carried all of it, once per entry."""
    import io

    sd = {f"w{i}": torch.zeros(1000) for i in range(50)}
    back = checkpoint.unpack(checkpoint.pack(sd))
    buf = io.BytesIO()
    torch.save(back["w0"], buf)
    assert buf.tell() < 3 * 4000 + 2000  # one entry's 4000 bytes (and the file's frame), not 50 entries'
    assert all(v.untyped_storage().nbytes() == 4000 for v in back.values())


def test_pack_copies_so_a_later_step_does_not_change_what_was_saved() -> None:
    sd = state()
    packed = checkpoint.pack(sd)
    before = sd["0.weight"].clone()
    sd["0.weight"].add_(1.0)
    assert torch.equal(checkpoint.unpack(packed)["0.weight"], before)


def test_a_state_dict_saved_before_packing_unpacks_as_it_is() -> None:
    sd = state()
    back = checkpoint.unpack(sd)
    assert list(back) == list(sd) and all(back[k] is v for k, v in sd.items())


def test_a_packed_file_holds_only_plain_types_and_round_trips(tmp_path: Path) -> None:
    sd = state()
    path = tmp_path / "ck.pt"
    checkpoint.save_atomic({"trainer": {"model": checkpoint.pack(sd)}}, path)
    # unpickled by a fresh interpreter that never imports this package: no class of ours in the file
    code = "import sys, torch; d = torch.load(sys.argv[1], weights_only=True); print(sorted(d['trainer']['model']))"
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['dtypes',", "'flat',", "'format',", "'keys',", "'shapes']"]
    loaded = torch.load(path, weights_only=False)["trainer"]["model"]
    assert all(torch.equal(checkpoint.unpack(loaded)[k], v) for k, v in sd.items())
