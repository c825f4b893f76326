package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"unicode"
)

// PythonSchema renders Schema as python/ffkit/_protocol.py: one request
// class per operation (a dict of the request header, its fields keyword-only
// with the engine's defaults and in the engine's order, so Python encodes a
// request byte for byte as Go does), each operation's reply fields, the
// error codes, the batch-body layout and the frame constants.
func PythonSchema() ([]byte, error) {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`"""The engine protocol, GENERATED from internal/engine/schema.go: do not edit.

Regenerate with `+"`go run ./cmd/ffkit engine --schema python/ffkit/_protocol.py`"+`
(TestPythonSchemaUpToDate in internal/engine fails when this file is stale).
Each request class is the header of one operation as a dict; the engine
refuses fields it does not define.
"""

VERSION = %d
# A frame's body-length word STREAM_MARK announces a streamed body: a u64
# total, then chunks of u32 length + bytes, each at most MAX_CHUNK bytes.
MAX_CHUNK = %d
STREAM_MARK = 0x%X
MAX_FDS = %d

`, Version, MaxChunk, streamMark, maxFDs)
	p("# The int64s that open a batch reply's body, in order; then n sample\n")
	p("# indices and n [start, end) pairs of positions in the slot.\n")
	p("BATCH_FIELDS = (%s)\n", pyStrings(BatchFields))
	p("BATCH_META = len(BATCH_FIELDS)\n\n")
	p("# Every error code: code -> (kind, meaning).\nERROR_CODES = {\n")
	for _, c := range ErrorCodes {
		p("    %q: (%q, %q),\n", c.Code, c.Kind, c.Doc)
	}
	p("}\n")
	var names []string
	for _, op := range Schema {
		fields, err := jsonFields(op.Request)
		if err != nil {
			return nil, fmt.Errorf("engine: schema of %s: %w", op.Name, err)
		}
		cls := className(op.Name)
		names = append(names, cls)
		p("\n\nclass %s(dict):\n", cls)
		p("    \"\"\"%s", op.Doc)
		if op.Body != "" {
			p("\n\n    Body: %s.", op.Body)
		}
		if op.ReplyBody != "" {
			p("\n\n    Reply body: %s.", op.ReplyBody)
		}
		p("\"\"\"\n\n")
		p("    OP = %q\n", op.Name)
		var args, sets []string
		var fnames []string
		for _, f := range fields {
			if f.name == "op" {
				continue
			}
			fnames = append(fnames, f.name)
			args = append(args, fmt.Sprintf("%s=%s", f.name, f.def))
			sets = append(sets, fmt.Sprintf("%q: %s", f.name, pyValue(f)))
		}
		p("    FIELDS = (%s)\n", pyStrings(fnames))
		rf, err := jsonFields(op.Reply)
		if err != nil {
			return nil, fmt.Errorf("engine: reply schema of %s: %w", op.Name, err)
		}
		var rnames []string
		for _, f := range rf {
			rnames = append(rnames, f.name)
		}
		p("    REPLY_FIELDS = (%s)\n", pyStrings(rnames))
		p("    STREAM_BODY = %s\n\n", map[bool]string{true: "True", false: "False"}[op.Stream])
		if len(args) == 0 {
			p("    def __init__(self):\n        super().__init__(op=%q)\n", op.Name)
			continue
		}
		p("    def __init__(self, *, %s):\n", strings.Join(args, ", "))
		p("        super().__init__({\"op\": %q, %s})\n", op.Name, strings.Join(sets, ", "))
	}
	p("\n\nREQUESTS = {c.OP: c for c in (%s)}\n", strings.Join(names, ", "))
	return b.Bytes(), nil
}

type pyField struct {
	name string
	kind reflect.Kind
	def  string // Python default
	raw  bool   // json.RawMessage: any JSON value
}

var rawMessage = reflect.TypeFor[json.RawMessage]()

// jsonFields lists a struct's JSON fields in encoding order, embedded
// structs flattened.
func jsonFields(t reflect.Type) ([]pyField, error) {
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("%s is not a struct", t)
	}
	var out []pyField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			sub, err := jsonFields(f.Type)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
			continue
		}
		tag := strings.Split(f.Tag.Get("json"), ",")[0]
		if tag == "" || tag == "-" {
			return nil, fmt.Errorf("%s.%s has no json name", t, f.Name)
		}
		pf := pyField{name: tag, kind: f.Type.Kind()}
		switch {
		case f.Type == rawMessage:
			pf.raw, pf.def = true, "None"
		case pf.kind == reflect.Bool:
			pf.def = "False"
		case pf.kind == reflect.String:
			pf.def = `""`
		case pf.kind >= reflect.Int && pf.kind <= reflect.Uint64:
			pf.def = "0"
		case pf.kind == reflect.Slice || pf.kind == reflect.Map || pf.kind == reflect.Pointer || pf.kind == reflect.Struct:
			pf.def = "None"
		default:
			return nil, fmt.Errorf("%s.%s: no Python mapping for %s", t, f.Name, f.Type)
		}
		out = append(out, pf)
	}
	return out, nil
}

// pyValue is the expression that stores field f's argument as Go would
// encode the field's zero value when the argument is left out.
func pyValue(f pyField) string {
	switch {
	case f.raw:
		return f.name
	case f.kind == reflect.Slice:
		return fmt.Sprintf("None if %s is None else list(%s)", f.name, f.name)
	case f.kind == reflect.Bool:
		return fmt.Sprintf("bool(%s)", f.name)
	case f.kind == reflect.String:
		return f.name
	default:
		return fmt.Sprintf("int(%s)", f.name)
	}
}

func className(op string) string {
	var b strings.Builder
	up := true
	for _, r := range op {
		if r == '_' {
			up = true
			continue
		}
		if up {
			r = unicode.ToUpper(r)
			up = false
		}
		b.WriteRune(r)
	}
	return b.String() + "Request"
}

func pyStrings(ss []string) string {
	if len(ss) == 0 {
		return ""
	}
	var q []string
	for _, s := range ss {
		q = append(q, fmt.Sprintf("%q", s))
	}
	return strings.Join(q, ", ") + ","
}
