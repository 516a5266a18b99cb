"""fingerprint.py: BLAKE3 of a tensor's bytes, computed on the tensor's own device by Triton.

Why. Inside a timed window a candidate worker must prove that a call's outputs existed before the
window closed, and on a GPU it cannot copy them to the host to do so (the copy would dominate a
small kernel's time). So it commits to a fingerprint computed on the device; afterwards it hands
over the bytes of one call the parent picks, and the trusted reference worker recomputes the
fingerprint from them. The proof is as strong as the fingerprint is binding. A keyed byte sum is
linear in the bytes: a candidate that learns the key can change bytes in pairs that cancel, and
hand over bytes it never committed to. A cryptographic hash closes that: nobody can find other
bytes with the same digest, key known or not.

Why BLAKE3. It is a tree: the bytes are cut into 1024-byte chunks, each chunk is hashed on its
own (one GPU lane per chunk), and the chunks' 32-byte chaining values are merged pairwise up a
binary tree, so the work spreads over the whole GPU. Its compression is 7 rounds of add, xor and
rotate on 32-bit words (no tables, no multiplies), it has a keyed mode, and the CPU side of the
harness already hashes with the `blake3` package: this module returns exactly that package's bytes
(`blake3.blake3(data, key=key).digest()`), so the trusted side can check a device digest with it.

BLAKE3 in brief (the specification's section 2; the names below are its names):
- `compress(cv, m, counter, block_len, flags)` mixes a 64-byte block (16 little-endian words m)
  into an 8-word chaining value cv: 16 state words (cv, 4 IV words, the 64-bit counter, the
  block's length, flags), 7 rounds of 8 G mixes (columns, then diagonals), the message words
  permuted between rounds; the new cv is the first half of the state xor the second half.
- A chunk (1024 bytes, the last one may be shorter, an empty input is one empty chunk) compresses
  its 64-byte blocks in turn, the first starting from the key words, with the chunk's index as
  counter, CHUNK_START on its first block and CHUNK_END on its last (zero-padded, with its true
  length).
- Parents: the cvs of two children are one 64-byte block, compressed from the key words with
  counter 0 and PARENT. The tree is left-balanced (a left subtree holds the largest power of two
  of chunks that leaves at least one for the right), which is what merging the nodes of each
  level pairwise, the odd last one carried up unchanged, builds.
- The root's compression adds ROOT, and its cv is the 32-byte digest; a single chunk is its own
  root (ROOT on its last block).
- Unkeyed, the key words are the IV (SHA-256's); keyed, the 32-byte key's 8 words, and every
  compression adds KEYED_HASH.

On the device. Lanes are chunks: a leaf program holds LEAF_BLOCK chunks as the lanes of [BLOCK]
uint32 tensors, one tensor per state word, and walks their 16 blocks together. A block arrives as
one [BLOCK, 64] byte tile (16-byte loads) whose 16 word columns are split off; a short last chunk
is read from a zero-padded copy, so that no load is masked byte by byte (that would hold an
address and a predicate a byte, and spill). A program's chunks are an aligned run of 2^k, which
no pair of any level straddles, so it merges them itself, k levels up (at level j, lane i takes
lane i + 2^j's cv with tl.gather), and writes one cv; merge launches do the same to MERGE_BLOCK
cvs a program until one is left: one launch up to 32 KB, three for 64 MB. The adds wrap modulo
2^32 (uint32 arithmetic, on the GPU and in the interpreter alike) and a uint32's right shift is
logical, so a rotation is two shifts and an or, which the compiler makes one funnel shift.
Compiled for sm_90 (Triton 3.7.1), a block's compression in the leaf loop is about 760
instructions, the kernel 64 registers and no spills. (A view that does not start 16-byte aligned
gets Triton's variant for an unaligned pointer: byte loads, slower, the same digest.)

On a CPU tensor the kernels run in Triton's interpreter (TRITON_INTERPRET=1 before triton is
imported), so the tests check these very kernels against the `blake3` package without a GPU.
It is slow there (about a second per leaf program: 16 compressions of numpy calls); the CPU
side of the harness hashes with the package itself.

Not here: output longer than 32 bytes, the derive_key mode, incremental hashing.
"""
import contextlib

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

