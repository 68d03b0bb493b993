package adaptive

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/dimension"
)

// statusOverloaded is the status Anthropic answers when it is overloaded.
const statusOverloaded = 529

// maxDuration is the longest time.Duration. A delay is saturated at it; a
// reset or window that long (292 years) is taken for garbage.
const maxDuration = time.Duration(math.MaxInt64)

// Read returns what resp says about the limit it met; it is shorthand for
// Parse(resp.StatusCode, resp.Header, time.Now()). It never reads the body.
func Read(resp *http.Response) Feedback {
	if resp == nil {
		return Feedback{}
	}
	return Parse(resp.StatusCode, resp.Header, time.Now())
}

// Parse returns what a response with this status and header says about the
// limit it met, at time now. It never reads a body, so it cannot tell a
// spent quota from a rate limit, nor learn a delay that only the body
// states: a caller that holds the start of a refusal's body amends the
// Feedback with f.WithBody(ParseBody(body)).
//
// Class is RateLimited for 429, Overloaded for 503 and 529, RateLimited
// for a 403 that says it is a rate limit (GitHub answers its limits with
// 403 or 429: X-RateLimit-Remaining 0 for the primary limit, a Retry-After
// for the secondary one), else Accepted: Accepted is no verdict on the
// request, only that it was not turned away for rate or load; a 403 that
// carries neither (a token without the scope, a blocked account) is
// Accepted, as are a 400, 401 or 500.
//
// RetryAfter is read, as RetryAfter reads it, from those refusals only:
// they turn a request away for rate or load, and a bucket applies their
// Retry-After to every process that shares the key. On any other status
// (a success, a redirect, a 400, 401, 404 or 500) it asks at most for that
// one request to be retried later, which a caller reads with RetryAfter
// itself; it is no reason to pause the fleet. A refusal without a
// Retry-After whose X-RateLimit-Remaining is 0 asks for a wait until its
// reset (X-RateLimit-Reset-After or X-RateLimit-Reset), as GitHub documents.
// HasRetryAfter tells a refusal that asks for no wait (Retry-After: 0) from
// one that asks for nothing.
//
// Quotas holds, by dimension, what these headers report, and is nil if they
// report nothing:
//
//   - OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, the
//     resets written as Go durations ("6m0s", "1.5s", "20ms") or a bare
//     number of seconds;
//   - Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-{limit,remaining,reset}, the resets RFC 3339 times,
//     the limits per minute (Window is a minute);
//   - IETF (draft-ietf-httpapi-ratelimit-headers): RateLimit-Policy and
//     RateLimit, whose items are matched by name (quota units "requests" and
//     "tokens"; others are ignored), and the earlier drafts' RateLimit-Limit,
//     RateLimit-Remaining and RateLimit-Reset (requests), whose reset is read
//     as a Unix time when it is 1e9 or more, as some servers send it;
//   - GitHub and Discord: X-RateLimit-Limit, X-RateLimit-Remaining and
//     X-RateLimit-Reset (requests), the reset a Unix time in seconds when it
//     is 1e9 or more (both send it so; Discord's has a fraction), else a
//     number of seconds, and Discord's X-RateLimit-Reset-After, a number of
//     seconds, which wins over X-RateLimit-Reset since it does not depend on
//     our clock. X-RateLimit-Used, -Resource, -Bucket, -Global and -Scope
//     are ignored: a key is what tells GitHub's resources or Discord's
//     buckets apart.
//
// A malformed value is ignored, as is a count below zero (Azure sends -1
// for "unknown"), a reset or window of 292 years or more, and a RateLimit
// item or policy with any such parameter. A Limit is positive, a Remaining
// never above its Limit (it is clamped to it: a limit can be lowered within
// a window, and Anthropic rounds what remains), a reset in the past is
// zero. When several policies or header families report on one dimension
// (a server may send both X-RateLimit-* and RateLimit-*), the Quota kept is
// the most restrictive: the least Remaining, a known Remaining rather than
// an unknown one, else the lowest rate.
func Parse(status int, h http.Header, now time.Time) Feedback {
	var f Feedback
	gh := xRateLimit(h, now)
	switch status {
	case http.StatusTooManyRequests, http.StatusForbidden:
		f.Class = RateLimited
	case http.StatusServiceUnavailable, statusOverloaded:
		f.Class = Overloaded
	}
	if f.Class != Accepted {
		f.RetryAfter, f.HasRetryAfter = RetryAfter(h, now)
		switch spent := gh.Remaining == 0; {
		case f.HasRetryAfter:
		case spent:
			f.RetryAfter, f.HasRetryAfter = gh.Reset, gh.Reset > 0
		case status == http.StatusForbidden:
			f.Class = Accepted // says neither: no rate limit
		}
	}
	var qs quotaSet
	qs.openAI(h)
	qs.anthropic(h, now)
	qs.ietf(h)
	qs.ietfLegacy(h, now)
	qs.put(dimension.Requests, gh, "X-Ratelimit-Limit")
	f.Quotas = qs
	return f
}

