"""The Python side of the engine protocol against the engine's schema.

Golden frames (internal/engine/testdata/frames) are written by the Go
encoder and checked by the Go tests; here Python must produce the same
request bytes and read the same replies, so the two sides cannot drift.
"""
import inspect
import json
import socket

import numpy as np
import pytest

from ffkit import _engine, _protocol, errors
from conftest import REPO

FRAMES = REPO / "internal" / "engine" / "testdata" / "frames"


def _i64(*v):
    return np.asarray(v, dtype="<i8").tobytes()


# The same requests as goldenRequests in internal/engine/schema_test.go.
GOLDEN = {
    "hello": (_protocol.HelloRequest(), [], None),
    "ffr_open": (_protocol.FfrOpenRequest(paths=["/data/a.ffr", "/data/dir"], check_data=True), [], None),
    "ffr_read": (_protocol.FfrReadRequest(handle=7), [_i64(3, 0, 2)], None),
    "ffw_write": (_protocol.FfwWriteRequest(handle=2, count=2), [_i64(3, 2), b"abcde"], None),
    "ffw_write_streamed": (_protocol.FfwWriteRequest(handle=2, count=1), [_i64(10), b"0123456789"], 4),
    "loader_reclaim": (_protocol.LoaderReclaimRequest(handle=3, keep=[1, 4], stream=2), [], None),
    "scan": (_protocol.ScanRequest(inputs=["/pq"], group_by=["lang"], aggs="count(*), mean(score)"), [], None),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_python_encodes_golden_request_frames(name):
    header, parts, chunk = GOLDEN[name]
    want = (FRAMES / f"{name}.req").read_bytes()
    assert _engine.encode_request(header, parts, max_chunk=chunk) == want


def test_python_sends_what_it_encodes():
    # send_request (zero-copy pieces, streamed when long) puts the same bytes
    # on the wire as encode_request.
    a, b = socket.socketpair()
    with a, b:
        header, parts, _ = GOLDEN["ffw_write"]
        _engine.send_request(a, header, [memoryview(p) for p in parts])
        a.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := b.recv(65536):
            got += chunk
    assert got == (FRAMES / "ffw_write.req").read_bytes()


def _reply(name):
    a, b = socket.socketpair()
    a.sendall((FRAMES / name).read_bytes())
    a.close()
    return b


def test_python_reads_golden_batch_reply():
    b = _reply("loader_batch.rep")
    with b:
        rep = _engine.Pipe(b).recv()
    assert rep.header is _engine.BATCH
    meta = dict(zip(_protocol.BATCH_FIELDS, rep.body[: _protocol.BATCH_META].tolist()))
    assert meta == {"slot": 1, "lend": 5, "n": 2, "epoch": 0, "step": 3, "padded": 0, "state_epoch": 0,
                    "state_cursor": 8, "state_step": 4, "grid": 16}
    n = meta["n"]
    assert rep.body[_protocol.BATCH_META : _protocol.BATCH_META + n].tolist() == [7, 9]
    assert rep.body[_protocol.BATCH_META + n :].reshape(n, 2).tolist() == [[0, 16], [16, 32]]


def test_python_reads_golden_error_reply():
    b = _reply("error_bad_request.rep")
    with b, pytest.raises(errors.BadRequestError, match='unknown field "x"') as ei:
        _engine.recv_reply(b)
    assert ei.value.code == "bad_request" and ei.value.kind == "usage"


def test_every_error_code_has_its_exception():
    for code, (kind, _doc) in _protocol.ERROR_CODES.items():
        e = errors.from_reply({"error": "m", "kind": kind, "code": code})
        if code == "canceled":
            assert isinstance(e, KeyboardInterrupt)
            continue
        assert e.code == code
        assert type(e) is not errors.FFKitError and type(e).code == code or code == "short_read", code
        assert e.kind == kind


def test_request_classes_refuse_misspelt_fields():
    with pytest.raises(TypeError):
        _protocol.FfrOpenRequest(paths=["x"], chek_data=True)
    params = inspect.signature(_protocol.ScanRequest).parameters
    assert list(params) == list(_protocol.ScanRequest.FIELDS)


def test_engine_refuses_unknown_fields_naming_them(gen):
    path, n = gen
    hdr = dict(_protocol.FfrOpenRequest(paths=[path]), check_dta=True)
    with pytest.raises(errors.BadRequestError, match='unknown field "check_dta"'):
        _engine.get().call(hdr)
    # The connection stays usable.
    assert _engine.get().call(_protocol.FfrOpenRequest(paths=[path])).header["n"] == n


def test_protocol_module_is_generated():
    src = (REPO / "python" / "ffkit" / "_protocol.py").read_text()
    assert "GENERATED from internal/engine/schema.go" in src
    json.dumps(_protocol.LoaderOpenRequest(paths=["a"]))  # plain JSON
