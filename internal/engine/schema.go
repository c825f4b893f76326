package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/loader"
	"github.com/ffkit/ffkit/scan"
)

// The protocol between Python and the engine, defined once: every operation
// with its request and reply header types, the error codes, and the layout
// of a batch reply's body. The server dispatches from this table, and
// python/ffkit/_protocol.py is generated from it (`ffkit engine --schema
// FILE`; TestPythonSchemaUpToDate fails when the file is stale). Adding an
// operation means adding one entry here (and its function).

// Version is the protocol version; Python checks it in "hello".
const Version = 4

// Every request header names its operation; requests on a handle name it
// too. A request field the operation does not define is refused with
// ErrBadRequest naming the field.
type opField struct {
	Op string `json:"op"`
}

type handleField struct {
	opField
	Handle uint64 `json:"handle"`
}

// okField opens every successful reply header.
type okField struct {
	OK bool `json:"ok"`
}

func ok() okField { return okField{OK: true} }

type (
	helloRequest struct{ opField }
	helloReply   struct {
		okField
		Version int `json:"version"`
		PID     int `json:"pid"`
	}
	closeRequest   struct{ handleField }
	connectRequest struct{ opField }
	// ffrOpenRequest opens a reader of one or more .ffr files/directories.
	ffrOpenRequest struct {
		opField
		Paths     []string `json:"paths"`
		CheckData bool     `json:"check_data"`
		Direct    bool     `json:"direct"`
	}
	ffrOpenReply struct {
		okField
		Handle uint64              `json:"handle"`
		N      int64               `json:"n"`
		Files  []ffrecord.FileMeta `json:"files"`
	}
	ffrReadRequest struct{ handleField }
	ffrReadReply   struct {
		okField
		Size int64 `json:"size"`
	}
	ffrValidateRequest struct {
		handleField
		Limit int `json:"limit"`
	}
	badSample struct {
		Index int64  `json:"index"`
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	ffrValidateReply struct {
		okField
		N   int64       `json:"n"`
		Bad []badSample `json:"bad"`
	}
	ffwCreateRequest struct {
		opField
		Path string `json:"path"`
		N    int64  `json:"n"`
	}
	handleReply struct {
		okField
		Handle uint64 `json:"handle"`
	}
	ffwWriteRequest struct {
		handleField
		Count int64 `json:"count"`
	}
	ffwFinishRequest  struct{ handleField }
	loaderOpenRequest struct {
		opField
		Paths     []string `json:"paths"`
		BatchSize int      `json:"batch_size"`
		Shuffle   bool     `json:"shuffle"`
		Seed      uint64   `json:"seed"`
		Rank      int      `json:"rank"`
		WorldSize int      `json:"world_size"`
		DropLast  bool     `json:"drop_last"`
		Prefetch  int      `json:"prefetch"`
		Hold      int      `json:"hold"`
		Ahead     int      `json:"ahead"`
		CheckData bool     `json:"check_data"`
		// Direct is "off" (or ""), "on" or "auto" (ffrecord.ParseDirectMode).
		Direct       string `json:"direct"`
		Workers      int    `json:"workers"`
		MemoryBudget int64  `json:"memory_budget"`
		StartEpoch   int64  `json:"start_epoch"`
		SkipBad      bool   `json:"skip_bad"`
		BlockSize    int64  `json:"block_size"`
	}
	loaderOpenReply struct {
		okField
		Handle          uint64       `json:"handle"`
		N               int64        `json:"n"`
		Slots           int          `json:"slots"`
		SlotSize        int64        `json:"slot_size"`
		Board           int64        `json:"board"`
		WaitingWord     int          `json:"waiting_word"`
		WakeWord        int          `json:"wake_word"`
		BatchesPerEpoch int64        `json:"batches_per_epoch"`
		Items           int64        `json:"items"`
		State           loader.State `json:"state"`
	}
	// Each loader operation after open has its own request type; the
	// functions receive them as one loaderRequest (see viaLoader).
	loaderNextRequest struct {
		handleField
		Release []int `json:"release"`
	}
	loaderStreamRequest struct {
		handleField
		Release []int `json:"release"`
		// Stream numbers the stream (see loaderHandle.fence).
		Stream uint64 `json:"stream"`
	}
	loaderReleaseRequest struct {
		handleField
		Release []int `json:"release"`
	}
	loaderReclaimRequest struct {
		handleField
		Keep []int `json:"keep"`
		// Stream is the last stream Python opened.
		Stream uint64 `json:"stream"`
	}
	loaderSetEpochRequest struct {
		handleField
		Epoch int64 `json:"epoch"`
	}
	loaderRestoreRequest struct {
		handleField
		State json.RawMessage `json:"state"`
	}
	loaderStatsRequest struct{ handleField }
	// loaderRequest is what every loader function receives (not on the
	// wire as such: each operation decodes its own type above).
	loaderRequest struct {
		handleField
		Release []int           `json:"release"`
		Keep    []int           `json:"keep"`
		Epoch   int64           `json:"epoch"`
		State   json.RawMessage `json:"state"`
		// Stream numbers a loader_stream; in a loader_reclaim, the last
		// stream Python opened (see loaderHandle.fence).
		Stream uint64 `json:"stream"`
	}
	// loaderEndReply ends an epoch-less stream of batches (never sent:
	// loaders run for ever) or answers loader_next at the end.
	loaderEndReply struct {
		okField
		End bool `json:"end"`
	}
	loaderStateReply struct {
		okField
		State loader.State `json:"state"`
	}
	loaderStatsReply struct {
		okField
		Stats loader.Stats `json:"stats"`
	}
	byteRange struct {
		Path   string `json:"path"`
		Offset int64  `json:"offset"`
		Length int64  `json:"length"`
	}
	readRangesRequest struct {
		opField
		Ranges []byteRange `json:"ranges"`
	}
	scanRequest struct {
		opField
		Inputs  []string `json:"inputs"`
		Columns string   `json:"columns"`
		Where   string   `json:"where"`
		SQL     string   `json:"sql"`
		GroupBy []string `json:"group_by"`
		Aggs    string   `json:"aggs"`
		Workers int      `json:"workers"`
	}
	scanReply struct {
		okField
		Size    int64         `json:"size"`
		Summary *scan.Summary `json:"summary"`
	}
	// errorReply is the header of every failed reply.
	errorReply struct {
		Error string `json:"error"`
		Kind  string `json:"kind"`
		Code  string `json:"code"`
	}
)

// OpSpec describes one operation.
type OpSpec struct {
	Name      string
	Doc       string
	Request   reflect.Type // the request header
	Reply     reflect.Type // the header of a successful reply
	Body      string       // what the request body carries ("" for nothing)
	ReplyBody string       // what the reply body and descriptors carry
	// Stream: the operation reads a streamed request body itself, chunk by
	// chunk, instead of receiving it whole.
	Stream bool
	run    opFunc // nil for ops the connection loop serves itself
}

// opFunc runs one operation on its decoded request.
type opFunc func(ctx context.Context, s *Server, hdr []byte, in input) (reply, error)

// input is a request's body, descriptors and streamed body.
type input struct {
	body   []byte
	fds    []int
	stream *chunkReader
}

// op makes an OpSpec whose function receives its request decoded strictly.
func op[Q, R any](name, doc, body, replyBody string, f func(ctx context.Context, s *Server, q *Q, in input) (reply, error)) OpSpec {
	spec := OpSpec{Name: name, Doc: doc, Body: body, ReplyBody: replyBody,
		Request: reflect.TypeFor[Q](), Reply: reflect.TypeFor[R]()}
	if f != nil {
		spec.run = func(ctx context.Context, s *Server, hdr []byte, in input) (reply, error) {
			var q Q
			if err := decodeRequest(name, hdr, &q); err != nil {
				closeFDs(in.fds)
				return reply{}, err
			}
			return f(ctx, s, &q, in)
		}
	}
	return spec
}

// decodeRequest decodes a request header into q, refusing fields q does
// not define.
func decodeRequest(name string, hdr []byte, q any) error {
	d := json.NewDecoder(bytes.NewReader(hdr))
	d.DisallowUnknownFields()
	if err := d.Decode(q); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadRequest, name, err)
	}
	return nil
}

