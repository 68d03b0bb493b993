package adaptive

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestParseList(t *testing.T) {
	tok := func(s string, params ...sfParam) sfItem { return sfItem{sfValue{kind: sfToken, str: s}, params} }
	str := func(s string, params ...sfParam) sfItem { return sfItem{sfValue{kind: sfString, str: s}, params} }
	num := func(k sfKind, n float64) sfItem { return sfItem{sfValue: sfValue{kind: k, num: n}} }
	param := func(key string, v sfValue) sfParam { return sfParam{key, v} }
	integer := func(n float64) sfValue { return sfValue{kind: sfInteger, num: n} }
	yes := sfValue{kind: sfBoolean, num: 1}
	tests := []struct {
		in   string
		want []sfItem
	}{
		{``, nil},
		{`   `, nil},
		{`sugar, tea, rum`, []sfItem{tok("sugar"), tok("tea"), tok("rum")}},
		{`sugar,tea,	rum`, []sfItem{tok("sugar"), tok("tea"), tok("rum")}},
		{`"default";r=50;t=30`, []sfItem{str("default", param("r", integer(50)), param("t", integer(30)))}},
		{`"a";q=1; w=2`, []sfItem{str("a", param("q", integer(1)), param("w", integer(2)))}},
		{`abc;a=1;b;c=?0`, []sfItem{tok("abc", param("a", integer(1)), param("b", yes),
			param("c", sfValue{kind: sfBoolean}))}},
		{`x;qu="tokens";pk=:cHsdsRa894==:`, []sfItem{tok("x", param("qu", sfValue{kind: sfString, str: "tokens"}),
			param("pk", sfValue{kind: sfBytes, str: "cHsdsRa894=="}))}},
		{`*foo/bar:baz!`, []sfItem{tok("*foo/bar:baz!")}},
		{`42, -42, 0, 123456789012345`, []sfItem{num(sfInteger, 42), num(sfInteger, -42), num(sfInteger, 0),
			num(sfInteger, 123456789012345)}},
		{`4.5, -0.25, 123456789012.123`, []sfItem{num(sfDecimal, 4.5), num(sfDecimal, -0.25),
			num(sfDecimal, 123456789012.123)}},
		{`?1, ?0`, []sfItem{num(sfBoolean, 1), num(sfBoolean, 0)}},
		{`"a\"b\\c", ""`, []sfItem{str(`a"b\c`), str("")}},
		{`"x,y", z`, []sfItem{str("x,y"), tok("z")}},
		{`a;q=1;q=2`, []sfItem{tok("a", param("q", integer(1)), param("q", integer(2)))}},
		// Malformed members are skipped, the others kept.
		{`1234567890123456, 1`, []sfItem{num(sfInteger, 1)}},
		{`1234567890123.0, 1.1234, 1., -, -a, 1`, []sfItem{num(sfInteger, 1)}},
		{`"a\b", "é", "tab	", 1`, []sfItem{num(sfInteger, 1)}},
		{`?2, ?, 1`, []sfItem{num(sfInteger, 1)}},
		{`(1 2), 3`, []sfItem{num(sfInteger, 3)}},
		{`@1659578233, %"x", 3`, []sfItem{num(sfInteger, 3)}},
		{`a;Q=1, a;=1, a;1=1, a;q=, b`, []sfItem{tok("b")}},
		{`:abc, :a b:, c`, []sfItem{tok("c")}},
		{`a b, 1x, c`, []sfItem{tok("c")}},
		{`"x,y";bad=@1, z`, []sfItem{tok("z")}},
		{`"a\",b", c`, []sfItem{str(`a",b`), tok("c")}},
		{`a,,b`, []sfItem{tok("a"), tok("b")}},
		{`a,`, []sfItem{tok("a")}},
		{`, a`, []sfItem{tok("a")}},
		{`"unterminated, a`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			assert.Equal(t, tt.want, parseList(tt.in, nil))
		})
	}
}

func TestSFItemParam(t *testing.T) {
	items := parseList(`a;q=1;w=60;q=2`, nil)
	assert.Len(t, items, 1)
	q, ok := items[0].param("q")
	assert.True(t, ok)
	assert.Equal(t, sfValue{kind: sfInteger, num: 2}, q, "the last wins")
	_, ok = items[0].param("x")
	assert.False(t, ok)
}

func TestSFValueSeconds(t *testing.T) {
	tests := []struct {
		v    sfValue
		want time.Duration
		ok   bool
	}{
		{sfValue{kind: sfInteger, num: 0}, 0, true},
		{sfValue{kind: sfInteger, num: 60}, time.Minute, true},
		{sfValue{kind: sfInteger, num: 9223372035}, 9223372035 * time.Second, true},
		{sfValue{kind: sfInteger, num: 9223372036}, 0, false},
		{sfValue{kind: sfInteger, num: 999999999999999}, 0, false},
		{sfValue{kind: sfInteger, num: -1}, 0, false},
		{sfValue{kind: sfDecimal, num: 1}, 0, false},
		{sfValue{kind: sfString, str: "1"}, 0, false},
	}
	for _, tt := range tests {
		d, ok := tt.v.seconds()
		assert.Equal(t, tt.want, d, "%+v", tt.v)
		assert.Equal(t, tt.ok, ok, "%+v", tt.v)
	}
}

func TestGoDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1s", time.Second, true},
		{"6m0s", 6 * time.Minute, true},
		{"20ms", 20 * time.Millisecond, true},
		{"1m30.5s", 90500 * time.Millisecond, true},
		{"0s", 0, true},
		{"2h3m", 2*time.Hour + 3*time.Minute, true},
		{"59.9s", 59900 * time.Millisecond, true},
		{"1.2ms", 1200 * time.Microsecond, true},
		{"7.66s", 7660 * time.Millisecond, true},
		{"2m59.56s", 179560 * time.Millisecond, true},
		{"1h0m0.000000001s", time.Hour + 1, true},
		{"1.5us", 1500, true},
		{"3µs", 3000, true},
		{"1ns", 1, true},
		{"0.1ns", 1, true}, // rounded up
		{"0", 0, true},     // bare seconds
		{"12", 12 * time.Second, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"2562047h47m16.854775806s", 1<<63 - 2, true},
		{"2562047h47m16.854775807s", 0, false}, // the longest Duration: absurd
		{"9999999h", 0, false},
		{"99999999999999999999", 0, false},
		{"", 0, false},
		{"s", 0, false},
		{"-1s", 0, false},
		{"+1s", 0, false},
		{".5s", 0, false},
		{"1.s", 0, false},
		{"1s30m", 0, false},
		{"1m1m", 0, false},
		{"1us1µs", 0, false},
		{"1x", 0, false},
		{"1h-1s", 0, false},
		{"1 s", 0, false},
		{"1S", 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"1e3s", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			d, ok := goDuration(tt.in)
			assert.Equal(t, tt.want, d)
			assert.Equal(t, tt.ok, ok)
		})
	}
}

func TestUntil(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"2026-05-01T12:00:24Z", 24 * time.Second},
		{"2026-05-01T12:00:00.25Z", 250 * time.Millisecond},
		{"2026-05-01T13:00:00+01:00", 0}, // now
		{"2026-05-01T14:00:01+02:00", time.Second},
		{"2026-05-01T11:59:59Z", 0},
		{"9999-12-31T23:59:59Z", 0}, // beyond a Duration
		{"2026-05-01 12:00:24Z", 0},
		{"2026-05-01T12:00:24", 0},
		{"1777636824", 0},
		{"", 0},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, until(tt.in, now), tt.in)
	}
}

func TestScale(t *testing.T) {
	tests := []struct {
		whole, frac string
		unit        time.Duration
		want        time.Duration
	}{
		{"0", "", time.Second, 0},
		{"1", "5", time.Second, 1500 * time.Millisecond},
		{"0", "3", time.Second, 300 * time.Millisecond},
		{"0", "1", time.Nanosecond, 1},
		{"0", "0000000000000000000000001", time.Hour, 1},
		{"0", "9999999999999999999", time.Hour, time.Hour},
		{"2", "000", time.Millisecond, 2 * time.Millisecond},
		{"9223372036", "854775807", time.Second, maxDuration},
		{"9223372036", "854775806", time.Second, maxDuration - 1},
		{"9223372036", "8547758061", time.Second, maxDuration},
		{"9223372037", "", time.Second, maxDuration},
		{"00000000000000000000000000001", "", time.Second, time.Second},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, scale(tt.whole, tt.frac, tt.unit), "%s.%s × %v", tt.whole, tt.frac, tt.unit)
	}
}

func TestStricter(t *testing.T) {
	q := func(limit, remaining float64, reset, window time.Duration) Quota {
		return Quota{Limit: limit, Remaining: remaining, Reset: reset, Window: window}
	}
	tests := []struct {
		name string
		a, b Quota
		want bool
	}{
		{"known remaining beats unknown", q(1000, 500, 0, 0), q(10, -1, 0, time.Hour), true},
		{"unknown remaining loses", q(10, -1, 0, time.Hour), q(1000, 500, 0, 0), false},
		{"less remaining", q(100, 5, 0, 0), q(10, 6, 0, 0), true},
		{"more remaining", q(100, 7, 0, 0), q(10, 6, 0, 0), false},
		{"same remaining, longer reset", q(0, 0, time.Hour, 0), q(0, 0, time.Minute, 0), true},
		{"same remaining, shorter reset", q(0, 0, time.Second, 0), q(0, 0, time.Minute, 0), false},
		{"lower rate", q(1000, -1, 0, time.Hour), q(50, -1, 0, time.Minute), true},
		{"higher rate", q(50, -1, 0, time.Minute), q(1000, -1, 0, time.Hour), false},
		{"no rate: lower limit", q(50, -1, 0, 0), q(1000, -1, 0, time.Hour), true},
		{"no limit", q(0, -1, time.Second, 0), q(1000, -1, 0, 0), false},
		{"equal", q(50, -1, 0, time.Minute), q(50, -1, 0, time.Minute), false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, stricter(tt.a, tt.b), tt.name)
	}
}
