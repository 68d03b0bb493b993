package tiktoken

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"
)

// What OpenAI's cookbook counts around tool definitions, besides the
// encoding's funcInit per function: 3 before a function's properties, 3 per
// property, 3 per enum value less 3 per enum, and 12 after the last
// function.
const (
	propInit = 3
	propKey  = 3
	enumInit = -3
	enumItem = 3
	funcEnd  = 12
)

// maxSchemaDepth bounds how deep nested properties are followed.
const maxSchemaDepth = 16

// request is the part of a chat completion request that is counted. What
// may have any shape is kept raw and read leniently: a part of the request
// this package cannot read counts nothing, and the rest still counts.
type request struct {
	Model               string            `json:"model"`
	Messages            []message         `json:"messages"`
	MaxTokens           json.RawMessage   `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage   `json:"max_completion_tokens"`
	Tools               []json.RawMessage `json:"tools"`
	Functions           []json.RawMessage `json:"functions"`
}

type message struct {
	Role         json.RawMessage   `json:"role"`
	Name         json.RawMessage   `json:"name"`
	Content      json.RawMessage   `json:"content"`
	ToolCalls    []json.RawMessage `json:"tool_calls"`
	FunctionCall json.RawMessage   `json:"function_call"`
}

// readRequest decodes the chat completion request r carries, from a copy
// of its body.
func readRequest(r *http.Request) (request, bool) {
	if r.GetBody == nil || r.Body == nil || r.Body == http.NoBody {
		return request{}, false
	}
	body, err := r.GetBody()
	if err != nil {
		return request{}, false
	}
	defer body.Close()
	var req request
	if err := json.NewDecoder(body).Decode(&req); err != nil || len(req.Messages) == 0 {
		return request{}, false
	}
	return req, true
}

// tokens estimates the request's prompt with enc, plus its completion.
func (req *request) tokens(enc *encoding) int {
	k := newCounter(enc)
	fixed := replyPriming
	for _, m := range req.Messages {
		fixed += tokensPerMessage
		k.add(str(m.Role))
		if name := str(m.Name); name != "" {
			k.add(name)
			fixed += tokensPerName
		}
		fixed += content(k, m.Content)
		for _, raw := range m.ToolCalls {
			var call struct {
				Function json.RawMessage `json:"function"`
			}
			if json.Unmarshal(raw, &call) == nil {
				functionCall(k, call.Function)
			}
		}
		functionCall(k, m.FunctionCall)
	}
	var functions []*functionDef
	for _, raw := range req.Tools {
		var tool struct {
			Function *functionDef `json:"function"`
		}
		if decode(raw, &tool) && tool.Function != nil {
			functions = append(functions, tool.Function)
		}
	}
	for _, raw := range req.Functions {
		var f functionDef
		if decode(raw, &f) {
			functions = append(functions, &f)
		}
	}
	if len(functions) > 0 {
		for _, f := range functions {
			fixed += function(k, f)
		}
		fixed += funcEnd
	}
	return total(k.total(), fixed, completion(integer(req.MaxTokens), integer(req.MaxCompletionTokens)))
}

// content counts a message's content, a string or an array of parts: the
// text of text and refusal parts goes to k, and it returns the images'
// tokens.
func content(k *counter, raw json.RawMessage) (images int) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		k.add(s)
		return 0
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return 0
	}
	for _, raw := range parts {
		var p struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			Refusal  string `json:"refusal"`
			ImageURL struct {
				URL    string `json:"url"`
				Detail string `json:"detail"`
			} `json:"image_url"`
		}
		if json.Unmarshal(raw, &p) != nil {
			continue
		}
		switch p.Type {
		case "text":
			k.add(p.Text)
		case "refusal":
			k.add(p.Refusal)
		case "image_url":
			images = total(images, imageTokens(p.ImageURL.URL, p.ImageURL.Detail))
		}
	}
	return images
}

// functionCall counts an assistant's call of a function: its name and its
// arguments, as the model wrote them.
func functionCall(k *counter, raw json.RawMessage) {
	var f struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &f) != nil {
		return
	}
	k.add(f.Name)
	k.add(f.Arguments)
}

// functionDef is a function's definition, decoded once, nested schemas
// and all (see schema).
type functionDef struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Parameters  *schema `json:"parameters"`
}

// function counts a function's definition as the cookbook does: its name
// and description (less a final period), then each property's name, type
// and description, and the values of its enum. It returns the overheads;
// the text goes to k.
func function(k *counter, f *functionDef) (fixed int) {
	k.addJoined(f.Name, ":", strings.TrimSuffix(f.Description, "."))
	return k.enc.funcInit + properties(k, f.Parameters, 0)
}

// decode decodes raw into v, as far as it can: a value of another type
// than its field's (a description that is a number, properties that are
// an array) leaves that field empty and the others read, as
// encoding/json's Unmarshal does before it reports an
// *json.UnmarshalTypeError. It reports false for raw that is not JSON.
func decode(raw json.RawMessage, v any) bool {
	if len(raw) == 0 {
		return false
	}
	err := json.Unmarshal(raw, v)
	var typeErr *json.UnmarshalTypeError
	return err == nil || errors.As(err, &typeErr)
}

// schema is the part of a JSON schema the cookbook counts, and the schemas
// nested in it, decoded once with the function that holds them: a 17 MB
// schema decoded again at each level of its nesting took 2.8 to 4 s and
// 834 MiB.
type schema struct {
	Type        json.RawMessage    `json:"type"`
	Description string             `json:"description"`
	Enum        []json.RawMessage  `json:"enum"`
	Properties  map[string]*schema `json:"properties"`
	Items       *schema            `json:"items"`
}

// properties counts the properties of the object schema s, and those of
// the objects nested in them (the cookbook counts one level; this counts
// the others the same way, maxSchemaDepth of them).
func properties(k *counter, s *schema, depth int) (fixed int) {
	if s == nil || depth > maxSchemaDepth || len(s.Properties) == 0 {
		return 0
	}
	fixed = propInit
	for key, p := range s.Properties {
		if p == nil {
			p = &schema{} // "key": null, a property with nothing to count but its name
		}
		fixed += propKey
		if len(p.Enum) > 0 {
			fixed += enumInit
			for _, item := range p.Enum {
				fixed += enumItem
				k.add(strOrJSON(item))
			}
		}
		k.addJoined(key, ":", typeName(p.Type), ":", strings.TrimSuffix(p.Description, "."))
		fixed = total(fixed, properties(k, p, depth+1), properties(k, p.Items, depth+1))
	}
	return fixed
}

// typeName returns a schema's type: a name, or names joined by "|".
func typeName(raw json.RawMessage) string {
	if s := str(raw); s != "" {
		return s
	}
	var names []string
	if json.Unmarshal(raw, &names) == nil {
		return strings.Join(names, "|")
	}
	return ""
}

// str returns raw as a string, "" if it is not one.
func str(raw json.RawMessage) string {
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' &&
		bytes.IndexByte(raw[1:n-1], '\\') < 0 && bytes.IndexByte(raw[1:n-1], '"') < 0 && utf8.Valid(raw) {
		return string(raw[1 : n-1]) // nothing to unescape or replace: what Unmarshal would give
	}
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// strOrJSON returns raw as a string if it is one, else its JSON text.
func strOrJSON(raw json.RawMessage) string {
	if s := str(raw); s != "" {
		return s
	}
	return string(raw)
}

// integer returns raw as an int, 0 if it is not one: llmclient's rule then
// gives the completion its default.
func integer(raw json.RawMessage) int {
	var n int
	if len(raw) == 0 || json.Unmarshal(raw, &n) != nil {
		return 0
	}
	return n
}
