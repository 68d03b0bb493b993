package llmclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// head is what the presets read of a request's JSON body besides its
// cost: its model and its caps on the completion.
type head struct {
	Model               string
	MaxTokens           int
	MaxCompletionTokens int
	// BadModel says the body's "model" is neither a string of at most
	// maxModelName bytes nor null.
	BadModel bool
}

// maxHeadBody bounds the bytes of a body that readHead scans: twice the
// 32 MB that Anthropic's Messages API accepts.
const maxHeadBody = 64 << 20

// Why readHead could not read a body's head.
var (
	errNoBody      = errors.New("no body")
	errNoGetBody   = errors.New("a body without GetBody, which cannot be read without being spent")
	errHeadTooBig  = errors.New("a body past 64 MiB")
	errNotAnObject = errors.New("a body that is not a JSON object")
)

// readHead reads the head of r's JSON body from a copy (GetBody), at most
// maxHeadBody bytes of it, wherever its keys sit, 16 KiB at a time: it
// keeps the values of the keys of head (the last of each, as a JSON
// decoder does) and nothing else. A request with no body gets errNoBody.
func readHead(r *http.Request) (head, error) {
	if r == nil || r.Body == nil || r.Body == http.NoBody {
		return head{}, errNoBody
	}
	if r.GetBody == nil {
		return head{}, errNoGetBody
	}
	body, err := r.GetBody()
	if err != nil {
		return head{}, err
	}
	defer body.Close()
	return scanHead(body, r.ContentLength)
}

// headChunk is the most scanHead reads at once.
const headChunk = 16 << 10

// scanHead reads the head of the JSON object body holds (see readHead),
// size bytes long if size > 0, at most headChunk bytes at a time.
func scanHead(body io.Reader, size int64) (head, error) {
	s := newHeadScanner()
	bufSize := headChunk
	if size > 0 && size < headChunk {
		bufSize = int(size) + 1 // +1: to read the end of the body in the same Read
	}
	buf := make([]byte, bufSize)
	read := 0
	for s.state != scanDone && s.err == nil {
		n, err := body.Read(buf)
		if read += n; read > maxHeadBody {
			return head{}, errHeadTooBig
		}
		s.scan(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return head{}, err
		}
	}
	return s.head()
}

// The keys of head, as the JSON names them, and their index in
// headScanner.vals.
const (
	keyModel = iota
	keyMaxTokens
	keyMaxCompletionTokens
	headKeys
)

var headKeyNames = [headKeys]string{"model", "max_tokens", "max_completion_tokens"}

// Bounds on what headScanner keeps: a key's name (a key of head escaped
// in full, "\u006d…", takes 6 bytes a letter, and its closing quote one)
// and a value of head's (a model's name, escaped in full, in its quotes).
const (
	maxKeyToken   = 6*len("max_completion_tokens") + 1
	maxValueToken = 6*maxModelName + 2
)

// scanState is where headScanner is in the object.
type scanState uint8

const (
	scanStart     scanState = iota // before the object's '{'
	scanFirstKey                   // after '{': a key or '}'
	scanKey                        // after ',': a key
	scanKeyString                  // in a key's string
	scanColon                      // after a key
	scanValue                      // after ':'
	scanInValue                    // in a value
	scanNext                       // after a value: ',' or '}'
	scanDone                       // after the object's '}'
	scanFailed                     // at a byte that has no place in a JSON object
)

// headScanner reads a JSON object's top-level keys as its bytes go by. It
// knows strings, nesting and the object's punctuation, and checks little
// else of the JSON: what it accepts and a JSON decoder refuses, the
// provider refuses too, so what it reads there is never spent. It keeps
// the last value of each key of head, within maxValueToken bytes, and
// allocates nothing else: every other value is skipped as it goes by.
type headScanner struct {
	state  scanState
	depth  int              // arrays and objects open in the value
	str    bool             // in a string (a key, or in the value)
	esc    bool             // after a backslash in that string
	scalar bool             // the value is a number or a literal
	key    int              // the key of head whose value is being read; -1: none
	name   []byte           // the key being read, as the JSON gives it, within maxKeyToken
	vals   [headKeys][]byte // the last value of each key, as the JSON gives it
	long   [headKeys]bool   // that value passed its valueBound
	err    error
}

func newHeadScanner() *headScanner {
	return &headScanner{key: -1}
}

// valueBound is the most kept of the value of key k of head.
func valueBound(k int) int {
	if k == keyModel {
		return maxValueToken
	}
	return 32 // an integer's
}

// scan reads the next bytes of the body.
func (s *headScanner) scan(p []byte) {
	for i := 0; i < len(p) && s.err == nil && s.state != scanDone; i++ {
		switch {
		case s.str:
			i = s.inString(p, i)
		case s.state == scanInValue:
			if s.inValue(p[i]) {
				i-- // the byte that ended a number or literal is read again
			}
		default:
			s.punctuation(p[i])
		}
	}
}

// punctuation reads c outside any key or value.
func (s *headScanner) punctuation(c byte) {
	switch {
	case c == ' ' || c == '\t' || c == '\n' || c == '\r':
	case s.state == scanValue:
		s.beginValue(c)
	default:
		next := nextState(s.state, c)
		if next == scanFailed {
			s.err = errNotAnObject
			return
		}
		s.state = next
		if next == scanKeyString {
			s.str, s.name = true, s.name[:0]
		}
	}
}

