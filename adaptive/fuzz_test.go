package adaptive

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"
)

var fuzzNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// FuzzParse: whatever the status and headers, Parse does not panic and its
// Feedback keeps the documented invariants. The header block is one
// "Key: value" a line.
func FuzzParse(f *testing.F) {
	for _, s := range []struct {
		status int
		block  string
	}{
		{200, ""},
		{200, "Content-Type: application/json\nDate: Fri, 01 May 2026 12:00:00 GMT"},
		{200, "x-ratelimit-limit-requests: 60\nx-ratelimit-limit-tokens: 150000\n" +
			"x-ratelimit-remaining-requests: 59\nx-ratelimit-remaining-tokens: 149984\n" +
			"x-ratelimit-reset-requests: 1s\nx-ratelimit-reset-tokens: 6m0s"},
		{429, "retry-after: 20\nretry-after-ms: 19876.5\nx-ratelimit-remaining-tokens: 0\n" +
			"x-ratelimit-reset-tokens: 1m30.5s\nx-ratelimit-limit-tokens: -1"},
		{200, "anthropic-ratelimit-requests-limit: 4000\nanthropic-ratelimit-requests-remaining: 3201\n" +
			"anthropic-ratelimit-requests-reset: 2026-05-01T12:00:24Z\n" +
			"anthropic-ratelimit-input-tokens-limit: 320000\nanthropic-ratelimit-input-tokens-remaining: 400000\n" +
			"anthropic-ratelimit-input-tokens-reset: 2026-05-01T14:00:02.5+02:00\n" +
			"anthropic-ratelimit-output-tokens-reset: 9999-12-31T23:59:59Z"},
		{529, "retry-after: Fri, 01 May 2026 12:00:05 GMT"},
		{503, "Retry-After: 99999999999999999999"},
		{200, `RateLimit-Policy: "hour";q=1000;w=3600, "day";q=5000;w=86400` + "\n" + `RateLimit: "day";r=100;t=36000`},
		{200, `RateLimit-Policy: "tpm";q=100000;qu="tokens";w=60, "b";q=9;qu="content-bytes";pk=:YQ==:` +
			"\n" + `RateLimit: "tpm";r=5000;t=12, "b";r=1, "x";r=3`},
		{200, "RateLimit-Policy: burst;q=100;w=60,daily;q=1000;w=86400\nRateLimit: daily;r=1;t=7"},
		{200, "RateLimit-Limit: 10, 10;w=1\nRateLimit-Remaining: 25\nRateLimit-Reset: 1777636830"},
		{200, "RateLimit-Reset: 999999999999999"},
		{429, `RateLimit: "a\"b";r=0;t=5` + "\nRateLimit: (1 2), ?1;r=1"},
		{200, "X-RateLimit-Limit: 5000\nX-RateLimit-Remaining: 4999\nX-RateLimit-Reset: 1777636830\nX-RateLimit-Used: 1\nX-RateLimit-Resource: core"},
		{403, "X-RateLimit-Limit: 60\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 1777636830"},
		{403, "Retry-After: 60\nX-RateLimit-Remaining: 12"},
		{403, "X-RateLimit-Remaining: 0\nX-RateLimit-Reset: 99999999999999999999"},
		{429, "X-RateLimit-Limit: 5\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 1777636831.250\nX-RateLimit-Reset-After: 1.250\nX-RateLimit-Bucket: abcd1234"},
		{200, "X-RateLimit-Limit: 100\nX-RateLimit-Remaining: 3\nX-RateLimit-Reset: 20\nRateLimit-Limit: 100\nRateLimit-Remaining: 5\nRateLimit-Reset: 20"},
	} {
		f.Add(s.status, s.block)
	}
	f.Fuzz(func(t *testing.T, status int, block string) {
		h := http.Header{}
		for line := range strings.Lines(block) {
			k, v, _ := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
			h.Add(textproto.CanonicalMIMEHeaderKey(k), strings.Trim(v, " \t"))
		}
		fb := Parse(status, h, fuzzNow)
		_, asked := RetryAfter(h, fuzzNow)
		ghSpent := h.Get("X-Ratelimit-Remaining") != "" && xRateLimit(h, fuzzNow).Remaining == 0
		switch {
		case status == 429 && fb.Class != RateLimited,
			(status == 503 || status == 529) && fb.Class != Overloaded,
			status == 403 && (fb.Class == RateLimited) != (asked || ghSpent),
			status != 429 && status != 503 && status != 529 && status != 403 && fb.Class != Accepted:
			t.Fatalf("status %d: class %v", status, fb.Class)
		case fb.RetryAfter < 0, status < 400 && fb.RetryAfter != 0:
			t.Fatalf("status %d: RetryAfter %v", status, fb.RetryAfter)
		case fb.Quotas != nil && len(fb.Quotas) == 0:
			t.Fatal("empty, non-nil Quotas")
		case fb.Empty() != (fb.Class == Accepted && fb.RetryAfter == 0 && fb.Quotas == nil):
			t.Fatalf("Empty() is %v for %+v", fb.Empty(), fb)
		}
		for dim, q := range fb.Quotas {
			if err := checkQuota(q); err != nil {
				t.Fatalf("%s: %v: %+v", dim, err, q)
			}
		}
	})
}

