// Package peek reads the start of response bodies, bounded in bytes (Max)
// and in time (Timeout): to look into a response before it is handed back
// unread (Response), or to drain one that is discarded so that its
// connection can be reused (Drain).
package peek

import (
	"io"
	"net/http"
	"time"
)

// Max is the most read from a response before it is discarded, or looked
// into before it is returned: 4 KiB, as go-retryablehttp drains.
const Max = 4 << 10

// Timeout is the longest a response is read before it is discarded
// (Drain) or returned (Response). A provider writes a refusal's few hundred
// bytes of JSON with its headers; a body that has not come whole in that
// long is not worth holding a call (or a connection) for, however small:
// without the bound, a body that stalls held RoundTrip until the context's
// deadline, or forever.
const Timeout = 250 * time.Millisecond

// Drain reads at most Max bytes of body, for at most Timeout, and closes
// it, so that the connection can be reused when the rest was short. It
// returns what it read and whether that was all of it.
func Drain(body io.ReadCloser) ([]byte, bool) {
	if body == nil || body == http.NoBody {
		if body != nil {
			body.Close()
		}
		return nil, true
	}
	buf := make([]byte, Max+1)
	n, pending, err := readAhead(body, buf)
	body.Close() // which ends a read still pending
	if pending != nil {
		return nil, false
	}
	return buf[:n], err == io.EOF
}

// Response reads up to Max bytes of resp's body, for at most Timeout, and
// puts them back in front of the rest, so that the caller still gets it
// unread. It returns what it read, or nil if the time ran out first.
func Response(resp *http.Response) []byte {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	buf := make([]byte, Max)
	n, pending, err := readAhead(resp.Body, buf)
	resp.Body = &peekedBody{ahead: buf[:n], rest: buf[n:], pending: pending, err: err, body: resp.Body}
	if pending != nil {
		return nil
	}
	return buf[:n]
}

// readResult is the outcome of one Read.
type readResult struct {
	n   int
	err error
}

// readAhead reads body into buf until buf is full, body ends or fails, or
// Timeout has passed. It returns how much it read and the error that
// ended the reading (nil if buf is full). If the time ran out, the Read in
// flight goes on into buf[n:], and pending will receive its result.
func readAhead(body io.Reader, buf []byte) (n int, pending <-chan readResult, err error) {
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for n < len(buf) {
		ch := make(chan readResult, 1)
		go func(p []byte) {
			k, err := body.Read(p)
			ch <- readResult{k, err}
		}(buf[n:])
		select {
		case r := <-ch:
			n += r.n
			if r.err != nil {
				return n, nil, r.err
			}
		case <-timer.C:
			return n, ch, nil
		}
	}
	return n, nil, nil
}

// peekedBody is a response body of which Response read ahead: it gives the
// bytes read, then those of the Read that was still in flight, if any, then
// the rest of body. Close closes body, which ends a Read in flight.
type peekedBody struct {
	ahead   []byte            // read ahead, not yet given to the caller
	rest    []byte            // where the Read in flight reads into
	pending <-chan readResult // the Read in flight; nil if none
	err     error             // what ended the reading ahead, once ahead is given
	body    io.ReadCloser
}

func (b *peekedBody) Read(p []byte) (int, error) {
	if len(b.ahead) == 0 && b.pending != nil {
		r := <-b.pending
		b.ahead, b.err, b.pending = b.rest[:r.n], r.err, nil
	}
	if len(b.ahead) > 0 {
		n := copy(p, b.ahead)
		b.ahead = b.ahead[n:]
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.body.Read(p)
}

func (b *peekedBody) Close() error { return b.body.Close() }