// nextState returns the state that follows punctuation c in state st, or
// scanFailed if c has no place there.
func nextState(st scanState, c byte) scanState {
	switch {
	case st == scanStart && c == '{':
		return scanFirstKey
	case (st == scanFirstKey || st == scanKey) && c == '"':
		return scanKeyString
	case (st == scanFirstKey || st == scanNext) && c == '}':
		return scanDone
	case st == scanColon && c == ':':
		return scanValue
	case st == scanNext && c == ',':
		return scanKey
	}
	return scanFailed
}

// beginValue reads c, the first byte of a value.
func (s *headScanner) beginValue(c byte) {
	if c == ',' || c == ':' || c == '}' || c == ']' {
		s.err = errNotAnObject
		return
	}
	s.state = scanInValue
	if s.key >= 0 {
		s.vals[s.key], s.long[s.key] = s.vals[s.key][:0], false
	}
	s.keep([]byte{c})
	switch c {
	case '"':
		s.str = true
	case '{', '[':
		s.depth = 1
	default:
		s.scalar = true
	}
}

// inValue reads c, outside a string, in a value, and reports whether c
// ended a number or literal, and must be read again as punctuation.
func (s *headScanner) inValue(c byte) (again bool) {
	if s.scalar {
		switch c {
		case ' ', '\t', '\n', '\r', ',', '}', ']':
			s.endValue()
			return true
		case '"', '{', '[', ':':
			s.err = errNotAnObject
			return false
		}
		s.keep([]byte{c})
		return false
	}
	s.keep([]byte{c})
	switch c {
	case '"':
		s.str = true
	case '{', '[':
		s.depth++
	case '}', ']':
		if s.depth--; s.depth == 0 {
			s.endValue()
		}
	}
	return false
}

// inString reads p[i:] inside a string, up to its closing quote, and
// returns the index of the last byte it read. It finds the quotes and
// backslashes with bytes.IndexByte, each byte looked at once.
func (s *headScanner) inString(p []byte, i int) int {
	start := i
	q := -1 // p[q] is the first quote at or after i; len(p): none
	for i < len(p) {
		if s.esc {
			s.esc, i = false, i+1
			continue
		}
		if q < i {
			if q = bytes.IndexByte(p[i:], '"'); q < 0 {
				q = len(p)
			} else {
				q += i
			}
		}
		if k := bytes.IndexByte(p[i:q], '\\'); k >= 0 {
			s.esc, i = true, i+k+1
			continue
		}
		if q == len(p) {
			break
		}
		s.str = false
		s.keep(p[start : q+1])
		s.endString()
		return q
	}
	s.keep(p[start:])
	return len(p) - 1
}

// endString follows the closing quote of a string.
func (s *headScanner) endString() {
	switch {
	case s.state == scanKeyString:
		s.state, s.key = scanColon, keyOf(s.name)
	case s.state == scanInValue && s.depth == 0:
		s.endValue()
	}
}

// endValue follows the last byte of a value.
func (s *headScanner) endValue() {
	s.state, s.key, s.depth, s.scalar = scanNext, -1, 0, false
}

// keep keeps b, the next bytes of a key's name or of a value of head's,
// within its bound.
func (s *headScanner) keep(b []byte) {
	switch {
	case s.state == scanKeyString:
		if len(s.name)+len(b) <= maxKeyToken {
			s.name = append(s.name, b...)
		} else {
			s.name = append(s.name[:0], '!') // no key of head's
		}
	case s.state == scanInValue && s.key >= 0:
		if v := s.vals[s.key]; len(v)+len(b) <= valueBound(s.key) {
			s.vals[s.key] = append(v, b...)
		} else {
			s.long[s.key] = true
		}
	}
}

// keyOf returns the index of the key of head that name (a key's string as
// the JSON gives it, closing quote included) names, or -1.
func keyOf(name []byte) int {
	var buf [len("max_completion_tokens") + 1]byte
	key, ok := unescapeKey(buf[:0], name[:max(len(name)-1, 0)])
	if !ok {
		return -1
	}
	for k, n := range headKeyNames {
		if string(key) == n {
			return k
		}
	}
	return -1
}

// unescapeKey appends to dst the key that raw (a key's string between its
// quotes) names, if it is ASCII of at most cap(dst) bytes: the keys of head
// are, and nothing else is looked for.
func unescapeKey(dst, raw []byte) ([]byte, bool) {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '\\' {
			if i+5 >= len(raw) || raw[i+1] != 'u' {
				return dst, false
			}
			r, ok := hex4(raw[i+2 : i+6])
			if !ok || r >= 0x80 {
				return dst, false
			}
			c, i = byte(r), i+5
		}
		if len(dst) == cap(dst) {
			return dst, false
		}
		dst = append(dst, c)
	}
	return dst, true
}

// hex4 reads 4 hex digits.
func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// head decodes the values kept, once the body is scanned.
func (s *headScanner) head() (head, error) {
	if s.err != nil {
		return head{}, s.err
	}
	if s.state != scanDone {
		return head{}, errNotAnObject // it ended early
	}
	var h head
	if v := s.vals[keyModel]; len(v) > 0 && string(v) != "null" {
		h.BadModel = s.long[keyModel] || json.Unmarshal(v, &h.Model) != nil || len(h.Model) > maxModelName
		if h.BadModel {
			h.Model = ""
		}
	}
	h.MaxTokens = s.integer(keyMaxTokens)
	h.MaxCompletionTokens = s.integer(keyMaxCompletionTokens)
	return h, nil
}

// integer returns the value kept of key k as an int, 0 if it is not one.
func (s *headScanner) integer(k int) int {
	var n int
	if s.long[k] || len(s.vals[k]) == 0 || json.Unmarshal(s.vals[k], &n) != nil {
		return 0
	}
	return n
}
