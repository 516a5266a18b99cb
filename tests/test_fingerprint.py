"""harness/fingerprint.py: BLAKE3 on the device, byte for byte the blake3 package's digest.

The package is the oracle. Without a GPU the kernels run in Triton's interpreter on CPU tensors
(conftest.py sets TRITON_INTERPRET before anything imports triton): about a second per leaf
program there, so the inputs stay a few KB and the keyed mode is checked on fewer lengths than
the plain one (the two differ only in the key words and a flag, both covered). With a GPU the
same tests run the compiled kernels on it, and the gpu tests add large inputs. The e2e test
compiles the kernels for A100 and H100 without a GPU and reads the machine code.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:                   # run as a script: the e2e test's child
    sys.path.insert(0, str(ROOT))

import blake3  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from harness import fingerprint  # noqa: E402
from harness.fingerprint import blake3_device, blake3_digest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KEY = bytes(range(7, 7 + 32))
# every class of length: empty, within a block, block edges, within a chunk, chunk edges, a tree
# with an odd node carried up (3 chunks), and 6 chunks with a short last one
LENGTHS = [0, 1, 63, 64, 65, 1024, 1025, 3072, 5 * 1024 + 7]  # chunk edges, an odd tree, a partial last chunk


def random_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def oracle(data, key=None):
    return (blake3.blake3(data.tobytes(), key=key) if key is not None else blake3.blake3(data.tobytes())).digest()


def on_device(data):
    return torch.from_numpy(data).to(DEVICE)


@pytest.mark.parametrize("n", LENGTHS)
def test_plain_hash_is_the_blake3_packages(n):
    data = random_bytes(n, n)
    assert blake3_digest(on_device(data)) == oracle(data)


@pytest.mark.parametrize("n", [0, 64, 5 * 1024 + 7])
def test_keyed_hash_is_the_blake3_packages(n):
    data = random_bytes(n, 1000 + n)
    got = blake3_digest(on_device(data), KEY)
    assert got == oracle(data, KEY)
    assert got != oracle(data)                  # the key is used, not ignored


def test_a_tree_of_several_launches_is_the_blake3_packages():
    """Two chunks a leaf program and two nodes a merge program: 5 chunks make 3 leaf programs (the
    last a lone short chunk), then a merge launch of 2 programs (the second carries its one node
    up) and a last one for the root, so that every seam between launches is crossed."""
    data = random_bytes(4 * 1024 + 1, 7)
    root = fingerprint._launch_tree(on_device(data), KEY, leaf_block=2, merge_block=2)
    assert bytes(root.view(torch.uint8).cpu().numpy()) == oracle(data, KEY)


def test_one_flipped_bit_changes_the_digest():
    data = random_bytes(65, 11)
    before = blake3_digest(on_device(data))
    for bit in (0, 63 * 8 + 7, 64 * 8 + 4):     # the first and the last byte of the first block, the second block
        flipped = data.copy()
        flipped[bit // 8] ^= 1 << (bit % 8)
        after = blake3_digest(on_device(flipped))
        assert after != before and after == oracle(flipped), bit


def test_the_device_digest_stays_on_the_device():
    data = random_bytes(100, 3)
    digest = blake3_device(on_device(data), KEY)
    assert digest.device.type == DEVICE and digest.dtype == torch.uint8 and digest.shape == (32,)
    assert bytes(digest.cpu().numpy()) == oracle(data, KEY)


def test_what_it_cannot_hash_is_refused_with_the_fix(monkeypatch):
    raw = on_device(random_bytes(64, 5))
    for bad, said in [(raw.view(torch.int32), "got torch.int32"), (raw.reshape(8, 8), r"got shape \(8, 8\)"),
                      (raw[::2], "got a strided view"), (raw.cpu().numpy(), "got ndarray")]:
        with pytest.raises(ValueError, match=f"flat contiguous uint8 tensor, {said}: pass t.contiguous"):
            blake3_digest(bad)
    with pytest.raises(ValueError, match="key is 32 bytes, got 16"):
        blake3_digest(raw, bytes(16))
    with pytest.raises(ValueError, match="key is 32 bytes, got str"):
        blake3_digest(raw, "k" * 32)
    if DEVICE == "cpu":                         # as when Triton compiles for a GPU: a CPU tensor cannot go
        monkeypatch.setattr(fingerprint, "_leaf_kernel", object())
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        blake3_digest(raw.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1 << 20, (64 << 20) + 5], ids=["1MB", "64MB+5"])
def test_large_inputs_on_the_gpu(n):
    """The package's digest of large inputs; the device time per digest is reported, not judged."""
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda",
                        generator=torch.Generator("cuda").manual_seed(n))
    host = raw.cpu().numpy()
    for key in (None, KEY):
        assert blake3_digest(raw, key) == oracle(host, key), f"{n} bytes, key={key is not None}"
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        digest = blake3_device(raw, KEY)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / reps
    gpu = torch.cuda.get_device_name()
    report = f"{n} bytes on {gpu}: {seconds * 1e6:.0f} us a digest, {n / seconds / 1e9:.1f} GB/s"
    print(report)
    assert bytes(digest.cpu().numpy()) == oracle(host, KEY), report


