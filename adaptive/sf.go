package adaptive

import (
	"strconv"
	"strings"
	"time"
)

// This file parses what the IETF RateLimit fields need of Structured Field
// Values (RFC 9651): Lists of Items with Parameters, whose bare items are
// Integers, Decimals, Strings, Tokens, Byte Sequences and Booleans. Unlike
// RFC 9651, which fails a whole field on one error, a malformed member is
// skipped and the others kept; Inner Lists, Dates and Display Strings,
// which the fields do not use, count as malformed.

// sfKind is the type of a bare item.
type sfKind uint8

const (
	sfInteger sfKind = iota + 1
	sfDecimal
	sfString
	sfToken
	sfBytes
	sfBoolean
)

// sfValue is a bare item: num holds an Integer (exactly: at most 15
// digits), a Decimal or a Boolean (0 or 1); str a String (unescaped), a
// Token, or a Byte Sequence (as written, in base64, not decoded).
type sfValue struct {
	kind sfKind
	num  float64
	str  string
}

// text returns v's text if it is a String or a Token, else "".
func (v sfValue) text() (string, bool) {
	if v.kind != sfString && v.kind != sfToken {
		return "", false
	}
	return v.str, true
}

// isCount reports whether v is an Integer of zero or more.
func (v sfValue) isCount() bool { return v.kind == sfInteger && v.num >= 0 }

// seconds returns v, an Integer of zero or more, as that many seconds, if
// that is shorter than maxDuration.
func (v sfValue) seconds() (time.Duration, bool) {
	if !v.isCount() || v.num >= float64(maxDuration/time.Second) {
		return 0, false
	}
	return time.Duration(v.num) * time.Second, true
}

type sfParam struct {
	key string
	val sfValue
}

// sfItem is a member of a List: a bare item and its parameters.
type sfItem struct {
	sfValue
	params []sfParam
}

// param returns the value of its parameter key (the last, if repeated).
func (it sfItem) param(key string) (sfValue, bool) {
	for i := len(it.params) - 1; i >= 0; i-- {
		if it.params[i].key == key {
			return it.params[i].val, true
		}
	}
	return sfValue{}, false
}

// parseLines returns the Items of the List split over lines.
func parseLines(lines []string) []sfItem {
	var items []sfItem
	for _, l := range lines {
		items = parseList(l, items)
	}
	return items
}

// parseList appends to dst the Items of the List s, skipping the members
// that are malformed or not Items.
func parseList(s string, dst []sfItem) []sfItem {
	s = strings.TrimLeft(s, " ")
	for s != "" {
		it, rest, ok := parseItem(s)
		if ok {
			rest = trimOWS(rest)
			ok = rest == "" || rest[0] == ','
		}
		if ok {
			dst = append(dst, it)
		} else {
			rest = skipMember(s)
		}
		if rest == "" {
			break
		}
		s = trimOWS(rest[1:]) // after the comma
	}
	return dst
}

// skipMember returns what follows the member s starts with, from the comma
// that ends it, or "" if none does; a comma inside a String does not.
func skipMember(s string) string {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				return s[i:]
			}
		}
	}
	return ""
}

func trimOWS(s string) string { return strings.TrimLeft(s, " \t") }

// parseItem parses the Item s starts with and returns what follows it.
func parseItem(s string) (sfItem, string, bool) {
	v, s, ok := parseBare(s)
	if !ok {
		return sfItem{}, "", false
	}
	it := sfItem{sfValue: v}
	for s != "" && s[0] == ';' {
		s = strings.TrimLeft(s[1:], " ")
		n := 0
		for n < len(s) && isKeyChar(s[n], n == 0) {
			n++
		}
		if n == 0 {
			return sfItem{}, "", false
		}
		p := sfParam{key: s[:n], val: sfValue{kind: sfBoolean, num: 1}}
		s = s[n:]
		if s != "" && s[0] == '=' {
			if p.val, s, ok = parseBare(s[1:]); !ok {
				return sfItem{}, "", false
			}
		}
		it.params = append(it.params, p)
	}
	return it, s, true
}

