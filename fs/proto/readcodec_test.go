package proto

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func sampleReq() BatchReadReq {
	return BatchReadReq{Host: "4f1c/mnt:[4026531841]", IOs: []ReadIO{
		{Chain: 1, ChainVer: 7, Target: 101, Chunk: ChunkID{Inode: 1 << 40, Index: 3}, Off: 4096, Len: 1 << 20, Sums: true, Local: true},
		{Chain: 1<<32 - 1, ChainVer: 1<<64 - 1, Target: 1<<32 - 1, Chunk: ChunkID{Inode: 1<<64 - 1, Index: 0}, Off: MaxChunkSize, Len: 0},
		{Chain: 2, ChainVer: 1, Target: 202, Chunk: ChunkID{Inode: 9, Index: 9}, Off: 0, Len: 4096, Sums: true},
	}}
}

func sampleResp() BatchReadResp {
	return BatchReadResp{Results: []ReadResult{
		{N: 1 << 20, Sums: 1024, Path: "/data/t101/chunks/x.3", FileOff: 68<<10 + 4096, Cold: true},
		{Code: "not_committed", Msg: "chunk 1-3 v4 pending on target 101"},
		{N: 4096},
		{N: 100, Sums: 4},
	}}
}

// The binary headers of batched reads decode to what was encoded, and
// empty batches too.
func TestReadCodecRoundTrip(t *testing.T) {
	for _, req := range []BatchReadReq{sampleReq(), {IOs: []ReadIO{}}} {
		roundTrip(t, req, req.AppendHeader(nil))
	}
	for _, resp := range []BatchReadResp{sampleResp(), {Results: []ReadResult{}}} {
		roundTrip(t, resp, resp.AppendHeader(nil))
	}
}

// roundTrip checks that header h decodes (as a T) to want.
func roundTrip[T any, P interface {
	*T
	DecodeHeader([]byte) error
}](t *testing.T, want T, h []byte) {
	t.Helper()
	var got T
	if err := P(&got).DecodeHeader(h); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// The JSON headers of clients and services from before the binary form
// still decode.
func TestReadCodecAcceptsJSON(t *testing.T) {
	req, resp := sampleReq(), sampleResp()
	jreq, _ := json.Marshal(req)
	jresp, _ := json.Marshal(resp)
	roundTrip(t, req, jreq)
	roundTrip(t, resp, jresp)
}

// Every truncation of a header, a header with bytes left over, broken
// JSON, and a count larger than the header can hold are refused, naming
// the offset: requests with ErrBadRequest, replies with ErrIO (retried);
// never a panic or a huge allocation.
func TestReadCodecRejectsBadHeaders(t *testing.T) {
	req, resp := sampleReq().AppendHeader(nil), sampleResp().AppendHeader(nil)
	refused[BatchReadReq](t, ErrBadRequest, req, nil, []byte(`{"ios":[}`), append(req[:len(req):len(req)], 0),
		[]byte{'R', 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	refused[BatchReadResp](t, ErrIO, resp, nil, req, []byte(`{"results":7}`), append(resp[:len(resp):len(resp)], 1))
}

// refused checks that every header in bad, and every truncation of good,
// fails to decode as a T with an error of kind.
func refused[T any, P interface {
	*T
	DecodeHeader([]byte) error
}](t *testing.T, kind error, good []byte, bad ...[]byte) {
	t.Helper()
	for i := range good {
		bad = append(bad, good[:i])
	}
	for _, h := range bad {
		var r T
		if err := P(&r).DecodeHeader(h); !errors.Is(err, kind) {
			t.Fatalf("%T header %x: err %v, want %v", r, h, err, kind)
		}
	}
}

// Arbitrary bytes never make a decoder panic.
func FuzzReadCodec(f *testing.F) {
	f.Add(sampleReq().AppendHeader(nil))
	f.Add(sampleResp().AppendHeader(nil))
	f.Fuzz(func(t *testing.T, h []byte) {
		var r BatchReadReq
		if r.DecodeHeader(h) == nil {
			// What decodes re-encodes to a header that decodes the same.
			enc := r.AppendHeader(nil)
			var again BatchReadReq
			if err := again.DecodeHeader(enc); err != nil || string(again.AppendHeader(nil)) != string(enc) {
				t.Fatalf("re-encoding %x does not decode to the same request", h)
			}
		}
		var p BatchReadResp
		p.DecodeHeader(h)
	})
}