// RetryAfter returns the delay h asks for and whether it asks for one:
// retry-after-ms (OpenAI) if it is a number of milliseconds, else
// Retry-After as a number of seconds or an HTTP-date (a date in the past
// asks for no delay). Numbers are decimal, with an optional fraction
// ("1.5"), and never negative; a delay is rounded up to the nanosecond and
// saturates at the longest time.Duration. Anything else is ignored.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if whole, frac, ok := decimal(first(h, "Retry-After-Ms")); ok {
		return scale(whole, frac, time.Millisecond), true
	}
	v := first(h, "Retry-After")
	if whole, frac, ok := decimal(v); ok {
		return scale(whole, frac, time.Second), true
	}
	if v == "" {
		return 0, false
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// quotaSet collects the quotas of one response; nil until one is put.
type quotaSet map[string]Quota

// put records q for dimension dim, if q tells anything and dim does not
// hold a more restrictive quota already; source is the header that states
// its limit, if it has one.
func (s *quotaSet) put(dim string, q Quota, source string) {
	if q.Limit > 0 && q.Remaining > q.Limit {
		q.Remaining = q.Limit
	}
	if q.Limit > 0 {
		q.Source = source
	}
	if !(q.Limit > 0 || q.Remaining >= 0 || q.Reset > 0 || q.Window > 0) {
		return
	}
	if *s == nil {
		*s = make(quotaSet, 2)
	}
	if old, ok := (*s)[dim]; ok && !stricter(q, old) {
		return
	}
	(*s)[dim] = q
}

// stricter reports whether a is more restrictive than b: a known Remaining
// beats an unknown one, then the least Remaining, then the longer Reset;
// with neither Remaining known, the lower rate, else the lower Limit.
func stricter(a, b Quota) bool {
	ka, kb := a.Remaining >= 0, b.Remaining >= 0
	switch {
	case ka != kb:
		return ka
	case ka && a.Remaining != b.Remaining:
		return a.Remaining < b.Remaining
	case ka:
		return a.Reset > b.Reset
	}
	ra, oka := a.Rate()
	rb, okb := b.Rate()
	if oka && okb {
		return ra < rb
	}
	return a.Limit > 0 && (b.Limit <= 0 || a.Limit < b.Limit)
}

// quotaOf returns the Quota that a limit and a remaining count (header
// values, either one empty or malformed) report; Reset and Window are left
// to the caller.
func quotaOf(limit, remaining string) Quota {
	q := Quota{Remaining: -1}
	if n, ok := count(limit); ok && n > 0 {
		q.Limit = n
	}
	if n, ok := count(remaining); ok {
		q.Remaining = n
	}
	return q
}

// openAIHeaders are OpenAI's rate limit headers, by dimension.
var openAIHeaders = [...]struct{ dim, limit, remaining, reset string }{
	{dimension.Requests, "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
	{dimension.Tokens, "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
}

func (s *quotaSet) openAI(h http.Header) {
	for _, k := range openAIHeaders {
		q := quotaOf(first(h, k.limit), first(h, k.remaining))
		q.Reset, _ = goDuration(first(h, k.reset))
		s.put(k.dim, q, k.limit)
	}
}

// anthropicHeaders are Anthropic's rate limit headers, by dimension.
var anthropicHeaders = [...]struct{ dim, limit, remaining, reset string }{
	{dimension.Requests, "Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
	{dimension.Tokens, "Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
	{dimension.InputTokens, "Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"},
	{dimension.OutputTokens, "Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"},
}

func (s *quotaSet) anthropic(h http.Header, now time.Time) {
	for _, k := range anthropicHeaders {
		q := quotaOf(first(h, k.limit), first(h, k.remaining))
		q.Reset = until(first(h, k.reset), now)
		if q.Limit > 0 {
			// Its limits are per minute, refilled continuously: the rate
			// is Limit a minute. Read from the reset instead, which comes
			// in whole seconds, it would be biased down (49 of 50 left
			// read as 0.588/s, not 0.833/s).
			q.Window = time.Minute
		}
		s.put(k.dim, q, k.limit)
	}
}

// until returns the time from now to v, an RFC 3339 time: zero if v is
// malformed.
func until(v string, now time.Time) time.Duration {
	if v == "" {
		return 0 // before time.Parse, whose error allocates
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0
	}
	return ahead(t, now)
}

// ahead returns the time from now to t: zero if t is past, or absurdly far.
func ahead(t, now time.Time) time.Duration {
	if d := t.Sub(now); d > 0 && d < maxDuration {
		return d
	}
	return 0
}

// policy is an item of RateLimit-Policy.
type policy struct {
	name   string
	dim    string // "" if its quota unit is not one counted here
	limit  float64
	window time.Duration
	used   bool // a RateLimit item reported on it
}

// ietf reads RateLimit-Policy and RateLimit.
func (s *quotaSet) ietf(h http.Header) {
	policyLines, limitLines := h["Ratelimit-Policy"], h["Ratelimit"]
	if len(policyLines) == 0 && len(limitLines) == 0 {
		return
	}
	var policies []policy
	for _, it := range parseLines(policyLines) {
		if p, ok := readPolicy(it); ok {
			policies = append(policies, p)
		}
	}
	for _, it := range parseLines(limitLines) {
		if dim, q, ok := limitItem(it, policies); ok && dim != "" {
			s.put(dim, q, "RateLimit-Policy")
		}
	}
	for _, p := range policies {
		if !p.used && p.dim != "" {
			s.put(p.dim, Quota{Limit: p.limit, Remaining: -1, Window: p.window}, "RateLimit-Policy")
		}
	}
}

// limitItem reads an item of RateLimit: its remaining r and reset t, and
// the limit and window of the policy of its name, which it marks used; the
// dimension is the policy's ("" if it is not counted here), requests if no
// policy has the item's name.
func limitItem(it sfItem, policies []policy) (dim string, q Quota, ok bool) {
	name, ok := it.text()
	r, okr := it.param("r")
	if !ok || !okr || !r.isCount() {
		return "", q, false
	}
	q = Quota{Remaining: r.num}
	if t, ok := it.param("t"); ok {
		if q.Reset, ok = t.seconds(); !ok {
			return "", q, false
		}
	}
	dim = dimension.Requests
	for i := range policies {
		if p := &policies[i]; p.name == name {
			dim, q.Limit, q.Window, p.used = p.dim, p.limit, p.window, true
			break
		}
	}
	return dim, q, true
}

// readPolicy reads an item of RateLimit-Policy: a name (a String, or a
// Token as in draft 08), a quota q, optionally a window w and a unit qu.
func readPolicy(it sfItem) (policy, bool) {
	name, ok := it.text()
	q, okq := it.param("q")
	if !ok || !okq || !q.isCount() {
		return policy{}, false
	}
	p := policy{name: name, dim: dimension.Requests, limit: q.num}
	if w, ok := it.param("w"); ok {
		if p.window, ok = w.seconds(); !ok || p.window == 0 {
			return policy{}, false
		}
	}
	if qu, ok := it.param("qu"); ok {
		switch unit, _ := qu.text(); unit {
		case "requests", "request": // the draft's registry spells it "request"
		case "tokens":
			p.dim = dimension.Tokens
		default:
			p.dim = ""
		}
	}
	return p, true
}

// unixThreshold is the least RateLimit-Reset read as a Unix time rather
// than a number of seconds (2001-09-09, or 31 years from now).
const unixThreshold = 1e9

// ietfLegacy reads the earlier drafts' RateLimit-Limit, RateLimit-Remaining
// and RateLimit-Reset, each an Integer (RateLimit-Limit may go on with a
// list of policies, which is ignored).
func (s *quotaSet) ietfLegacy(h http.Header, now time.Time) {
	limit, remaining, reset := h["Ratelimit-Limit"], h["Ratelimit-Remaining"], h["Ratelimit-Reset"]
	if len(limit) == 0 && len(remaining) == 0 && len(reset) == 0 {
		return
	}
	q := Quota{Remaining: -1}
	if n, ok := firstCount(limit); ok && n > 0 {
		q.Limit = n
	}
	if n, ok := firstCount(remaining); ok {
		q.Remaining = n
	}
	if n, ok := firstCount(reset); ok {
		if n >= unixThreshold {
			q.Reset = ahead(time.Unix(int64(n), 0), now)
		} else {
			q.Reset = time.Duration(n) * time.Second
		}
	}
	s.put(dimension.Requests, q, "RateLimit-Limit")
}

// firstCount returns the first member of the List in lines if it is an
// Integer of zero or more.
func firstCount(lines []string) (float64, bool) {
	if len(lines) == 0 {
		return 0, false
	}
	items := parseList(lines[0], nil)
	if len(items) == 0 || !items[0].isCount() {
		return 0, false
	}
	return items[0].num, true
}

// xRateLimit returns the Quota that GitHub's and Discord's X-RateLimit-Limit,
// X-RateLimit-Remaining, X-RateLimit-Reset and X-RateLimit-Reset-After
// report (see Parse); Remaining is -1 if unknown.
func xRateLimit(h http.Header, now time.Time) Quota {
	q := quotaOf(first(h, "X-Ratelimit-Limit"), first(h, "X-Ratelimit-Remaining"))
	if whole, frac, ok := decimal(first(h, "X-Ratelimit-Reset-After")); ok {
		q.Reset, _ = below(scale(whole, frac, time.Second))
	} else {
		q.Reset = resetAt(first(h, "X-Ratelimit-Reset"), now)
	}
	return q
}

// resetAt returns the time from now to v, a reset in seconds with an
// optional fraction: a Unix time when it is unixThreshold or more, else a
// number of seconds. It is zero if v is malformed, past, or 292 years or
// more away.
func resetAt(v string, now time.Time) time.Duration {
	whole, frac, ok := decimal(v)
	if !ok {
		return 0
	}
	if w := strings.TrimLeft(whole, "0"); len(w) < 10 { // below unixThreshold, 1e9
		d, _ := below(scale(whole, frac, time.Second))
		return d
	}
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec > maxUnix {
		return 0
	}
	return ahead(time.Unix(sec, int64(scale("", frac, time.Second))), now)
}

// maxUnix is the latest Unix time resetAt reads, in the year 5138: far
// beyond any reset ahead (which ahead refuses), and far from the overflow of
// time.Unix.
const maxUnix = 1e11

// first returns the first value of the header key, which must be in
// canonical form: a map lookup, cheaper than h.Get.
func first(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// decimal splits s, a decimal number of zero or more (digits, then
// optionally a point and more digits), into its whole and fraction digits.
func decimal(s string) (whole, frac string, ok bool) {
	i := digits(s)
	if i == 0 {
		return "", "", false
	}
	if i == len(s) {
		return s, "", true
	}
	if s[i] != '.' {
		return "", "", false
	}
	j := i + 1 + digits(s[i+1:])
	if j == i+1 || j != len(s) {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// digits returns the length of the run of ASCII digits s starts with.
func digits(s string) int {
	i := 0
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	return i
}

// count parses s, a decimal number of zero or more, as a finite float64.
func count(s string) (float64, bool) {
	if _, _, ok := decimal(s); !ok {
		return 0, false
	}
	n, err := strconv.ParseFloat(s, 64) // fails only beyond the largest float64
	return n, err == nil
}

// scale returns the number whole.frac (strings of digits) times unit,
// rounded up to the nanosecond and saturated at maxDuration.
func scale(whole, frac string, unit time.Duration) time.Duration {
	var d time.Duration
	for i := 0; i < len(whole); i++ {
		digit := time.Duration(whole[i]-'0') * unit
		if d > (maxDuration-digit)/10 {
			return maxDuration
		}
		d = d*10 + digit
	}
	// The fraction, in nanoseconds: ⌈0.frac × unit⌉, exact in 128 bits
	// for its first 19 digits; any non-zero digit after them rounds up.
	k := min(len(frac), 19)
	num, pow := uint64(0), uint64(1)
	for i := 0; i < k; i++ {
		num, pow = num*10+uint64(frac[i]-'0'), pow*10
	}
	hi, lo := bits.Mul64(num, uint64(unit))
	ns, rem := bits.Div64(hi, lo, pow)
	if rem != 0 || strings.TrimLeft(frac[k:], "0") != "" {
		ns++
	}
	if d > maxDuration-time.Duration(ns) {
		return maxDuration
	}
	return d + time.Duration(ns)
}

// durationUnits are the units of goDuration, longest first.
var durationUnits = [...]struct {
	sym string
	d   time.Duration
}{
	{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond},
	{"us", time.Microsecond}, {"µs", time.Microsecond}, {"ns", time.Nanosecond},
}

// goDuration parses s, a duration as OpenAI sends its resets: in the form
// time.Duration's String writes ("1h2m3.5s", "6m0s", "20ms", "0s"), or a
// bare number of seconds. It is stricter than time.ParseDuration: no sign,
// every number has digits before and after its point, units come longest
// first and once each; and a duration of 292 years or more is refused. A
// fraction is rounded up to the nanosecond.
func goDuration(s string) (time.Duration, bool) {
	if whole, frac, ok := decimal(s); ok {
		return below(scale(whole, frac, time.Second))
	}
	if s == "" {
		return 0, false
	}
	var d time.Duration
	prev := maxDuration // the unit of the previous number
	for s != "" {
		whole, frac, rest, ok := leadingNumber(s)
		if !ok {
			return 0, false
		}
		unit, rest := leadingUnit(rest)
		if unit == 0 || unit >= prev {
			return 0, false
		}
		prev = unit
		v := scale(whole, frac, unit)
		if d > maxDuration-v {
			return 0, false
		}
		d += v
		s = rest
	}
	return below(d)
}

// leadingNumber splits off the number s starts with, as decimal reads it
// (its digits before and after its point), and returns what follows it.
func leadingNumber(s string) (whole, frac, rest string, ok bool) {
	n := digits(s)
	if n < len(s) && s[n] == '.' {
		n += 1 + digits(s[n+1:])
	}
	whole, frac, ok = decimal(s[:n])
	return whole, frac, s[n:], ok
}

// leadingUnit splits off the unit symbol s starts with (up to the next
// digit or point) and returns the unit it names, 0 if it is none of
// durationUnits, and what follows it.
func leadingUnit(s string) (time.Duration, string) {
	n := 0
	for n < len(s) && (s[n] < '0' || s[n] > '9') && s[n] != '.' {
		n++
	}
	for _, u := range durationUnits {
		if u.sym == s[:n] {
			return u.d, s[n:]
		}
	}
	return 0, s[n:]
}

// below returns d, and whether it is shorter than maxDuration (that is, not
// saturated).
func below(d time.Duration) (time.Duration, bool) {
	if d == maxDuration {
		return 0, false
	}
	return d, true
}
