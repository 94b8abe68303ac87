"""FileTier: aligned blocks with checksums, O_DIRECT detection, zero-copy reads, and every failure mode.

Disk full is simulated portably with RLIMIT_FSIZE in a subprocess (the kernel then fails the write with
EFBIG exactly where ENOSPC would appear); read-only directories with chmod, or, when running as root
(who bypasses mode bits), with `setpriv` dropping CAP_DAC_OVERRIDE in a subprocess.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mlsyskit.core.storage_errors import (
    BlockNotFoundError,
    BufferTooSmallError,
    CorruptBlockError,
    DiskFullError,
    MissingDirectoryError,
    StoragePermissionError,
)
from mlsyskit.tools.offload.filetier import ALIGN, FileTier, address_of, aligned_buffer, as_bytes_view
from mlsyskit.tools.offload.memory import aligned_empty


@pytest.fixture(params=[None, False], ids=["auto-direct", "buffered"])
def tier(request, tmp_path):
    with FileTier(tmp_path, direct=request.param, workers=2) as t:
        yield t


def _odirect_works(directory) -> bool:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    buf = aligned_buffer(ALIGN)
    try:
        fd = os.open(directory / "manual-probe", os.O_WRONLY | os.O_CREAT | flag, 0o644)
    except OSError:
        return False
    try:
        os.pwrite(fd, buf, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(directory / "manual-probe")


def test_odirect_detected_at_open(tmp_path):
    expected = _odirect_works(tmp_path)  # ext4/xfs (and tmpfs since Linux 6.6) support it
    with FileTier(tmp_path) as t:
        assert t.direct == expected
    with FileTier(tmp_path, direct=False) as t:
        assert not t.direct


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 1 << 20])
def test_round_trip_sizes(tier, nbytes):
    rng = np.random.default_rng(nbytes)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    assert tier.write("blk", data) == nbytes
    out = np.zeros(nbytes + 3, dtype=np.uint8)
    assert tier.read_into("blk", out) == nbytes
    assert np.array_equal(out[:nbytes], data)


def test_zero_copy_path_for_aligned_buffers(tmp_path):
    with FileTier(tmp_path) as t:
        if not t.direct:
            pytest.skip("filesystem without O_DIRECT: buffered path has no bounce buffers to avoid")
        src = aligned_empty(3 * ALIGN)
        src.copy_(torch.arange(3 * ALIGN, dtype=torch.int64).to(torch.uint8))
        dst = aligned_empty(3 * ALIGN)
        t.write("w", src, length=3 * ALIGN - 100)  # padded length still fits the aligned buffer
        t.read_into("w", dst)
        assert t.stats.bounce_copies == 0
        assert torch.equal(dst[: 3 * ALIGN - 100], src[: 3 * ALIGN - 100])
        unaligned = np.zeros(3 * ALIGN + 1, dtype=np.uint8)[1:]
        assert address_of(as_bytes_view(unaligned)) % ALIGN != 0
        t.read_into("w", unaligned)
        assert t.stats.bounce_copies == 1
        assert np.array_equal(unaligned[: 3 * ALIGN - 100], src.numpy()[: 3 * ALIGN - 100])


def test_overwrite_with_shorter_block_and_typed_tensors(tier):
    big = torch.randn(5000)
    tier.write("p", big)
    small = torch.randn(10, dtype=torch.bfloat16)
    tier.write("p", small)
    out = torch.empty(10, dtype=torch.bfloat16)
    assert tier.read_into("p", out) == 20
    assert torch.equal(out, small)


def test_async_reads_and_writes(tier):
    arrays = {f"k{i}": np.full(10_000 + i, i, dtype=np.uint8) for i in range(8)}
    for fut in [tier.submit_write(k, a) for k, a in arrays.items()]:
        fut.result()
    outs = {k: aligned_buffer(20_000) for k in arrays}
    futs = {k: tier.submit_read(k, outs[k]) for k in arrays}
    for k, fut in futs.items():
        n = fut.result()
        assert n == len(arrays[k]) and bytes(outs[k][:n]) == arrays[k].tobytes()
    assert tier.keys() == sorted(arrays)
    assert tier.stats.reads == 8 and tier.stats.writes == 8


def _flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_corrupt_payload_detected_naming_file_and_block(tier):
    tier.write("layer3.weight", np.arange(2000, dtype=np.float32))
    _flip_byte(tier.path("layer3.weight"), ALIGN + 777)
    out = np.zeros(2000, dtype=np.float32)
    with pytest.raises(CorruptBlockError, match=r"corrupt block 'layer3.weight' in .*layer3.weight.blk: payload "
                                                r"checksum mismatch") as info:
        tier.read_into("layer3.weight", out)
    assert info.value.block == "layer3.weight" and info.value.path == tier.path("layer3.weight")


@pytest.mark.parametrize("offset,reason", [(0, "bad magic"), (100, "header checksum"), (ALIGN - 2, "header checksum")])
def test_corrupt_header_detected(tier, offset, reason):
    tier.write("b", b"x" * 5000)
    _flip_byte(tier.path("b"), offset)
    with pytest.raises(CorruptBlockError, match=reason):
        tier.read_into("b", bytearray(8192))


def test_truncated_and_misnamed_blocks(tier):
    tier.write("a", b"y" * 9000)
    with open(tier.path("a"), "r+b") as f:
        f.truncate(ALIGN + 100)
    with pytest.raises(CorruptBlockError, match="truncated payload"):
        tier.read_into("a", aligned_buffer(9000))
    tier.write("c", b"z" * 10)
    shutil.copy(tier.path("c"), tier.path("d"))
    with pytest.raises(CorruptBlockError, match="header names block 'c'"):
        tier.read_into("d", bytearray(ALIGN))


def test_missing_block_small_buffer_and_bad_key(tier):
    with pytest.raises(BlockNotFoundError, match="no block 'ghost'"):
        tier.read_into("ghost", bytearray(10))
    tier.write("k", b"q" * 100)
    with pytest.raises(BufferTooSmallError, match="has 100 bytes; the buffer holds 50"):
        tier.read_into("k", bytearray(50))
    with pytest.raises(ValueError, match="block key"):
        tier.write("../escape", b"x")
    tier.delete("k")
    assert not tier.exists("k")


def test_missing_directory(tmp_path):
    with pytest.raises(MissingDirectoryError, match="does not exist"):
        FileTier(tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(MissingDirectoryError, match="not a directory"):
        FileTier(tmp_path / "file")


def _run_restricted(code: str, prefix: list[str], preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, preexec_fn=preexec)


@pytest.mark.slow  # a subprocess (setpriv)
def test_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code = f"""
        from mlsyskit.core.storage_errors import StoragePermissionError
        from mlsyskit.tools.offload.filetier import FileTier
        try:
            FileTier({str(ro)!r})
        except StoragePermissionError as e:
            print("OK", e)
    """
    try:
        if os.geteuid() != 0:
            with pytest.raises(StoragePermissionError, match="permission denied"):
                FileTier(ro)
            return
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
        r = _run_restricted(code, ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("OK permission denied or read-only filesystem while opening file tier"), r.stdout
    finally:
        ro.chmod(0o755)


@pytest.mark.slow  # a subprocess under RLIMIT_FSIZE
def test_disk_full_via_file_size_limit(tmp_path):
    """RLIMIT_FSIZE = 64 KiB: the probe passes, a 1 MiB block write fails with EFBIG -> DiskFullError."""
    code = f"""
        import resource, signal
        import numpy as np
        from mlsyskit.core.storage_errors import DiskFullError
        from mlsyskit.tools.offload.filetier import FileTier
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        t = FileTier({str(tmp_path)!r})
        t.write("small", np.zeros(1000, np.uint8))
        try:
            t.write("big", np.zeros(1 << 20, np.uint8))
        except DiskFullError as e:
            print("OK", e)
    """
    r = _run_restricted(code, [])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK disk full or file-size limit reached while writing block 'big'"), r.stdout


def test_disk_full_enospc_from_the_kernel_call(tmp_path, monkeypatch):
    """ENOSPC itself (what a full NVMe returns), injected at os.pwritev."""
    t = FileTier(tmp_path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    with pytest.raises(DiskFullError, match="writing block 'x'"):
        t.write("x", b"abc")
    t.close()


def test_blocks_carry_an_xxh3_checksum_and_version_1_crc32_blocks_still_read(tmp_path):
    """Format 2 checksums the payload with XXH3-64 (cheaper than crc32 on the hot path); a block written in
    format 1 (zlib.crc32) is still read and verified."""
    import struct
    import zlib

    import xxhash

    from mlsyskit.tools.offload import filetier

    payload = np.arange(3000, dtype=np.float32).tobytes()
    with FileTier(tmp_path, direct=False) as t:
        t.write("new", payload)
        header = t.path("new").read_bytes()[:ALIGN]
        fields = filetier._FIXED.unpack_from(header, 0)
        assert fields[1] == 2 and fields[4] == xxhash.xxh3_64_intdigest(payload)
        old = bytearray(ALIGN)
        filetier._FIXED_V1.pack_into(old, 0, filetier.BLOCK_MAGIC, 1, 0, len(payload), zlib.crc32(payload), 3)
        old[filetier._FIXED_V1.size:filetier._FIXED_V1.size + 3] = b"old"
        struct.pack_into("<I", old, ALIGN - 4, zlib.crc32(bytes(old[:ALIGN - 4])))
        t.path("old").write_bytes(bytes(old) + payload)
        out = np.zeros(3000, dtype=np.float32)
        assert t.read_into("old", out) == len(payload) and out.tobytes() == payload
        t.path("old").write_bytes(bytes(old) + payload[:-1] + b"\x01")
        with pytest.raises(CorruptBlockError, match="payload checksum mismatch"):
            t.read_into("old", out)
