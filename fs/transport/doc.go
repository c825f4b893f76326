// Package transport moves requests and replies between ffkit's services
// over TCP: length-prefixed binary frames, many requests in flight per
// connection (multiplexed by request id). Every connection starts with a
// handshake (handshake.go): TLS 1.3 against the cluster CA (always off
// loopback; see Options.Trust), then both sides prove they hold the
// cluster token, the server first, without sending it. A peer that fails
// is refused, and refusals are logged at most once a second. Until its
// handshake succeeds a connection holds a 512-byte buffer, and the
// server keeps at most MaxPendingHandshakes of them (per source address:
// MaxPendingHandshakesPerSrc), closing the oldest beyond that.
//
// # Frame
//
//	offset size  field
//	0      4     L: length of the rest of the frame (big endian), 16 <= L <= MaxFrame
//	4      8     request id
//	12     1     type: 1 request, 2 reply, 3 error reply, 4 hello, 5 hello ok, 6 proof
//	13     1     reserved (0)
//	14     2     method
//	16     4     H: header length, H <= L-16
//	20     H     header (JSON)
//	20+H   L-16-H data (raw bytes: chunk contents)
//
// Bulk data never goes through JSON: a sender passes its buffers to one
// writev (net.Buffers) and a receiver reads the whole frame into one buffer
// that the data slice points into, so chunk bytes are copied once per hop by
// the kernel and once into the caller's buffer. A server handler may mark
// a reply part as the bytes of a file (Request.SendFile): it then goes out
// with sendfile(2) from the page cache, not copied at all on the sending
// side. A client call with a Sink (CallInto) has large reply reads land
// straight from the socket in the caller's buffers (frameReader), past
// the connection's bufio.Reader.
//
// # Faults
//
// A Faults value (set on Server and Dialer) drops every frame between two
// named peers, in both directions, to emulate a network partition in
// tests; FileFaults reads the blocked pairs from a file so tests can
// partition real processes.
//
// Concurrency: Conn.Call is safe for concurrent use; a Server runs each
// request in its own goroutine, bounded per connection.
package transport
