package tiktoken

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer/codec"
)

// encoding is one of the two encodings of OpenAI's chat models, its
// vocabulary (compiled into the binary) loaded on first use.
type encoding struct {
	name string
	// funcInit is what the cookbook counts at the start of each tool
	// definition, which differs between the encodings' model families.
	funcInit int
	load     func() *codec.Codec
	once     sync.Once
	codec    *codec.Codec
}

var (
	o200k  = &encoding{name: "o200k_base", funcInit: 7, load: codec.NewO200kBase}
	cl100k = &encoding{name: "cl100k_base", funcInit: 10, load: codec.NewCl100kBase}
)

// get returns the encoding's codec, loading it once. A codec is safe for
// concurrent use: its vocabulary is only read, and its regular expression
// (regexp2) takes a runner from a pool for each match.
func (e *encoding) get() *codec.Codec {
	e.once.Do(func() { e.codec = e.load() })
	return e.codec
}

// maxChunk bounds the bytes given to the tokenizer at once. The tokenizer
// splits text into pieces with a backtracking regular expression whose time
// is quadratic in a run of mixed whitespace (" \n" 32,768 times took 5 s
// whole, 0.7 s as 256-byte chunks per MiB), so text is tokenized in chunks,
// cut where a piece starts anyway (see cut). A variable for the tests.
var maxChunk = 256

// maxText bounds the bytes of text of one request that are tokenized, so
// that a request costs at most about 0.1 to 0.3 s at the tokenizer's
// slowest (hostile whitespace; prose goes 5 times faster) on a loaded
// 2-core machine. Text past it is counted at the rate of the text tokenized
// before it. 256 KiB is about 60,000 tokens of English. A variable for the
// tests.
var maxText = 256 << 10

// counter counts the tokens of one request's text, within maxText.
type counter struct {
	enc *encoding
	// left is what remains of maxText.
	left int
	// tokens are those of the bytes tokenized; skipped is the bytes of
	// text past maxText, counted at the rate tokens/tokenized.
	tokens, tokenized, skipped int
	// hardCuts counts the chunks cut where a piece might not start: a
	// run of maxChunk bytes without a letter or digit followed by
	// punctuation or space. Each may change the count by a token or so.
	hardCuts int
}

func newCounter(enc *encoding) *counter {
	return &counter{enc: enc, left: maxText}
}

// add counts the tokens of s. It cuts s to what is left of maxText before
// anything else, then tokenizes it a chunk at a time, each chunk made valid
// UTF-8 (see count) on its own: text past maxText is neither read nor
// copied, however much of it there is, and no more than a chunk is ever
// cleaned at once.
func (k *counter) add(s string) {
	if len(s) > k.left {
		n := k.left
		for back := 0; back < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(s[n]); back++ {
			n-- // to the start of the rune maxText cuts, if s is valid there
		}
		k.skipped += len(s) - n
		s = s[:n]
	}
	k.left -= len(s)
	k.tokenized += len(s)
	for len(s) > 0 {
		n, hard := cut(s, maxChunk)
		if hard {
			k.hardCuts++
		}
		k.tokens += k.count(s[:n])
		s = s[n:]
	}
}

// addJoined counts the tokens of parts joined, which it joins only if any
// of them is to be tokenized.
func (k *counter) addJoined(parts ...string) {
	if k.left > 0 {
		k.add(strings.Join(parts, ""))
		return
	}
	for _, p := range parts {
		k.skipped += len(p)
	}
}

// count returns the tokens of a chunk, its invalid UTF-8 replaced first as
// strings.ToValidUTF8 does (a run of invalid bytes by one U+FFFD).
func (k *counter) count(chunk string) int {
	if !utf8.ValidString(chunk) {
		chunk = strings.ToValidUTF8(chunk, "\uFFFD")
	}
	t, err := k.enc.get().Count(chunk)
	if err != nil { // only in the codec's strict mode, never set here
		t = (len(chunk) + 3) / 4
	}
	return t
}

// total returns the tokens counted, the text past maxText at the rate of
// the text before it.
func (k *counter) total() int {
	if k.skipped == 0 {
		return k.tokens
	}
	if k.tokenized == 0 {
		return k.tokens + (k.skipped+3)/4
	}
	return k.tokens + int((int64(k.skipped)*int64(k.tokens)+int64(k.tokenized)-1)/int64(k.tokenized))
}

// cut returns the length of the first chunk of s, at most max bytes (at
// least one rune), and whether it was cut where a piece might not start.
//
// Both encodings' patterns split text into pieces none of which holds a
// letter or digit followed by anything but a letter, digit, mark or an
// apostrophe (a contraction: "'s"), and they look behind nothing. So where
// a letter or digit is followed by any other character (a space, a line
// break, punctuation, a symbol), the piece that holds the letter ends and
// the next one starts, whatever follows: tokenizing the text on each side
// of such a cut on its own gives the same tokens as tokenizing it whole.
// FuzzCut checks this against the tokenizer.
func cut(s string, max int) (n int, hard bool) {
	if len(s) <= max {
		return len(s), false
	}
	end := max
	for back := 0; back < utf8.UTFMax-1 && end > 0 && !utf8.RuneStart(s[end]); back++ {
		end-- // to the start of the rune max cuts, if s is valid UTF-8 there
	}
	if end == 0 { // max is shorter than the first rune
		_, size := utf8.DecodeRuneInString(s)
		return size, true
	}
	for i := end; i > 0; {
		next, _ := utf8.DecodeRuneInString(s[i:])
		prev, size := utf8.DecodeLastRuneInString(s[:i])
		if (unicode.IsLetter(prev) || unicode.IsNumber(prev)) &&
			!unicode.IsLetter(next) && !unicode.IsNumber(next) && !unicode.IsMark(next) && next != '\'' {
			return i, false
		}
		i -= size
	}
	return end, true
}