// parseBare parses the bare item s starts with and returns what follows it.
func parseBare(s string) (sfValue, string, bool) {
	if s == "" {
		return sfValue{}, "", false
	}
	switch c := s[0]; {
	case c == '-' || isDigit(c):
		return parseNumber(s)
	case c == '"':
		return parseString(s)
	case c == ':':
		return parseBytes(s)
	case c == '?':
		return parseBoolean(s)
	case isAlpha(c) || c == '*':
		return parseToken(s)
	}
	return sfValue{}, "", false
}

// parseBytes parses the Byte Sequence s starts with: base64 characters
// between colons, kept as written.
func parseBytes(s string) (sfValue, string, bool) {
	end := 1
	for end < len(s) && isBase64(s[end]) {
		end++
	}
	if end == len(s) || s[end] != ':' {
		return sfValue{}, "", false
	}
	return sfValue{kind: sfBytes, str: s[1:end]}, s[end+1:], true
}

// parseBoolean parses the Boolean s starts with: ?0 or ?1.
func parseBoolean(s string) (sfValue, string, bool) {
	if len(s) < 2 || s[1] != '0' && s[1] != '1' {
		return sfValue{}, "", false
	}
	return sfValue{kind: sfBoolean, num: float64(s[1] - '0')}, s[2:], true
}

// parseToken parses the Token s starts with, whose first byte parseBare
// has checked (a letter or *): as many token characters as follow.
func parseToken(s string) (sfValue, string, bool) {
	end := 1
	for end < len(s) && isTokenChar(s[end]) {
		end++
	}
	return sfValue{kind: sfToken, str: s[:end]}, s[end:], true
}

// parseNumber parses the Integer or Decimal s starts with: an optional
// minus, at most 15 digits, or at most 12 then a point and 1 to 3 more.
func parseNumber(s string) (sfValue, string, bool) {
	start := 0
	if s[0] == '-' {
		start = 1
	}
	whole := digits(s[start:])
	end := start + whole
	v := sfValue{kind: sfInteger}
	switch {
	case whole == 0:
		return sfValue{}, "", false
	case end < len(s) && s[end] == '.':
		frac := digits(s[end+1:])
		if whole > 12 || frac < 1 || frac > 3 {
			return sfValue{}, "", false
		}
		end += 1 + frac
		v.kind = sfDecimal
	case whole > 15:
		return sfValue{}, "", false
	}
	v.num, _ = strconv.ParseFloat(s[start:end], 64) // no error: at most 15 digits
	if start == 1 {
		v.num = -v.num
	}
	return v, s[end:], true
}

// parseString parses the String s starts with: printable ASCII between
// double quotes, where a backslash escapes only a double quote or itself.
func parseString(s string) (sfValue, string, bool) {
	escaped := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || s[i] != '"' && s[i] != '\\' {
				return sfValue{}, "", false
			}
			escaped = true
		case c == '"':
			str := s[1:i]
			if escaped {
				str = unescape(str)
			}
			return sfValue{kind: sfString, str: str}, s[i+1:], true
		case c < 0x20 || c > 0x7e:
			return sfValue{}, "", false
		}
	}
	return sfValue{}, "", false // unterminated
}

// unescape removes the backslashes of s, a valid String's content.
func unescape(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isBase64(c byte) bool { return isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=' }

// isKeyChar reports whether c may be in a parameter key (lower case letters,
// digits, "_-.*"), first says if at its start (a letter or "*").
func isKeyChar(c byte, first bool) bool {
	if 'a' <= c && c <= 'z' || c == '*' {
		return true
	}
	return !first && (isDigit(c) || c == '_' || c == '-' || c == '.')
}

// isTokenChar reports whether c may follow a Token's first character: a
// tchar (RFC 9110), ":" or "/".
func isTokenChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
