package tiktoken

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// truth is testdata/truth.json, written by testdata/reference.mjs with
// OpenAI's own tokenizer.
type truth struct {
	Tokenizer string `json:"tokenizer"`
	Requests  map[string]struct {
		SHA256       string `json:"sha256"`
		Encoding     string `json:"encoding"`
		PromptTokens int    `json:"prompt_tokens"`
	} `json:"requests"`
	Strings []struct {
		Text   string `json:"text"`
		O200k  int    `json:"o200k_base"`
		Cl100k int    `json:"cl100k_base"`
	} `json:"strings"`
}

func readTruth(t testing.TB) truth {
	t.Helper()
	data, err := os.ReadFile("testdata/truth.json")
	require.NoError(t, err)
	var tr truth
	require.NoError(t, json.Unmarshal(data, &tr))
	require.NotEmpty(t, tr.Requests)
	require.NotEmpty(t, tr.Strings)
	return tr
}

// count returns the tokens of s as a counter counts them, and its cuts.
func count(enc *encoding, s string) (tokens, hardCuts int) {
	k := newCounter(enc)
	k.add(s)
	return k.total(), k.hardCuts
}

// TestStringsAsOpenAICounts compares the Go tokenizer with OpenAI's on
// edge cases of the splitting patterns, whole and cut into chunks of many
// sizes: where no chunk was cut hard the counts must be equal.
//
// They are not for a run of whitespace that holds a line break, then
// spaces or tabs, then another line break ("\n  \n"): OpenAI's tokenizer
// makes one piece of it up to its last line break, and the matcher that
// tokenizer v0.10.0 generated for its pattern (codec/regexp.gen.go; the
// regexp2 interpreter matches as OpenAI's does) stops at each line break,
// so the Go count is higher, by about a token a line.
func TestStringsAsOpenAICounts(t *testing.T) {
	tr := readTruth(t)
	defer func(m int) { maxChunk = m }(maxChunk)
	for _, v := range tr.Strings {
		for _, tc := range []struct {
			enc  *encoding
			want int
		}{{o200k, v.O200k}, {cl100k, v.Cl100k}} {
			whole, err := tc.enc.get().Count(v.Text)
			require.NoError(t, err)
			if brokenLines.MatchString(v.Text) {
				assert.GreaterOrEqual(t, whole, tc.want, "%s, whole: %.40q", tc.enc.name, v.Text)
				assert.LessOrEqual(t, whole, 2*tc.want+1, "%s, whole: %.40q", tc.enc.name, v.Text)
				t.Logf("%s: %.20q: %d tokens, OpenAI's %d", tc.enc.name, v.Text, whole, tc.want)
				continue
			}
			assert.Equal(t, tc.want, whole, "%s, whole: %.40q", tc.enc.name, v.Text)
			for _, size := range []int{4, 7, 16, 64, 256, 1 << 20} {
				maxChunk = size
				got, hard := count(tc.enc, v.Text)
				if hard == 0 {
					assert.Equal(t, tc.want, got, "%s, chunks of %d: %.40q", tc.enc.name, size, v.Text)
				} else {
					// A hard cut may split a piece: a token or so each.
					assert.InDelta(t, tc.want, got, float64(2*hard), "%s, chunks of %d, %d hard cuts: %.40q", tc.enc.name, size, hard, v.Text)
				}
			}
		}
	}
}

// brokenLines matches the whitespace the Go tokenizer splits otherwise than
// OpenAI's.
var brokenLines = regexp.MustCompile(`[\r\n][ \t\f\v]+[\r\n]`)

func TestCut(t *testing.T) {
	for _, tc := range []struct {
		s    string
		max  int
		n    int
		hard bool
	}{
		{"short", 10, 5, false},
		{"hello world", 8, 5, false},     // before the space
		{"hello, world", 8, 5, false},    // before the comma
		{"it's", 3, 3, true},             // not before an apostrophe: no other cut, so a hard one
		{"ab  cd", 4, 2, false},          // after a letter only
		{"e\u0301e\u0301 x", 5, 4, true}, // not before a combining mark, nor after one (no letter)
		{"éé x", 5, 4, false},            // after a letter of two bytes
		{"      x", 4, 4, true},
		{"日本語。日本語", 12, 9, false}, // before the ideographic full stop
		{"日本語", 4, 3, true},       // at a rune's boundary
		{"😀", 2, 4, true},         // one rune, longer than max
	} {
		n, hard := cut(tc.s, tc.max)
		assert.Equal(t, tc.n, n, "%q in %d", tc.s, tc.max)
		assert.Equal(t, tc.hard, hard, "%q in %d", tc.s, tc.max)
		assert.True(t, utf8.ValidString(tc.s[:n]), "%q in %d", tc.s, tc.max)
	}
}