CHUNK_LEN = tl.constexpr(1024)         # bytes of a leaf
BLOCK_LEN = tl.constexpr(64)           # bytes of one compression's message
LEAF_BLOCK = 32                        # chunks per leaf program: one warp, a lane a chunk
MERGE_BLOCK = 256                      # chaining values per merge program: 8 levels of the tree

# The flags of a compression (domain separation: no two roles of a compression ever collide)
CHUNK_START = tl.constexpr(1)
CHUNK_END = tl.constexpr(2)
PARENT = tl.constexpr(4)
ROOT = tl.constexpr(8)
KEYED_HASH = tl.constexpr(16)
# SHA-256's initial hash words: the key words of an unkeyed hash, and state words 8..11 always
IV = tl.constexpr((0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19))


# ---------------------------------------------------------------------------------------------
# The compression function, on [lanes] uint32 tensors
# ---------------------------------------------------------------------------------------------

@triton.jit
def _g(a, b, c, d, x, y):
    """BLAKE3's quarter round: mixes message words x, y into a column or a diagonal. The adds
    wrap modulo 2^32 by design, so they are tl.add(..., sanitize_overflow=False): Triton's debug
    mode (TRITON_DEBUG=1) would otherwise assert on them as overflows (and the interpreter pays
    for the check even without it). A rotation right by n, (w >> n) | (w << (32 - n)), is written
    out: a helper call per rotation costs the interpreter more than the rotation."""
    a = tl.add(tl.add(a, b, sanitize_overflow=False), x, sanitize_overflow=False)
    d = d ^ a
    d = (d >> 16) | (d << 16)
    c = tl.add(c, d, sanitize_overflow=False)
    b = b ^ c
    b = (b >> 12) | (b << 20)
    a = tl.add(tl.add(a, b, sanitize_overflow=False), y, sanitize_overflow=False)
    d = d ^ a
    d = (d >> 8) | (d << 24)
    c = tl.add(c, d, sanitize_overflow=False)
    b = b ^ c
    b = (b >> 7) | (b << 25)
    return a, b, c, d


@triton.jit
def _compress(h0, h1, h2, h3, h4, h5, h6, h7,
              m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
              counter_lo, counter_hi, block_len, flags):
    """The chaining value after block m compressed into cv h: the first 8 words of BLAKE3's
    compression output (the root's are the digest)."""
    z = tl.zeros_like(h0)
    v0, v1, v2, v3, v4, v5, v6, v7 = h0, h1, h2, h3, h4, h5, h6, h7
    v8, v9, v10, v11 = z + IV[0], z + IV[1], z + IV[2], z + IV[3]
    v12, v13, v14, v15 = z + counter_lo, z + counter_hi, z + block_len, z + flags
    for _ in tl.static_range(7):
        v0, v4, v8, v12 = _g(v0, v4, v8, v12, m0, m1)       # the columns
        v1, v5, v9, v13 = _g(v1, v5, v9, v13, m2, m3)
        v2, v6, v10, v14 = _g(v2, v6, v10, v14, m4, m5)
        v3, v7, v11, v15 = _g(v3, v7, v11, v15, m6, m7)
        v0, v5, v10, v15 = _g(v0, v5, v10, v15, m8, m9)     # the diagonals
        v1, v6, v11, v12 = _g(v1, v6, v11, v12, m10, m11)
        v2, v7, v8, v13 = _g(v2, v7, v8, v13, m12, m13)
        v3, v4, v9, v14 = _g(v3, v4, v9, v14, m14, m15)
        # the message schedule: next round's word i is this round's word PERMUTATION[i]
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = \
            m2, m6, m3, m10, m7, m0, m4, m13, m1, m11, m12, m5, m9, m14, m15, m8
    return v0 ^ v8, v1 ^ v9, v2 ^ v10, v3 ^ v11, v4 ^ v12, v5 ^ v13, v6 ^ v14, v7 ^ v15