// checkQuota returns what is wrong with q, a Quota Parse returned.
func checkQuota(q Quota) error {
	switch {
	case q.Limit != 0 && !(q.Limit > 0 && !math.IsInf(q.Limit, 0)):
		return fmt.Errorf("limit %v", q.Limit)
	case q.Remaining != -1 && !(q.Remaining >= 0 && !math.IsInf(q.Remaining, 0)):
		return fmt.Errorf("remaining %v", q.Remaining)
	case q.Limit > 0 && q.Remaining > q.Limit:
		return fmt.Errorf("remaining %v above limit %v", q.Remaining, q.Limit)
	case q.Reset < 0 || q.Reset == maxDuration, q.Window < 0 || q.Window == maxDuration:
		return fmt.Errorf("reset %v, window %v", q.Reset, q.Window)
	case q.Limit == 0 && q.Remaining == -1 && q.Reset == 0 && q.Window == 0:
		return fmt.Errorf("tells nothing")
	}
	return nil
}

// FuzzRetryAfter: RetryAfter neither panics nor returns a negative delay,
// reports none without ok, and reads a number of seconds exactly.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "1", "1.5", "-1", "NaN", "Inf", "1e400", "0x10", "+1", "7000000001",
		"Wed, 21 Oct 2015 07:28:00 GMT", "Sun Nov  6 08:49:37 1994", "soon", "99999999999999999999"} {
		f.Add(s, "")
		f.Add("", s)
	}
	f.Fuzz(func(t *testing.T, ra, raMs string) {
		h := http.Header{}
		if ra != "" {
			h.Set("Retry-After", ra)
		}
		if raMs != "" {
			h.Set("Retry-After-Ms", raMs)
		}
		d, ok := RetryAfter(h, fuzzNow)
		if d < 0 || !ok && d != 0 {
			t.Fatalf("Retry-After %q, retry-after-ms %q: %v, %v", ra, raMs, d, ok)
		}
		if ms, err := strconv.ParseUint(raMs, 10, 64); err == nil {
			want := maxDuration
			if ms <= uint64(maxDuration/time.Millisecond) {
				want = time.Duration(ms) * time.Millisecond
			}
			if !ok || d != want {
				t.Fatalf("retry-after-ms %q: %v, %v; want %v", raMs, d, ok, want)
			}
		}
		if _, _, valid := decimal(raMs); valid {
			return
		}
		if n, err := strconv.ParseUint(ra, 10, 64); err == nil && n <= uint64(maxDuration/time.Second) {
			if !ok || d != time.Duration(n)*time.Second {
				t.Fatalf("Retry-After %q: %v, %v", ra, d, ok)
			}
		}
	})
}

// FuzzGoDuration: goDuration never panics, never returns a negative or
// saturated duration, and agrees with time.ParseDuration (within the
// nanosecond it rounds up where Go truncates) on what both accept.
func FuzzGoDuration(f *testing.F) {
	for _, s := range []string{"1s", "6m0s", "20ms", "1m30.5s", "0s", "2h3m", "59.9s", "1.2ms", "3µs", "0",
		"12", "1.5", "-1s", ".5s", "1.s", "1s30m", "9999999h", "2562047h47m16.854775807s", "0.0000000001ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := goDuration(s)
		if !ok {
			if d != 0 {
				t.Fatalf("%q: %v without ok", s, d)
			}
			return
		}
		if d < 0 || d == maxDuration {
			t.Fatalf("%q: %v", s, d)
		}
		if strings.ContainsAny(s, "-+") {
			t.Fatalf("%q: signed, accepted", s)
		}
		if _, _, bare := decimal(s); bare {
			return // seconds, which time.ParseDuration refuses
		}
		want, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%q: %v, but time.ParseDuration: %v", s, d, err)
		}
		// Go truncates each fraction (by float); we round it up, exactly.
		if diff := d - want; diff < 0 || diff > time.Duration(strings.Count(s, ".")) {
			t.Fatalf("%q: %v, time.ParseDuration %v", s, d, want)
		}
	})
}