// FuzzCut checks cut's claim against the tokenizer: text cut only where a
// piece starts counts as it does whole.
func FuzzCut(f *testing.F) {
	for _, s := range []string{"hello world", "it's they're", "日本語、テキスト", "a1 b2,c3\nd4", "x\u0301y\u0302 z", "IT'S OK.", "1,234.5e6"} {
		f.Add(s, uint8(5))
	}
	f.Fuzz(func(t *testing.T, s string, size uint8) {
		if !utf8.ValidString(s) || len(s) > 4096 {
			return
		}
		defer func(m int) { maxChunk = m }(maxChunk)
		maxChunk = int(size%64) + 4
		for _, enc := range []*encoding{o200k, cl100k} {
			whole, err := enc.get().Count(s)
			require.NoError(t, err)
			got, hard := count(enc, s)
			if hard == 0 {
				require.Equal(t, whole, got, "%s, chunks of %d: %q", enc.name, maxChunk, s)
			}
		}
	})
}

// TestMaxText pins the bound on what one request tokenizes: the rest is
// counted at the rate of what was.
func TestMaxText(t *testing.T) {
	defer func(m int) { maxText = m }(maxText)
	maxText = 1000
	k := newCounter(o200k)
	k.add(strings.Repeat("The quick brown fox. ", 100)) // 2,100 bytes, 5 tokens per 21
	k.add("more text")
	assert.Equal(t, 1000, k.tokenized)
	assert.Equal(t, 1109, k.skipped)
	assert.InDelta(t, 5*2109/21, k.total(), 3)

	k = newCounter(o200k)
	k.add(strings.Repeat("é", 600)) // a cut inside a rune moves back to its start
	assert.Equal(t, 1000, k.tokenized)
	assert.Equal(t, 200, k.skipped)
}

// TestHostileWhitespace pins the bound on the tokenizer's quadratic case:
// 8 MiB of " \n" (whole, hours) is tokenized in chunks within maxText.
func TestHostileWhitespace(t *testing.T) {
	s := strings.Repeat(" \n", 4<<20)
	k := newCounter(o200k)
	k.add(s)
	assert.Equal(t, maxText, k.tokenized)
	assert.Equal(t, len(s)-maxText, k.skipped)
	// OpenAI's tokenizer counts a token per 2 pairs, this one a token per
	// pair (see TestStringsAsOpenAICounts).
	assert.Equal(t, len(s)/2, k.total())
}

func TestInvalidUTF8(t *testing.T) {
	got, _ := count(o200k, "a\xffb")
	want, _ := count(o200k, "a\uFFFDb")
	assert.Equal(t, want, got)
}

func TestEncodingFor(t *testing.T) {
	for model, want := range map[string]*encoding{
		"gpt-4o": o200k, "gpt-4o-mini": o200k, "gpt-4o-2024-08-06": o200k, "chatgpt-4o-latest": o200k,
		"gpt-4.1": o200k, "gpt-4.1-nano": o200k, "gpt-4.5-preview": o200k, "gpt-5": o200k, "gpt-5-mini": o200k,
		"o1": o200k, "o3-mini": o200k, "o4-mini": o200k, "": o200k, "my-azure-deployment": o200k, "llama-3-70b": o200k,
		"gpt-4": cl100k, "gpt-4-0613": cl100k, "gpt-4-turbo": cl100k, "gpt-4-32k": cl100k, "GPT-4": cl100k,
		"gpt-3.5-turbo": cl100k, "gpt-35-turbo": cl100k, "ft:gpt-4-0613:acme::8abc": cl100k, "openai/gpt-4": cl100k,
		"openai/gpt-4o": o200k, "ft:gpt-4o-mini:acme::x": o200k,
	} {
		assert.Equal(t, want.name, encodingFor(model).name, model)
	}
}

func TestTileTokens(t *testing.T) {
	// OpenAI's vision guide: 1024 x 1024 costs 765 tokens, 2048 x 4096
	// costs 1,105.
	assert.Equal(t, 765, tileTokens(1024, 1024))
	assert.Equal(t, 1105, tileTokens(2048, 4096))
	assert.Equal(t, 255, tileTokens(512, 512), "not scaled up")
	assert.Equal(t, 1445, tileTokens(768, 2048), "the most")
	assert.Equal(t, 765, tileTokens(1, 1<<30), "a sliver: scaled into 2048, 4 tiles")
	assert.Equal(t, imageBase+imageTile*imageMaxTiles, imageTokens("https://example.com/a.png", ""), "unknown size: the most")
	assert.Equal(t, 85, imageTokens("https://example.com/a.png", "low"))
	assert.Equal(t, 1445, imageTokens("data:image/png;base64,!!!!", "high"), "undecodable")
	assert.Equal(t, 1445, imageTokens("data:image/png,rawbytes", "high"), "not base64")
}