# ---------------------------------------------------------------------------------------------
# Moving between lanes: a tile's columns, a subtree's pairs
# ---------------------------------------------------------------------------------------------

@triton.jit
def _halves(x):
    """The even and the odd columns of a [rows, 2k] tile."""
    return tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))


@triton.jit
def _columns(w):
    """The 16 columns of a [lanes, 16] tile, as 16 [lanes] tensors, in order."""
    even, odd = _halves(w)                              # words 0 2 4 .. 14 | 1 3 5 .. 15
    w0m4, w2m4 = _halves(even)                          # 0 4 8 12 | 2 6 10 14
    w1m4, w3m4 = _halves(odd)                           # 1 5 9 13 | 3 7 11 15
    w0_8, w4_12 = _halves(w0m4)
    w2_10, w6_14 = _halves(w2m4)
    w1_9, w5_13 = _halves(w1m4)
    w3_11, w7_15 = _halves(w3m4)
    w0, w8 = tl.split(w0_8)
    w4, w12 = tl.split(w4_12)
    w2, w10 = tl.split(w2_10)
    w6, w14 = tl.split(w6_14)
    w1, w9 = tl.split(w1_9)
    w5, w13 = tl.split(w5_13)
    w3, w11 = tl.split(w3_11)
    w7, w15 = tl.split(w7_15)
    return w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15


@triton.jit
def _pick(cond, p0, p1, p2, p3, p4, p5, p6, p7, h0, h1, h2, h3, h4, h5, h6, h7):
    """cv p where cond holds, cv h elsewhere."""
    return (tl.where(cond, p0, h0), tl.where(cond, p1, h1), tl.where(cond, p2, h2), tl.where(cond, p3, h3),
            tl.where(cond, p4, h4), tl.where(cond, p5, h5), tl.where(cond, p6, h6), tl.where(cond, p7, h7))


@triton.jit
def _merge_lanes(h0, h1, h2, h3, h4, h5, h6, h7, first, count,
                 k0, k1, k2, k3, k4, k5, k6, k7, keyed, BLOCK: tl.constexpr, LEVELS: tl.constexpr):
    """The subtree over a program's lanes, which hold nodes first .. first + BLOCK - 1 of one
    level of the tree (count nodes in all; first is a multiple of BLOCK = 2^LEVELS, so no pair of
    any level straddles two programs). At level j the node at lane i (i a multiple of 2^(j+1))
    merges with the one at lane i + 2^j into their parent, or, without one (the last node of its
    level), goes up unchanged; lane 0 ends with the subtree's root. Levels with no pair in this
    program are skipped (a program of one node does no work here)."""
    lane = tl.arange(0, BLOCK)
    live = count - first                                 # nodes in this program, if below BLOCK
    for j in range(LEVELS):
        step = 1 << j
        if step < live:
            right = tl.minimum(lane + step, BLOCK - 1)   # a lane's partner at this level
            r0, r1, r2, r3 = tl.gather(h0, right, 0), tl.gather(h1, right, 0), tl.gather(h2, right, 0), \
                tl.gather(h3, right, 0)
            r4, r5, r6, r7 = tl.gather(h4, right, 0), tl.gather(h5, right, 0), tl.gather(h6, right, 0), \
                tl.gather(h7, right, 0)
            nodes = (count + step - 1) >> j              # this level's size in the whole tree
            flags = keyed | PARENT | tl.where(nodes == 2, ROOT, 0)
            z = tl.zeros_like(h0)
            p0, p1, p2, p3, p4, p5, p6, p7 = _compress(
                z + k0, z + k1, z + k2, z + k3, z + k4, z + k5, z + k6, z + k7,
                h0, h1, h2, h3, h4, h5, h6, h7, r0, r1, r2, r3, r4, r5, r6, r7, 0, 0, BLOCK_LEN, flags)
            h0, h1, h2, h3, h4, h5, h6, h7 = _pick(first + lane + step < count, p0, p1, p2, p3, p4, p5, p6, p7,
                                                   h0, h1, h2, h3, h4, h5, h6, h7)
    return h0, h1, h2, h3, h4, h5, h6, h7


