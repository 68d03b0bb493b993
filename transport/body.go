package transport

import (
	"bytes"
	"io"
	"net/http"
)

// maxDrain is the most read from a response before it is discarded, or
// looked into before it is returned.
const maxDrain = 4 << 10

// drain reads at most maxDrain bytes of body and closes it, so that the
// connection can be reused when the rest was short. It returns what it read
// and whether that was all of it.
func drain(body io.ReadCloser) ([]byte, bool) {
	if body == nil || body == http.NoBody {
		if body != nil {
			body.Close()
		}
		return nil, true
	}
	buf, err := io.ReadAll(io.LimitReader(body, maxDrain+1))
	body.Close()
	return buf, err == nil && len(buf) <= maxDrain
}

// peekBody reads up to maxDrain bytes of resp's body and puts them back in
// front of the rest, so that the caller still gets it unread.
func peekBody(resp *http.Response) []byte {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	buf, _ := io.ReadAll(io.LimitReader(resp.Body, maxDrain))
	resp.Body = &prefixBody{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
	return buf
}

type prefixBody struct {
	io.Reader
	io.Closer
}
