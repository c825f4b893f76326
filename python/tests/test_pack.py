"""ffkit.pack and the WebDataset container, against the webdataset package."""
import io
import json
import os

import numpy as np
import pytest

import ffkit
from ffkit.ffrecord import FileReader

wds = pytest.importorskip("webdataset")


def _write_shards(d, n_shards=3, per_shard=17):
    """WebDataset shards written by webdataset's own TarWriter: a jpg-like
    blob, a json and (for odd keys) a class label per sample."""
    rng = np.random.default_rng(7)
    os.makedirs(d, exist_ok=True)
    k = 0
    for s in range(n_shards):
        with wds.TarWriter(os.path.join(d, f"shard-{s:04d}.tar")) as w:
            for _ in range(per_shard):
                sample = {
                    "__key__": f"{k:06d}",
                    "jpg": rng.integers(0, 256, int(rng.integers(1, 50_000)), dtype=np.uint8).tobytes(),
                    "json": json.dumps({"k": k, "caption": "x" * (k % 13)}).encode(),
                }
                if k % 2:
                    sample["cls"] = str(k % 5).encode()
                w.write(sample)
                k += 1
    return k


def _read_all(path):
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".ffr"))
    out = []
    for f in files:
        r = FileReader(f)
        out.extend(r.read(list(range(r.n))))
        r.close()
    return out


def test_webdataset_shards_pack_into_the_same_dicts(tmp_path):
    shards = tmp_path / "shards"
    n = _write_shards(str(shards))
    urls = sorted(str(p) for p in shards.iterdir())
    theirs = list(wds.WebDataset(urls, shardshuffle=False))
    assert len(theirs) == n
    seen = []
    res = ffkit.pack(shards, tmp_path / "ds", format="webdataset", shard_size="256K",
                     progress=lambda s, b: seen.append((s, b)))
    assert res["samples"] == len(theirs) and res["format"] == "webdataset"
    assert seen and seen[-1][0] == n
    ours = _read_all(tmp_path / "ds")
    assert len(ours) == len(theirs)
    for raw, want in zip(ours, theirs):
        got = ffkit.decode_webdataset(raw)
        fields = {k: v for k, v in want.items() if not k.startswith("__")}
        assert set(got) == set(fields)
        for ext, v in fields.items():
            assert bytes(got[ext]) == v
    # the Loader hands back the same dicts, as views of the batch's memory
    loader = ffkit.Loader(str(tmp_path / "ds"), batch_size=8, shuffle=False, decode="webdataset")
    got = []
    for batch in loader:
        for i, fields in enumerate(batch):
            assert np.shares_memory(np.frombuffer(fields["jpg"], dtype=np.uint8), batch.data)
            got.append({k: bytes(v) for k, v in fields.items()})
            assert set(batch[i]) == set(fields)
        batch.release()
    loader.close()
    assert got == [{k: v for k, v in w.items() if not k.startswith("__")} for w in theirs]
    with pytest.raises(ffkit.errors.UsageError):
        ffkit.Loader(str(tmp_path / "ds"), batch_size=8, decode="jpeg")
    # the index names each sample by its key
    index = [json.loads(l) for l in (tmp_path / "ds" / "index.jsonl").read_text().splitlines()]
    assert [e["source"] for e in index] == [w["__key__"] for w in theirs]


def test_decode_is_zero_copy_and_refuses_garbage():
    hdr = b"FFWD" + (1).to_bytes(4, "little") + (1).to_bytes(4, "little") + (3).to_bytes(2, "little") + b"jpg" + (4).to_bytes(8, "little")
    buf = bytearray(hdr + b"abcd")
    got = ffkit.decode_webdataset(buf)
    buf[-1] = ord("z")
    assert bytes(got["jpg"]) == b"abcz"  # a view, not a copy
    for bad in (b"", b"nope" * 4, bytes(hdr), bytes(hdr) + b"abcde"):
        with pytest.raises(ffkit.DataError):
            ffkit.decode_webdataset(bad)


def test_pack_errors_carry_the_cli_message(tmp_path):
    with pytest.raises(ffkit.errors.UsageError, match="--shard-size"):
        ffkit.pack(tmp_path, tmp_path / "o", shard_size=0)
    p = tmp_path / "mystery"
    p.write_bytes(b"\x89PNG\r\n\x1a\nxxxx")
    with pytest.raises(ffkit.errors.UsageError, match="89 50 4e 47"):
        ffkit.pack(p, tmp_path / "o2")


def test_filewriter_sample_larger_than_staging(tmp_path):
    """FileWriter.write_one of a 40 MiB sample hung forever in the local
    writer (one write reserved more than it may stage); it now streams."""
    from ffkit.ffrecord import FileWriter

    big = np.random.default_rng(3).integers(0, 256, 40 << 20, dtype=np.uint8).tobytes()
    p = tmp_path / "big.ffr"
    with FileWriter(p, 3) as w:
        w.write_one(b"a")
        w.write_one(big)
        w.write_one(b"")
    r = FileReader(p)
    got = r.read([0, 1, 2])
    r.close()
    assert bytes(got[0]) == b"a" and bytes(got[1]) == big and bytes(got[2]) == b""


@pytest.mark.parametrize("data_page_version", ["1.0", "2.0"])
def test_pyarrow_default_parquet_packs_value_for_value(tmp_path, data_page_version):
    """A binary column as pyarrow writes it by default (snappy, dictionary
    page, falling back to PLAIN pages once the dictionary is full; several
    pages per row group) packs to exactly its values, empty and
    compressible ones included, in row order, with a sidecar index."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(17)
    vals = []
    for i in range(300):
        n = int(rng.integers(4_000, 30_000))
        v = bytearray(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        if i % 3 == 0:  # a compressible header: snappy copies inside the value
            v[: 2048] = bytes(v[:16]) * 128
        vals.append(b"" if i % 50 == 7 else bytes(v))
    p = tmp_path / "t.parquet"
    t = pa.table({"id": pa.array(range(len(vals))), "image": pa.array(vals, type=pa.binary())})
    pq.write_table(t, p, row_group_size=120, data_page_size=64 << 10,
                   dictionary_pagesize_limit=256 << 10, write_batch_size=16,
                   data_page_version=data_page_version)
    meta = pq.ParquetFile(p).metadata
    assert meta.row_group(0).column(1).compression == "SNAPPY"
    res = ffkit.pack(p, tmp_path / "ds", column="image", shard_size="1M")
    assert res["samples"] == len(vals) and res["format"] == "parquet"
    ours = _read_all(tmp_path / "ds")
    assert [bytes(o) for o in ours] == vals
    with open(tmp_path / "ds" / "index.jsonl") as f:
        idx = [json.loads(line) for line in f]
    assert [e["source"] for e in idx] == [f"t.parquet:{i}" for i in range(len(vals))]
    assert [e["size"] for e in idx] == [len(v) for v in vals]