@pytest.mark.gpu
def test_a_view_that_starts_unaligned_on_the_gpu():
    """A view one byte into its storage gets Triton's variant for an unaligned pointer (byte loads)."""
    raw = torch.randint(0, 256, (3 * 1024 + 9,), dtype=torch.uint8, device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    view = raw[1:]
    assert view.data_ptr() % 16 == 1
    assert blake3_digest(view, KEY) == oracle(raw.cpu().numpy()[1:], KEY)


# ---- compiled for the GPUs the project targets, without one -----------------------------------

@pytest.mark.e2e
def test_the_kernels_compile_for_a100_and_h100_without_spilling(tmp_path):
    """Triton compiles for a GPU that is not here when told its target: the leaf and merge kernels
    for sm_80 and sm_90, with the shapes a 64 MB input gets. The leaf kernel must load its
    64-byte rows as 16-byte vectors and keep its state in registers: a byte-wise masked load once
    took it to 255 registers and spilled (local memory in every compression)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    r = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    kernels = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(kernels) == ["_leaf_kernel sm_80", "_leaf_kernel sm_90", "_merge_kernel sm_80", "_merge_kernel sm_90"]
    for name, k in kernels.items():
        assert k["local"] == 0 and k["stack"] == 0, (name, k)
        assert k["registers"] <= 128, (name, k)
        if name.startswith("_leaf_kernel"):
            assert k["vector_loads"] == 4, (name, k)     # 4 rows of 16 bytes a thread: the block's 2 KB


def _compile_for(arch):
    """{kernel: resources} of the kernels a 64 MB digest launches, compiled for sm_`arch`, none run."""
    import re
    import tempfile

    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    class Target:
        def get_current_target(self):
            return GPUTarget("cuda", arch, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    compiled, launch = {}, JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        compiled[f"{self.__name__} sm_{arch}"] = kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        return kernel

    driver.set_active(Target())
    JITFunction.run = compile_only
    try:                                        # meta tensors: shapes, no memory; the launches compile only
        fingerprint._launch_tree(torch.empty((64 << 20) + 5, dtype=torch.uint8, device="meta"), None,
                                 fingerprint.LEAF_BLOCK, fingerprint.MERGE_BLOCK)
    finally:
        JITFunction.run = launch
    out = {}
    for name, kernel in compiled.items():
        cubin = Path(tempfile.mkdtemp(), "kernel.cubin")
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
        field = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage)}
        out[name] = {"registers": field["REG"], "stack": field["STACK"], "local": field["LOCAL"],
                     "vector_loads": len(re.findall(r"LDG\.E\.128", kernel.asm["sass"]))}
    return out


if __name__ == "__main__":                      # the e2e test's child: Triton as on a GPU machine
    print(json.dumps({name: k for arch in (80, 90) for name, k in _compile_for(arch).items()}))
