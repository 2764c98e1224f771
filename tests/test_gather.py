"""The native gather (packdata._rowhash.gather): rows copied from views of a mapped file, and
checked against their checksums as they are copied, as the default read does."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import xxhash

from packdata import checksum
from packdata.containers.lmdbmap import byte_rows
from tests.conftest import needs_native_rows


@pytest.fixture(autouse=True)
def native():
    needs_native_rows()


def a_file(records: int = 500, image: int = 3072, seed: int = 0):
    """A file's bytes holding ``records`` records of an image and a label each, laid out as a
    container does (records one after another), the two fields as overlapping strided views
    (LMDB's columns), and each record's XXH3-64."""
    rng = np.random.default_rng(seed)
    whole = rng.integers(0, 256, records * (image + 8) + 100, dtype=np.uint8)
    whole.flags.writeable = False
    starts = 100 + np.arange(records, dtype=np.int64) * (image + 8)
    sums = np.array([xxhash.xxh3_64_intdigest(whole[s : s + image + 8].tobytes())
                     for s in starts.tolist()], dtype=np.uint64)
    return whole, starts, [byte_rows(whole, 0, image), byte_rows(whole, image, image + 8)], sums


def gathered(columns, rows, check=None):
    outs = [np.empty((len(rows), c.shape[1]), np.uint8) for c in columns]
    result = checksum._rowhash.gather(columns, [rows] * len(columns), outs, *(check or ()))
    return outs, result


@pytest.mark.parametrize("n", [0, 1, 256])
def test_gather_copies_the_rows_numpy_would(n):
    whole, starts, columns, _ = a_file()
    rows = np.random.default_rng(n).choice(starts, n)  # repeats included
    outs, result = gathered(columns, rows)
    assert result == (-1, 0)
    for out, column in zip(outs, columns):
        assert np.array_equal(out, column[rows])
    # typed outputs, and a column of contiguous rows (HDF5's)
    table = whole[100 : 100 + 500 * 3080].reshape(500, 3080)
    labels = np.empty(n, dtype="<i8")
    checksum.gather([table[:, 3072:]], [rows // 3080], [labels])
    assert labels.tolist() == table[rows // 3080, 3072:].copy().view("<i8").ravel().tolist()


@pytest.mark.parametrize("prefetch_bytes", [0, 1, 3080 * 3, 1 << 40])
def test_rows_asked_for_ahead_change_nothing_read(prefetch_bytes):
    """Prefetching is a hint: the rows up to the last (the file's last record included, which a
    read ahead of it would run past) come out as numpy's, checked or not."""
    _, starts, columns, sums = a_file()
    records = np.array([3, 499, 0, 250, 499, 498], dtype=np.int64)
    for check in (None, (records, sums[records], np.zeros(63, np.uint8))):
        outs = [np.empty((len(records), c.shape[1]), np.uint8) for c in columns]
        result = checksum._rowhash.gather(columns, [starts[records]] * 2, outs,
                                          *(check or (None, None, None)),
                                          prefetch_bytes=prefetch_bytes)
        assert result == (-1, 0 if check is None else 5)
        for out, column in zip(outs, columns):
            assert np.array_equal(out, column[starts[records]])


def test_checked_gather_hashes_marks_and_names_the_first_damaged_record():
    _, starts, columns, sums = a_file()
    records = np.array([5, 9, 2, 9, 400], dtype=np.int64)
    bits = np.zeros(500 // 8 + 1, np.uint8)
    outs, result = gathered(columns, starts[records], (records, sums[records], bits))
    assert result == (-1, 4)  # record 9 twice: one bit set
    assert np.flatnonzero(np.unpackbits(bits, bitorder="little")).tolist() == [2, 5, 9, 400]
    assert np.array_equal(outs[0], columns[0][starts[records]])
    assert gathered(columns, starts[records], (records, sums[records], bits))[1] == (-1, 0)
    # a marked record is not hashed again; an unmarked one whose checksum differs is named
    damaged = sums.copy()
    damaged[[9, 7]] ^= 1
    more = np.array([9, 8, 7, 6], dtype=np.int64)
    assert gathered(columns, starts[more], (more, damaged[more], bits))[1] == (2, 1)
    assert np.flatnonzero(np.unpackbits(bits, bitorder="little")).tolist() == [2, 5, 8, 9, 400]


def test_checked_gather_marks_the_bits_it_is_given():
    """A bit per entry (a point cloud's variants checked apart): each row's checksum is the one
    given at its position, its bit the one given, whatever the record's number."""
    _, starts, columns, sums = a_file(records=20)
    records = np.array([3, 17, 8], dtype=np.int64)
    entries = np.array([2, 0, 3], dtype=np.int64)
    bits = np.zeros(10, np.uint8)  # 20 records x 4 entries
    assert gathered(columns, starts[records], (records * 4 + entries, sums[records], bits))[1] \
        == (-1, 3)
    assert np.flatnonzero(np.unpackbits(bits, bitorder="little")).tolist() == [14, 35, 68]
    others = records * 4 + 1  # another entry of the same records: not marked, so hashed again
    wrong = sums[records[::-1]].copy()
    assert gathered(columns, starts[records], (others, wrong, bits))[1] == (0, 0)


def test_checked_gather_hashes_one_column_and_small_records_alike():
    whole, starts, columns, _ = a_file(records=50, image=40)
    records = np.arange(50, dtype=np.int64)
    sums = np.array([xxhash.xxh3_64_intdigest(whole[s : s + 40].tobytes())
                     for s in starts.tolist()], dtype=np.uint64)
    bits = np.zeros(7, np.uint8)
    assert gathered(columns[:1], starts, (records, sums, bits))[1] == (-1, 50)
    both = np.array([xxhash.xxh3_64_intdigest(whole[s : s + 48].tobytes())
                     for s in starts.tolist()], dtype=np.uint64)
    for stream_above in (0, 1 << 20):  # the two fields streamed, or copied side by side
        bits[:] = 0
        outs = [np.empty((50, 40), np.uint8), np.empty((50, 8), np.uint8)]
        assert checksum._rowhash.gather(columns, [starts, starts], outs, records, both, bits,
                                        stream_above=stream_above) == (-1, 50)


def test_threads_checking_at_once_count_each_record_once():
    """The bitmap is shared by loader threads: each record's bit is set by one of them, and the
    counts they return add up to the records checked."""
    _, starts, columns, sums = a_file(records=2000, image=256)
    bits = np.zeros(2000 // 8, np.uint8)
    counts: list[int] = []
    order = np.random.default_rng(0).permutation(2000).astype(np.int64)

    def check(records):
        for a in range(0, 2000, 64):
            part = np.ascontiguousarray(records[a : a + 64])
            counts.append(gathered(columns, starts[part], (part, sums[part], bits))[1][1])

    threads = [threading.Thread(target=check, args=(o,)) for o in (order, order[::-1], order)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 2000 and (bits == 255).all()


@pytest.mark.parametrize("call, error, message", [
    (lambda c, r, o: ([c[0]], [r[:1] * 0 - 1], [o[0][:1]]), IndexError, "row -1 is outside co"),
    (lambda c, r, o: (c, [r, r + len(c[1])], o), IndexError, "outside column 1's"),
    (lambda c, r, o: (c, [r, r], [o[0], o[0]]), ValueError, "out 1 holds 6144 bytes, expected 2"),
    (lambda c, r, o: (c, [r], o), ValueError, "2 columns, 1 row arrays, 2 outs"),
    (lambda c, r, o: (c, [r, r[:1]], o), ValueError, "rows must hold 2 int64 values"),
    (lambda c, r, o: (c, [r, r.astype(np.int32)], o), ValueError, "rows must hold"),
    (lambda c, r, o: (c, [r, r], [o[0], np.empty((2, 16), np.uint8)[:, ::2]]), ValueError,
     "out 1 must be a writable, C-contiguous array"),
    (lambda c, r, o: ([], [], []), ValueError, "0 columns"),
])
def test_gather_refuses_rows_and_outputs_it_cannot_use(call, error, message):
    _, starts, columns, _ = a_file(records=3)
    outs = [np.empty((2, 3072), np.uint8), np.empty((2, 8), np.uint8)]
    with pytest.raises(error, match=message):
        checksum._rowhash.gather(*call(columns, starts[:2], outs))


@pytest.mark.parametrize("check, error, message", [
    (lambda r, s, b: (r + 8, s[:1], b), IndexError, "record 8 is outside verified's 8 bits"),
    (lambda r, s, b: (r, s[:1], b[:0]), IndexError, "record 0 is outside verified's 0 bits"),
    (lambda r, s, b: (r, s, b), ValueError, "expected holds 3 values, expected 1"),
    (lambda r, s, b: (r, s[:1].astype(np.int32), b), TypeError, "expected must hold 8-byte"),
    (lambda r, s, b: (r, s[:1], bytes(b)), ValueError, "verified must be a writable, contig"),
    (lambda r, s, b: (r, s), TypeError, "records needs expected and verified"),
])
def test_checked_gather_refuses_what_it_cannot_check(check, error, message):
    _, starts, columns, sums = a_file(records=3)
    outs = [np.empty((1, 3072), np.uint8), np.empty((1, 8), np.uint8)]
    args = check(np.array([0], dtype=np.int64), sums, np.zeros(1, np.uint8))
    with pytest.raises(error, match=message):
        checksum._rowhash.gather(columns, [starts[:1]] * 2, outs, *args)


@pytest.mark.parametrize("block_bytes", [1, 3080 * 7, 1 << 20])
def test_a_damaged_record_in_a_later_block_is_named_and_those_before_it_marked(block_bytes):
    """Records are copied a block at a time, then hashed: whatever the block, the first damaged
    record is the one named, and only the records before it are marked."""
    _, starts, columns, sums = a_file(records=400)
    damaged = sums.copy()
    damaged[[250, 260]] ^= 1
    records = np.arange(400, dtype=np.int64)[::-1].copy()  # record 260 is read before 250
    bits = np.zeros(50, np.uint8)
    outs = [np.empty((400, 3072), np.uint8), np.empty((400, 8), np.uint8)]
    first, marked = checksum._rowhash.gather(columns, [starts[records]] * 2, outs, records,
                                             damaged[records], bits, block_bytes=block_bytes)
    assert (first, marked) == (139, 139) and records[first] == 260
    assert np.flatnonzero(np.unpackbits(bits, bitorder="little")).tolist() == list(range(261, 400))
    assert np.array_equal(outs[0][:140], columns[0][starts[records[:140]]])
