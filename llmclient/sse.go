package llmclient

import "bytes"

// sseDecoder splits a stream of server-sent events, written to it in
// pieces of any size, into the data of its events: the values of its
// "data" fields, joined by newlines. Other fields, comments and events
// with no data are skipped. It keeps at most one line and one event's
// data, each bounded by limit bytes: an event that passes the bound, by
// one line or by its data, is reported once, as too large, the moment it
// does, and then skipped.
type sseDecoder struct {
	limit int64
	// event is given each event's data, valid until it returns, or nil and
	// tooLarge. Its false stops the decoding: Write takes nothing more.
	event func(data []byte, tooLarge bool) bool

	line    []byte // the start of the current line, when it spans writes
	long    bool   // the current line passes limit: not kept
	data    []byte // the current event's data
	over    bool   // the current event passed limit
	stopped bool
}

// Write decodes p. It never fails: it reports len(p) even once stopped.
func (d *sseDecoder) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && !d.stopped {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			d.partial(p)
			break
		}
		if len(d.line) > 0 || d.long {
			d.partial(p[:i])
			d.endLine(d.line)
		} else {
			d.endLine(p[:i])
		}
		d.line, d.long = d.line[:0], false
		p = p[i+1:]
	}
	return n, nil
}

// flush ends a last line that has no newline, and a last event that no
// blank line ends.
func (d *sseDecoder) flush() {
	if len(d.line) > 0 || d.long {
		d.endLine(d.line)
		d.line, d.long = d.line[:0], false
	}
	d.dispatch()
}

// partial keeps b, a piece of a line that goes on in the next write.
func (d *sseDecoder) partial(b []byte) {
	if d.long || int64(len(d.line)+len(b)) > d.limit {
		d.line, d.long = d.line[:0], true
		d.tooLarge()
		return
	}
	d.line = append(d.line, b...)
}

// endLine processes a complete line, without its "\n".
func (d *sseDecoder) endLine(line []byte) {
	if d.long || int64(len(line)) > d.limit {
		d.tooLarge()
		return
	}
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		d.dispatch()
		return
	}
	v, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || d.over {
		return // a comment, or a field other than data
	}
	v = bytes.TrimPrefix(v, []byte(" "))
	if int64(len(d.data))+1+int64(len(v)) > d.limit { // many data lines
		d.tooLarge()
		return
	}
	if len(d.data) > 0 {
		d.data = append(d.data, '\n')
	}
	d.data = append(d.data, v...)
}

// tooLarge marks the current event too large, reporting it the first time.
func (d *sseDecoder) tooLarge() {
	if d.over || d.stopped {
		return
	}
	d.over, d.data = true, d.data[:0]
	d.stopped = !d.event(nil, true)
}

// dispatch ends the current event, handing over its data if it has any.
func (d *sseDecoder) dispatch() {
	if !d.over && len(d.data) > 0 && !d.stopped {
		d.stopped = !d.event(d.data, false)
	}
	d.data, d.over = d.data[:0], false
}