// FuzzParseList: parseList never panics, returns only well-formed items,
// and reads back the same items from their serialization.
func FuzzParseList(f *testing.F) {
	for _, s := range []string{`"default";r=50;t=30`, `"permin";q=50;w=60,"perhr";q=1000;w=3600`,
		`"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`, `burst;q=100;w=60,daily;q=1000;w=86400`,
		`sugar, tea, rum`, `4.5, -0.25, 123456789012.123, 123456789012345`, `?1;a;b=?0`, `"a\"b\\c"`,
		`(1 2), 3`, `"x,y";bad=@1, z`, `a,,b`, `"unterminated, a`, `*t/x:y;k.1-_*="v"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		items := parseList(s, nil)
		for _, it := range items {
			if err := checkValue(it.sfValue); err != nil {
				t.Fatalf("%q: item %+v: %v", s, it, err)
			}
			for _, p := range it.params {
				if err := checkValue(p.val); err != nil || p.key == "" {
					t.Fatalf("%q: param %+v: %v", s, p, err)
				}
			}
		}
		if len(items) == 0 {
			return
		}
		again := parseList(serialize(items), nil)
		if fmt.Sprint(again) != fmt.Sprint(items) {
			t.Fatalf("%q: parsed %+v, serialized as %q, parsed again %+v", s, items, serialize(items), again)
		}
	})
}

// checkValue returns what is wrong with v, a bare item parseList returned.
func checkValue(v sfValue) error {
	switch v.kind {
	case sfInteger:
		if v.num != math.Trunc(v.num) || math.Abs(v.num) >= 1e15 {
			return fmt.Errorf("integer %v", v.num)
		}
	case sfDecimal:
		if math.Abs(v.num) >= 1e12 || math.IsNaN(v.num) {
			return fmt.Errorf("decimal %v", v.num)
		}
	case sfString:
		for i := 0; i < len(v.str); i++ {
			if v.str[i] < 0x20 || v.str[i] > 0x7e {
				return fmt.Errorf("string %q", v.str)
			}
		}
	case sfToken, sfBytes:
		if v.kind == sfToken && v.str == "" {
			return fmt.Errorf("empty token")
		}
	case sfBoolean:
		if v.num != 0 && v.num != 1 {
			return fmt.Errorf("boolean %v", v.num)
		}
	default:
		return fmt.Errorf("kind %d", v.kind)
	}
	return nil
}

// serialize writes items as a List (RFC 9651 section 4.1, loosely).
func serialize(items []sfItem) string {
	var b strings.Builder
	bare := func(v sfValue) {
		switch v.kind {
		case sfInteger:
			b.WriteString(strconv.FormatFloat(v.num, 'f', -1, 64))
		case sfDecimal:
			s := strconv.FormatFloat(v.num, 'f', -1, 64)
			if !strings.Contains(s, ".") {
				s += ".0"
			}
			b.WriteString(s)
		case sfString:
			b.WriteString(`"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v.str) + `"`)
		case sfToken:
			b.WriteString(v.str)
		case sfBytes:
			b.WriteString(":" + v.str + ":")
		case sfBoolean:
			b.WriteString("?" + strconv.Itoa(int(v.num)))
		}
	}
	for i, it := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		bare(it.sfValue)
		for _, p := range it.params {
			b.WriteString(";" + p.key + "=")
			bare(p.val)
		}
	}
	return b.String()
}

// FuzzUntil: the RFC 3339 reset of Anthropic's headers is never negative
// nor saturated, and is the time to what time.Parse reads.
func FuzzUntil(f *testing.F) {
	for _, s := range []string{"2026-05-01T12:00:24Z", "2026-05-01T12:00:00.25Z", "2026-05-01T14:00:01+02:00",
		"2026-05-01T11:59:59Z", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "2026-05-01T12:00:24",
		"2026-02-30T12:00:00Z", "2026-05-01T24:00:00Z", ""} {
		f.Add(s, int64(0))
	}
	f.Fuzz(func(t *testing.T, s string, offset int64) {
		now := fuzzNow.Add(time.Duration(offset))
		d := until(s, now)
		if d < 0 || d == maxDuration {
			t.Fatalf("%q at %v: %v", s, now, d)
		}
		if want, err := time.Parse(time.RFC3339, s); err == nil {
			if w := want.Sub(now); w > 0 && w < maxDuration && d != w {
				t.Fatalf("%q at %v: %v, want %v", s, now, d, w)
			}
		} else if d != 0 {
			t.Fatalf("%q: %v for a malformed time", s, d)
		}
	})
}

// FuzzParseBody: no body makes ParseBody panic, only valid JSON says
// anything, and a delay is never negative nor saturated.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
		`{"type":"error","error":{"type":"billing_error","message":"billing"}}`,
		`{"error":{"code":429,"type":"insufficient_quota"}}`, `{"error":"insufficient_quota"}`, `[[[[`, `null`, ``,
		`{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"},` +
			`{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"m","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]}}`,
		`{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"0.250s"}]}}`,
		`{"error":{"code":429,"message":"Please retry in 59.322187034s.","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"59s"}]}}`,
		`{"error":{"code":429,"message":"Please retry in 356.313387ms.","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"0s"}]}}`,
		`{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"9223372036.854775808s"}]}}`,
		`{"error":{"message":"Please try again in 6.379s. Visit","type":"tokens","code":"rate_limit_exceeded"}}`,
		`{"error":{"message":"Please try again in 1m30s."}}`, `{"error":{"message":"retry after 17 seconds"}}`,
		`{"error":{"message":"try again in try again in 2562047h47m16.854775807s"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b := ParseBody(body)
		if b != (Body{}) && !json.Valid(body) {
			t.Fatalf("%q: invalid JSON says %+v", body, b)
		}
		if b.RetryAfter < 0 || b.RetryAfter == maxDuration {
			t.Fatalf("%q: delay %v", body, b.RetryAfter)
		}
	})
}

// FuzzParseStreamError: an event's data that is not JSON says nothing; one
// that says something is a refusal, with a delay that is never negative.
func FuzzParseStreamError(f *testing.F) {
	for _, s := range []string{
		`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
		`{"type":"error","error":{"type":"rate_limit_error","message":"Please try again in 2s"}}`,
		`{"error":{"message":"Rate limit reached","type":"tokens","code":"rate_limit_exceeded"}}`,
		`{"error":{"code":429,"type":"insufficient_quota"}}`, `{"error":null}`, `{"error":"x"}`, `[`, ``,
		`{"type":"error","error":{"type":"api_error","message":"Internal"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fb, ok := ParseStreamError(data)
		if !ok {
			if fb.Class != Accepted || fb.RetryAfter != 0 {
				t.Fatalf("%q: nothing said, yet %+v", data, fb)
			}
			return
		}
		if !json.Valid(data) || fb.Class == Accepted || fb.RetryAfter < 0 || fb.RetryAfter == maxDuration {
			t.Fatalf("%q: %+v", data, fb)
		}
	})
}

// FuzzMessageDelay: a message's delay is never negative nor saturated, and
// is found only after one of the phrases.
func FuzzMessageDelay(f *testing.F) {
	for _, s := range []string{"Please try again in 6.379s. Visit", "try again in 1m30s", "in 20ms", "try again in 2.5 seconds",
		"Please retry after 17 seconds.", "Please retry in 39.010806355s.", "try again in", "try again in .s", "RETRY IN 3MS",
		"try again in 9999999999999999999999 ms", "try again in 1h1h", "retry after 1 sec", "try again in µs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		d, ok := messageDelay(msg)
		if !ok && d != 0 || d < 0 || d == maxDuration {
			t.Fatalf("%q: %v, %v", msg, d, ok)
		}
		if ok && !strings.Contains(strings.ToLower(msg), "try again in ") && !strings.Contains(strings.ToLower(msg), "retry ") {
			t.Fatalf("%q: %v with no phrase", msg, d)
		}
	})
}

// FuzzResetAt: the X-RateLimit reset is never negative nor saturated, and a
// number of seconds below 1e9 is read exactly.
func FuzzResetAt(f *testing.F) {
	for _, s := range []string{"", "0", "30", "1.5", "1777636830", "1777636830.123", "999999999", "1000000000",
		"0001777636830", "99999999999", "9223372036854775807", "9223372036854775808", "-1", "1e9", "1.", ".5"} {
		f.Add(s, int64(0))
	}
	f.Fuzz(func(t *testing.T, s string, offset int64) {
		now := fuzzNow.Add(time.Duration(offset))
		d := resetAt(s, now)
		if d < 0 || d == maxDuration {
			t.Fatalf("%q at %v: %v", s, now, d)
		}
		if n, err := strconv.ParseUint(s, 10, 64); err == nil && n < unixThreshold && d != time.Duration(n)*time.Second {
			t.Fatalf("%q: %v", s, d)
		}
		if _, _, ok := decimal(s); !ok && d != 0 {
			t.Fatalf("%q: %v for a malformed reset", s, d)
		}
	})
}
