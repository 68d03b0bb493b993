package llmclient

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeHead reads the head of body as a JSON decoder does, the reference
// scanHead is held to: the top-level keys, exactly as named, the last value
// of each.
func decodeHead(body []byte) (head, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return head{}, false
	}
	var vals [headKeys]json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return head{}, false
		}
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return head{}, false
		}
		for k, name := range headKeyNames {
			if t == name {
				vals[k] = v
			}
		}
	}
	var h head
	if v := vals[keyModel]; v != nil && string(v) != "null" {
		h.BadModel = json.Unmarshal(v, &h.Model) != nil || len(h.Model) > maxModelName
		if h.BadModel {
			h.Model = ""
		}
	}
	for k, n := range map[int]*int{keyMaxTokens: &h.MaxTokens, keyMaxCompletionTokens: &h.MaxCompletionTokens} {
		if json.Unmarshal(vals[k], n) != nil {
			*n = 0
		}
	}
	return h, true
}

// headSeeds are bodies scanHead must read as decodeHead does, and the
// fuzz target's seeds.
var headSeeds = []string{
	`{"model":"gpt-4.1","messages":[]}`,
	`{"messages":[{"role":"user","content":"hi, \"model\": \"x\""}],"model":"gpt-4.1-mini","max_tokens":100}`,
	`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}],"model":"gpt-4.1"}`,
	`{"model":"a","model":"b"}`,
	`{"model":"gpt-4.1","model":null}`,
	`{"model":7,"model":"gpt-4.1"}`,
	`{"model":"gpt-4.1","model":7}`,
	`{"\u006dodel":"gpt-4\u002e1","max_\u0074okens":12}`,
	`{"Model":"gpt-4.1","MAX_TOKENS":5}`,
	`{"model":"a\\\"b\\\\","max_completion_tokens":-3}`,
	`{"model":{"name":"gpt-4.1"},"max_tokens":"100"}`,
	`{"model":["gpt-4.1"],"max_tokens":1e3}`,
	`{"max_tokens":99999999999999999999999,"max_completion_tokens":1.5}`,
	`{"model":"` + strings.Repeat("m", maxModelName) + `"}`,
	`{"model":"` + strings.Repeat("m", maxModelName+1) + `"}`,
	`{"model":"` + strings.Repeat(`\u006d`, maxModelName) + `"}`,
	`{"model":"\ud83d\ude00","x":[true,false,null,-0.5e-3,{}]}`,
	` { "model" : "m" , "stream" : true } `,
	`{}`,
	`{"a":{"model":"inner"},"b":["model","x"]}`,
	`{"model":"m"}trailing`,
	`{"model":"m",}`,
	`{"model" "m"}`,
	`{"model":"m"`,
	`{"model":"m\`,
	`{"model":tru"e"}`,
	`["model","m"]`,
	`"model"`,
	``,
	`{"mod\el":"m"}`,
	`{"\u00e9":"m","\uZZZZ":1,"model":"\u00e9"}`,
}

// TestScanHead: scanHead reads what a JSON decoder reads of the head,
// wherever its keys sit, and refuses what is not a JSON object.
func TestScanHead(t *testing.T) {
	for _, body := range headSeeds {
		want, valid := decodeHead([]byte(body))
		valid = valid && json.Valid([]byte(body))
		for _, r := range []io.Reader{strings.NewReader(body), iotest.OneByteReader(strings.NewReader(body))} {
			got, err := scanHead(r, -1)
			if valid {
				require.NoError(t, err, body)
				assert.Equal(t, want, got, body)
			} else if json.Valid([]byte(body)) {
				assert.Error(t, err, "%s: valid JSON, not an object", body)
			}
		}
	}
	got, err := scanHead(strings.NewReader(`{"model":"m"}trailing`), -1)
	require.NoError(t, err, "what follows the object is not read")
	assert.Equal(t, "m", got.Model)
	for _, body := range []string{`{"model":"m",}`, `{"model" "m"}`, `{"model":"m"`, `["model","m"]`, ``, `{"model":tru"e"}`} {
		_, err := scanHead(strings.NewReader(body), -1)
		assert.ErrorIs(t, err, errNotAnObject, body)
	}
}

// TestScanHeadPastItsBound: a body past 64 MiB is not read to its end.
func TestScanHeadPastItsBound(t *testing.T) {
	body := `{"messages":[{"content":"` + strings.Repeat("x", maxHeadBody) + `"}],"model":"gpt-4.1"}`
	_, err := scanHead(strings.NewReader(body), -1)
	assert.ErrorIs(t, err, errHeadTooBig)
	h, err := scanHead(strings.NewReader(body[len(body)-maxHeadBody:]), -1)
	assert.ErrorIs(t, err, errNotAnObject, "the tail is no object")
	assert.Empty(t, h.Model)
}

// FuzzScanHead: on a JSON object, scanHead reads what a JSON decoder
// reads; on anything else it returns, with no model longer than a model's
// name may be, whatever the chunks the body comes in.
func FuzzScanHead(f *testing.F) {
	for _, s := range headSeeds {
		f.Add([]byte(s), uint16(0))
	}
	f.Fuzz(func(t *testing.T, body []byte, chunk uint16) {
		var r io.Reader = bytes.NewReader(body)
		size := int64(len(body)) // as http.NewRequest sets ContentLength
		if chunk > 0 {
			r, size = &chunkReader{b: body, n: int(chunk)}, -1
		}
		got, err := scanHead(r, size)
		if want, ok := decodeHead(body); ok && json.Valid(body) {
			require.NoError(t, err)
			require.Equal(t, want, got)
			return
		}
		require.LessOrEqual(t, len(got.Model), maxModelName)
		if json.Valid(body) {
			require.Error(t, err, "valid JSON, not an object")
		}
	})
}

// chunkReader gives b n bytes a Read.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[n:]
	return n, nil
}