@triton.jit
def _store_root(out, stride, index, lane, h0, h1, h2, h3, h4, h5, h6, h7):
    """Lane 0's chaining value, as node `index` of the next level. Chaining values are stored
    word-major (word w of node i at w * stride + i): the next launch's lanes load neighbours."""
    first = lane == 0
    tl.store(out + 0 * stride + index + lane, h0, mask=first)
    tl.store(out + 1 * stride + index + lane, h1, mask=first)
    tl.store(out + 2 * stride + index + lane, h2, mask=first)
    tl.store(out + 3 * stride + index + lane, h3, mask=first)
    tl.store(out + 4 * stride + index + lane, h4, mask=first)
    tl.store(out + 5 * stride + index + lane, h5, mask=first)
    tl.store(out + 6 * stride + index + lane, h6, mask=first)
    tl.store(out + 7 * stride + index + lane, h7, mask=first)


# ---------------------------------------------------------------------------------------------
# The launches: leaves (chunks, then their subtree), and merges of chaining values
# ---------------------------------------------------------------------------------------------

@triton.jit
def _as_uint32(k0, k1, k2, k3, k4, k5, k6, k7):
    """The key words, passed as int32 (Triton types a Python int by its value), as uint32."""
    return (k0.to(tl.uint32, bitcast=True), k1.to(tl.uint32, bitcast=True), k2.to(tl.uint32, bitcast=True),
            k3.to(tl.uint32, bitcast=True), k4.to(tl.uint32, bitcast=True), k5.to(tl.uint32, bitcast=True),
            k6.to(tl.uint32, bitcast=True), k7.to(tl.uint32, bitcast=True))


