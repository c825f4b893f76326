package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/ffrecord"
)

var update = flag.Bool("update", false, "rewrite testdata/frames from the Go encoder")

// The Python module generated from the schema is checked in; it must be
// what the schema renders today.
func TestPythonSchemaUpToDate(t *testing.T) {
	want, err := PythonSchema()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "python", "ffkit", "_protocol.py")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run `go run ./cmd/ffkit engine --schema python/ffkit/_protocol.py`", path)
	}
}

// Every operation and error code is in the schema exactly once, and every
// code the server can send is listed.
func TestSchemaIsComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, op := range Schema {
		if seen[op.Name] {
			t.Errorf("operation %s twice", op.Name)
		}
		seen[op.Name] = true
		if op.run == nil && op.Name != "connect" && op.Name != "loader_stream" {
			t.Errorf("operation %s has no function", op.Name)
		}
		if _, err := jsonFields(op.Request); err != nil {
			t.Errorf("%s: %v", op.Name, err)
		}
		if f, _ := jsonFields(op.Request); len(f) == 0 || f[0].name != "op" {
			t.Errorf("%s: request does not start with op", op.Name)
		}
	}
	codes := map[string]bool{}
	for _, c := range ErrorCodes {
		if codes[c.Code] {
			t.Errorf("code %s twice", c.Code)
		}
		codes[c.Code] = true
	}
	for _, c := range codes2() {
		if !codes[c] {
			t.Errorf("the server sends code %q, not in ErrorCodes", c)
		}
	}
	if len(BatchFields) != batchMeta {
		t.Errorf("BatchFields has %d names, batch bodies open with %d int64s", len(BatchFields), batchMeta)
	}
}

func codes2() []string {
	out := []string{"canceled", "not_found", "permission", "no_space"}
	for _, c := range codes {
		out = append(out, c.code)
	}
	return out
}

// A field an operation does not define is refused, naming the field; so is
// a misspelt one (before, it silently became the default).
func TestUnknownRequestFieldRefused(t *testing.T) {
	path := writeDataset(t, [][]byte{[]byte("a")})
	server, client := socketPair(t)
	defer client.Close()
	go NewServer().Serve(context.Background(), server)
	for _, hdr := range []map[string]any{
		{"op": "ffr_open", "paths": []string{path}, "chek_data": true},
		{"op": "hello", "verbose": true},
		{"op": "scan", "inputs": []string{path}, "group": "x"},
		{"op": "ffw_create", "path": path + ".new", "n": 1, "handle": 3},
		// Each loader operation has its own request type: epoch belongs
		// to loader_set_epoch only.
		{"op": "loader_stats", "handle": 1, "epoch": 3},
	} {
		h, _, _ := call(t, client, hdr, nil)
		var bad string
		known := map[string]bool{}
		for _, n := range fieldNames(hdr["op"].(string)) {
			known[n] = true
		}
		for k := range hdr {
			if !known[k] {
				bad = k
			}
		}
		if h["code"] != "bad_request" || !strings.Contains(h["error"].(string), `unknown field "`+bad+`"`) {
			t.Errorf("%v: got %v", hdr, h)
		}
	}
	// The right fields still work on the same connection.
	h, _, _ := call(t, client, map[string]any{"op": "ffr_open", "paths": []string{path}, "check_data": true}, nil)
	if h["ok"] != true || h["n"] != float64(1) {
		t.Errorf("open: %v", h)
	}
}

func fieldNames(op string) []string {
	f, _ := jsonFields(opsByName[op].Request)
	var out []string
	for _, x := range f {
		out = append(out, x.name)
	}
	return out
}

// goldenRequests are request frames both Go and Python encode byte for
// byte (python/tests/test_protocol.py builds the same requests).
var goldenRequests = []struct {
	name   string
	header any
	body   []byte
	chunk  int // streamed in chunks of this many bytes (0: MaxChunk)
}{
	{"hello", helloRequest{opField{"hello"}}, nil, 0},
	{"ffr_open", ffrOpenRequest{opField: opField{"ffr_open"}, Paths: []string{"/data/a.ffr", "/data/dir"}, CheckData: true}, nil, 0},
	{"ffr_read", ffrReadRequest{handleField{opField{"ffr_read"}, 7}}, putInt64s([]int64{3, 0, 2}), 0},
	{"ffw_write", ffwWriteRequest{handleField{opField{"ffw_write"}, 2}, 2}, append(putInt64s([]int64{3, 2}), "abcde"...), 0},
	{"ffw_write_streamed", ffwWriteRequest{handleField{opField{"ffw_write"}, 2}, 1}, append(putInt64s([]int64{10}), "0123456789"...), 4},
	{"loader_reclaim", loaderReclaimRequest{handleField: handleField{opField{"loader_reclaim"}, 3}, Keep: []int{1, 4}, Stream: 2}, nil, 0},
	{"scan", scanRequest{opField: opField{"scan"}, Inputs: []string{"/pq"}, GroupBy: []string{"lang"}, Aggs: "count(*), mean(score)"}, nil, 0},
}