// Schema lists every operation, in the order the docs present them.
var Schema = []OpSpec{
	op[helloRequest, helloReply]("hello", "Checks the protocol version; names the engine's pid.", "", "", hello),
	op[closeRequest, okField]("close", "Closes a handle (closing twice is harmless).", "", "", closeOp),
	op[connectRequest, okField]("connect", "Adds a request connection: one end of a socket pair, as the only descriptor.", "",
		"", nil),
	op[ffrOpenRequest, ffrOpenReply]("ffr_open", "Opens a reader of .ffr files and directories.", "", "", ffrOpen),
	op[ffrReadRequest, ffrReadReply]("ffr_read", "Reads samples into a fresh shared-memory segment.",
		"int64 sample indices", "2 int64 per sample: [start, end) in the segment; descriptor: the segment (none when size is 0)", ffrRead),
	op[ffrValidateRequest, ffrValidateReply]("ffr_validate", "Reads every sample with checksums on; lists bad ones (up to limit, default 100).",
		"", "", ffrValidate),
	op[readRangesRequest, ffrReadReply]("read_ranges", "Reads raw byte ranges of files into a fresh shared-memory segment.", "",
		"2 int64 per range: [start, end) in the segment; descriptor: the segment (none when size is 0)", readRanges),
	op[ffwCreateRequest, handleReply]("ffw_create", "Starts writing one .ffr file of n samples (published on ffw_close).", "", "", ffwCreate),
	{ // ffw_write reads large bodies as a stream (see its function)
		Name: "ffw_write", Doc: "Appends count samples.", Body: "count int64 lengths, then the samples' bytes end to end (streamed when long)",
		Request: reflect.TypeFor[ffwWriteRequest](), Reply: reflect.TypeFor[okField](), Stream: true,
		run: func(ctx context.Context, s *Server, hdr []byte, in input) (reply, error) {
			var q ffwWriteRequest
			if err := decodeRequest("ffw_write", hdr, &q); err != nil {
				closeFDs(in.fds)
				return reply{}, err
			}
			return ffwWrite(ctx, s, &q, in)
		},
	},
	op[ffwFinishRequest, okField]("ffw_close", "Writes the header and publishes the file by rename.", "", "", ffwFinish(false)),
	op[ffwFinishRequest, okField]("ffw_abort", "Abandons the file: nothing appears under its name.", "", "", ffwFinish(true)),
	op[loaderOpenRequest, loaderOpenReply]("loader_open", "Opens a loader whose batches go to a shared ring.", "",
		"descriptor: the ring (see doc.go)", loaderOpen),
	op[loaderNextRequest, loaderEndReply]("loader_next", "Returns the next batch (a batch reply), or end.", "",
		"a batch reply body (BatchFields)", viaLoader[loaderNextRequest](loaderNext)),
	op[loaderStreamRequest, loaderEndReply]("loader_stream", "Turns the connection into a stream of batch replies.", "",
		"one batch reply per batch (BatchFields)", nil),
	op[loaderReleaseRequest, okField]("loader_release", "Gives back the slots in release.", "", "",
		viaLoader[loaderReleaseRequest](loaderRelease)),
	op[loaderReclaimRequest, okField]("loader_reclaim", "After a stream stopped: gives back every lent slot not in keep.", "", "",
		viaLoader[loaderReclaimRequest](loaderReclaim)),
	op[loaderSetEpochRequest, loaderStateReply]("loader_set_epoch", "Starts the given epoch.", "", "",
		viaLoader[loaderSetEpochRequest](loaderSetEpoch)),
	op[loaderRestoreRequest, loaderStateReply]("loader_restore", "Resumes from a state.", "", "",
		viaLoader[loaderRestoreRequest](loaderRestore)),
	op[loaderStatsRequest, loaderStatsReply]("loader_stats", "Returns the loader's stage statistics.", "", "",
		viaLoader[loaderStatsRequest](loaderStats)),
	op[scanRequest, scanReply]("scan", "Runs a scan job into an Arrow IPC file in shared memory.", "",
		"descriptor: the Arrow IPC file (size bytes)", scanOp),
}