# Lengths and key words vary from call to call: specialising on them (Triton's default for ints
# divisible by 16 or equal to 1) would compile a new kernel for some of them inside a timed window.
_RUNTIME = ["n_bytes", "n_chunks", "n_out", "count", "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "keyed"]


@triton.jit(do_not_specialize=_RUNTIME)
def _leaf_kernel(data, tail, n_bytes, n_chunks, out, n_out, k0, k1, k2, k3, k4, k5, k6, k7, keyed,
                 BLOCK: tl.constexpr, LEVELS: tl.constexpr):
    """A program's BLOCK chunks, one a lane, then their subtree's root cv. Whole chunks are read
    from data, a short last chunk from tail (its zero-padded copy): every load is whole rows."""
    pid = tl.program_id(0)
    chunk = pid * BLOCK + tl.arange(0, BLOCK)
    start = chunk.to(tl.int64) * CHUNK_LEN
    length = tl.minimum(tl.maximum(n_bytes - start, 0), CHUNK_LEN).to(tl.int32)   # 0 past the end
    last_block = tl.maximum(length - 1, 0) // BLOCK_LEN                 # an empty chunk has one block
    row = tl.where(length == CHUNK_LEN, data + start, tail)             # where a lane's chunk is
    live = chunk < n_chunks
    counter_lo = (chunk.to(tl.int64) & 0xFFFFFFFF).to(tl.uint32)        # the chunk's index is its counter
    counter_hi = (chunk.to(tl.int64) >> 32).to(tl.uint32)
    k0, k1, k2, k3, k4, k5, k6, k7 = _as_uint32(k0, k1, k2, k3, k4, k5, k6, k7)
    z = tl.zeros([BLOCK], tl.uint32)
    h0, h1, h2, h3, h4, h5, h6, h7 = z + k0, z + k1, z + k2, z + k3, z + k4, z + k5, z + k6, z + k7
    chunk_root = tl.where(n_chunks == 1, ROOT, 0)                      # a single chunk is the root
    # the blocks of the program's longest chunk (16 unless its only chunk is a short last one)
    blocks = tl.minimum(tl.maximum(n_bytes - pid.to(tl.int64) * BLOCK * CHUNK_LEN + BLOCK_LEN - 1, BLOCK_LEN)
                        // BLOCK_LEN, CHUNK_LEN // BLOCK_LEN).to(tl.int32)
    col = tl.arange(0, BLOCK_LEN)
    for b in range(blocks):
        at = b * BLOCK_LEN + col
        raw = tl.load(row[:, None] + at[None, :], mask=live[:, None], other=0)
        # little-endian words, byte i of a word its bits 8i..8i+7 (compiled: the loaded registers)
        shift = 8 * tl.arange(0, 4)
        words = tl.sum(tl.reshape(raw.to(tl.uint32), [BLOCK, BLOCK_LEN // 4, 4]) << shift[None, None, :], axis=2)
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _columns(words)
        block_len = tl.minimum(tl.maximum(length - b * BLOCK_LEN, 0), BLOCK_LEN)
        flags = keyed | tl.where(b == 0, CHUNK_START, 0) | tl.where(b == last_block, CHUNK_END | chunk_root, 0)
        p0, p1, p2, p3, p4, p5, p6, p7 = _compress(h0, h1, h2, h3, h4, h5, h6, h7,
                                                   m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                                                   counter_lo, counter_hi, block_len, flags)
        h0, h1, h2, h3, h4, h5, h6, h7 = _pick(b <= last_block, p0, p1, p2, p3, p4, p5, p6, p7,   # a short chunk's
                                               h0, h1, h2, h3, h4, h5, h6, h7)                   # lane idles
    h0, h1, h2, h3, h4, h5, h6, h7 = _merge_lanes(h0, h1, h2, h3, h4, h5, h6, h7, pid * BLOCK, n_chunks,
                                                  k0, k1, k2, k3, k4, k5, k6, k7, keyed, BLOCK, LEVELS)
    _store_root(out, n_out, pid, tl.arange(0, BLOCK), h0, h1, h2, h3, h4, h5, h6, h7)


@triton.jit(do_not_specialize=_RUNTIME)
def _merge_kernel(cvs, count, out, n_out, k0, k1, k2, k3, k4, k5, k6, k7, keyed,
                  BLOCK: tl.constexpr, LEVELS: tl.constexpr):
    """BLOCK nodes of a level (count in all) a program, merged into their subtree's root cv."""
    pid = tl.program_id(0)
    node = pid * BLOCK + tl.arange(0, BLOCK)
    alive = node < count
    h0 = tl.load(cvs + 0 * count + node, mask=alive, other=0)
    h1 = tl.load(cvs + 1 * count + node, mask=alive, other=0)
    h2 = tl.load(cvs + 2 * count + node, mask=alive, other=0)
    h3 = tl.load(cvs + 3 * count + node, mask=alive, other=0)
    h4 = tl.load(cvs + 4 * count + node, mask=alive, other=0)
    h5 = tl.load(cvs + 5 * count + node, mask=alive, other=0)
    h6 = tl.load(cvs + 6 * count + node, mask=alive, other=0)
    h7 = tl.load(cvs + 7 * count + node, mask=alive, other=0)
    k0, k1, k2, k3, k4, k5, k6, k7 = _as_uint32(k0, k1, k2, k3, k4, k5, k6, k7)
    h0, h1, h2, h3, h4, h5, h6, h7 = _merge_lanes(h0, h1, h2, h3, h4, h5, h6, h7, pid * BLOCK, count,
                                                  k0, k1, k2, k3, k4, k5, k6, k7, keyed, BLOCK, LEVELS)
    _store_root(out, n_out, pid, tl.arange(0, BLOCK), h0, h1, h2, h3, h4, h5, h6, h7)


# ---------------------------------------------------------------------------------------------
# The caller's side
# ---------------------------------------------------------------------------------------------

def _check(raw, key):
    problem = (f"got {type(raw).__name__}" if not isinstance(raw, torch.Tensor) else
               f"got {raw.dtype}" if raw.dtype != torch.uint8 else
               f"got shape {tuple(raw.shape)}" if raw.dim() != 1 else
               "got a strided view" if not raw.is_contiguous() else None)
    if problem:
        raise ValueError(f"blake3 hashes a flat contiguous uint8 tensor, {problem}: "
                         "pass t.contiguous().reshape(-1).view(torch.uint8)")
    if key is not None and (not isinstance(key, (bytes, bytearray)) or len(key) != 32):
        got = len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__
        raise ValueError(f"a BLAKE3 key is 32 bytes, got {got}")
    if raw.device.type == "cpu" and not isinstance(_leaf_kernel, InterpretedFunction):
        raise ValueError("blake3 of a CPU tensor runs in Triton's interpreter: set TRITON_INTERPRET=1 before triton is "
                         "imported, or hash raw.numpy() with the blake3 package")


def _launch_tree(raw, key, leaf_block, merge_block):
    """The root cv (8 uint32 words on raw's device) of raw's BLAKE3 tree: one leaf launch, then
    merge launches until one node is left. No synchronisation: the launches are queued."""
    words = [int.from_bytes(key[i:i + 4], "little") for i in range(0, 32, 4)] if key is not None else list(IV.value)
    k = [w - (1 << 32) if w >= 1 << 31 else w for w in words]   # passed as int32, bit-cast back in the kernels
    keyed = KEYED_HASH.value if key is not None else 0
    n_bytes = raw.numel()
    count = max(1, triton.cdiv(n_bytes, CHUNK_LEN.value))
    whole = n_bytes // CHUNK_LEN.value * CHUNK_LEN.value
    tail = raw                                      # no short chunk: never read
    if whole < n_bytes or n_bytes == 0:             # the short last chunk, zero-padded to 1024 bytes
        tail = torch.nn.functional.pad(raw[whole:], (0, CHUNK_LEN.value - (n_bytes - whole)))
    programs = triton.cdiv(count, leaf_block)
    cvs = torch.empty(8 * programs, dtype=torch.uint32, device=raw.device)
    _leaf_kernel[(programs,)](raw if whole else tail, tail, n_bytes, count, cvs, programs, *k, keyed,
                              BLOCK=leaf_block, LEVELS=leaf_block.bit_length() - 1, num_warps=max(1, leaf_block // 32))
    count = programs
    while count > 1:
        programs = triton.cdiv(count, merge_block)
        parents = torch.empty(8 * programs, dtype=torch.uint32, device=raw.device)
        _merge_kernel[(programs,)](cvs, count, parents, programs, *k, keyed,
                                   BLOCK=merge_block, LEVELS=merge_block.bit_length() - 1, num_warps=4)
        cvs, count = parents, programs
    return cvs


def blake3_device(raw, key=None):
    """BLAKE3 of a flat contiguous uint8 tensor (keyed with a 32-byte key, or plain), as 32 uint8
    on raw's device, queued on its current stream and not waited for: a commitment that costs no
    copy to the host until it is read."""
    _check(raw, key)
    # Triton launches on the current GPU, which need not be raw's
    with torch.cuda.device(raw.device) if raw.is_cuda else contextlib.nullcontext():
        return _launch_tree(raw, key, LEAF_BLOCK, MERGE_BLOCK).view(torch.uint8)


def blake3_digest(raw, key=None):
    """BLAKE3 of a flat contiguous uint8 tensor computed on its device (a CPU tensor in Triton's
    interpreter): the 32 bytes that blake3.blake3(bytes, key=key).digest() returns."""
    return bytes(blake3_device(raw, key).cpu().numpy())