func TestGoldenFrames(t *testing.T) {
	for _, g := range goldenRequests {
		t.Run(g.name, func(t *testing.T) {
			h, err := encodeHeader(g.header)
			if err != nil {
				t.Fatal(err)
			}
			chunk := g.chunk
			if chunk == 0 {
				chunk = MaxChunk
			}
			enc := appendFrame(nil, h, g.body, chunk)
			path := filepath.Join("testdata", "frames", g.name+".req")
			if *update {
				if err := os.WriteFile(path, enc, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, want) {
				t.Fatalf("Go encodes\n%q\nthe golden frame is\n%q", enc, want)
			}
			// Decoded as the server decodes it: the same request.
			a, b := socketPair(t)
			defer a.Close()
			defer b.Close()
			go a.Write(want)
			f, err := readFrame(b)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.readBody(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(f.body, g.body) && !(len(f.body) == 0 && len(g.body) == 0) {
				t.Errorf("body %q, want %q", f.body, g.body)
			}
			q := reflect.New(reflect.TypeOf(g.header))
			if err := decodeRequest(g.name, f.header, q.Interface()); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(q.Elem().Interface(), g.header) {
				t.Errorf("decoded %+v, want %+v", q.Elem().Interface(), g.header)
			}
		})
	}
	// Replies Python must read: a batch reply and an error reply.
	batch := []int64{1, 5, 2, 0, 3, 0, 0, 8, 4, 16, 7, 9, 0, 16, 16, 32}
	enc := appendFrame(nil, batchHeader, putInt64s(batch), MaxChunk)
	errHdr, _ := encodeHeader(errorHeader(decodeRequest("hello", []byte(`{"op":"hello","x":1}`), &helloRequest{})))
	encErr := appendFrame(nil, errHdr, nil, MaxChunk)
	for name, enc := range map[string][]byte{"loader_batch": enc, "error_bad_request": encErr} {
		path := filepath.Join("testdata", "frames", name+".rep")
		if *update {
			if err := os.WriteFile(path, enc, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, want) {
			t.Errorf("%s: Go encodes %q, golden %q", name, enc, want)
		}
	}
}

// A sample longer than MaxChunk (and so than any single frame) goes
// through ffw_write as a streamed body, and reads back intact.
func TestStreamedWriteOfALargeSample(t *testing.T) {
	big := make([]byte, MaxChunk*2+12345)
	for i := range big {
		big[i] = byte(i * 7)
	}
	path := filepath.Join(t.TempDir(), "big.ffr")
	server, client := socketPair(t)
	defer client.Close()
	go NewServer().Serve(context.Background(), server)
	h, _, _ := call(t, client, map[string]any{"op": "ffw_create", "path": path, "n": 2}, nil)
	handle := h["handle"]
	hdr, _ := json.Marshal(map[string]any{"op": "ffw_write", "handle": handle, "count": 2})
	body := append(putInt64s([]int64{int64(len(big)), 3}), big...)
	body = append(body, "end"...)
	go client.Write(appendFrame(nil, hdr, body, MaxChunk))
	f, err := readFrame(client)
	if err != nil {
		t.Fatal(err)
	}
	var rep map[string]any
	json.Unmarshal(f.header, &rep)
	if rep["ok"] != true {
		t.Fatalf("ffw_write: %v", rep)
	}
	if h, _, _ := call(t, client, map[string]any{"op": "ffw_close", "handle": handle}, nil); h["ok"] != true {
		t.Fatalf("close: %v", h)
	}
	r, err := ffrecord.Open(context.Background(), []string{path}, ffrecord.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.ReadBatch(context.Background(), []int64{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[0], big) || string(got[1]) != "end" {
		t.Fatalf("read back %d and %q bytes", len(got[0]), got[1])
	}
}

// A streamed body whose chunks lie about their length is a protocol error,
// not a hang or a huge allocation.
func TestStreamedBodyBadChunk(t *testing.T) {
	a, b := socketPair(t)
	defer a.Close()
	defer b.Close()
	hdr := []byte(`{"op":"ffr_read","handle":1}`)
	msg := binary.LittleEndian.AppendUint32(nil, uint32(len(hdr)))
	msg = binary.LittleEndian.AppendUint32(msg, streamMark)
	msg = append(msg, hdr...)
	msg = binary.LittleEndian.AppendUint64(msg, 8)
	msg = binary.LittleEndian.AppendUint32(msg, MaxChunk+1)
	go a.Write(msg)
	f, err := readFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.readBody(); err == nil || !strings.Contains(err.Error(), "chunk") {
		t.Fatalf("readBody: %v", err)
	}
}