// loaderOp is a loader operation's request, as the loader functions take it.
type loaderOp interface{ args() loaderRequest }

func (q *loaderNextRequest) args() loaderRequest {
	return loaderRequest{handleField: q.handleField, Release: q.Release}
}
func (q *loaderStreamRequest) args() loaderRequest {
	return loaderRequest{handleField: q.handleField, Release: q.Release, Stream: q.Stream}
}
func (q *loaderReleaseRequest) args() loaderRequest {
	return loaderRequest{handleField: q.handleField, Release: q.Release}
}
func (q *loaderReclaimRequest) args() loaderRequest {
	return loaderRequest{handleField: q.handleField, Keep: q.Keep, Stream: q.Stream}
}
func (q *loaderSetEpochRequest) args() loaderRequest {
	return loaderRequest{handleField: q.handleField, Epoch: q.Epoch}
}
func (q *loaderRestoreRequest) args() loaderRequest {
	return loaderRequest{handleField: q.handleField, State: q.State}
}
func (q *loaderStatsRequest) args() loaderRequest { return loaderRequest{handleField: q.handleField} }

// viaLoader adapts a loader function to an operation's own request type.
func viaLoader[Q any, PQ interface {
	*Q
	loaderOp
}](f func(ctx context.Context, s *Server, q *loaderRequest, in input) (reply, error)) func(ctx context.Context, s *Server, q *Q, in input) (reply, error) {
	return func(ctx context.Context, s *Server, q *Q, in input) (reply, error) {
		a := PQ(q).args()
		return f(ctx, s, &a, in)
	}
}

