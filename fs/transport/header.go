package transport

import "encoding/json"

// HeaderCodec is a request or reply header that encodes itself instead of
// as JSON: for the hot methods (batched reads), where JSON would cost a
// large share of a request's CPU. The receiving side decodes it with the
// same type's HeaderDecoder.
type HeaderCodec interface {
	AppendHeader(b []byte) []byte
}

// HeaderDecoder decodes what HeaderCodec.AppendHeader wrote (called on a
// pointer). Its errors name what was malformed; it never panics on bad
// input.
type HeaderDecoder interface {
	DecodeHeader(h []byte) error
}

func marshalHeader(v any) ([]byte, error) {
	if c, ok := v.(HeaderCodec); ok {
		return c.AppendHeader(nil), nil
	}
	return json.Marshal(v)
}

func unmarshalHeader(h []byte, v any) error {
	if d, ok := v.(HeaderDecoder); ok {
		return d.DecodeHeader(h)
	}
	return json.Unmarshal(h, v)
}