// ErrorCode is one value of an error reply's "code": what Python turns
// into an exception class.
type ErrorCode struct {
	Code string
	Kind string // the errkind it comes with
	Doc  string
}

// ErrorCodes lists every code an error reply may carry ("" for none).
var ErrorCodes = []ErrorCode{
	{"checksum", "data", "a sample's CRC-32 does not match"},
	{"truncated", "data", "a file ends before its header or samples say"},
	{"short_read", "data", "a file is shorter than a read needs"},
	{"corrupt", "data", "a header or offset table is inconsistent"},
	{"index", "usage", "a sample index is out of range"},
	{"no_files", "usage", "a path names no .ffr files"},
	{"state", "usage", "a loader state does not fit this loader or dataset"},
	{"options", "usage", "loader options out of range"},
	{"budget", "usage", "a memory budget too small for one batch"},
	{"bad_request", "usage", "an unknown operation, handle or request field, or bad arguments"},
	{"protocol", "usage", "a frame that does not follow the protocol"},
	{"canceled", "other", "the request was canceled (Python closed its connection)"},
	{"not_found", "unavailable", "a file does not exist"},
	{"permission", "unavailable", "permission denied"},
	{"no_space", "unavailable", "no space left on the device"},
}

// BatchFields names the int64s that open a batch reply's body, in order;
// then come n sample indices and n [start, end) pairs of positions in the
// slot (see doc.go).
var BatchFields = []string{"slot", "lend", "n", "epoch", "step", "padded", "state_epoch", "state_cursor", "state_step", "grid"}

// batchMeta is the number of int64s that open a batch reply's body.
const batchMeta = 10

var opsByName = func() map[string]*OpSpec {
	m := map[string]*OpSpec{}
	for i := range Schema {
		m[Schema[i].Name] = &Schema[i]
	}
	return m
}()

func init() {
	addCode(ErrBadRequest, "bad_request")
	addCode(ErrProtocol, "protocol")
}
