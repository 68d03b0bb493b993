package llmtest

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Dimension is what a Limit counts: requests, tokens, or input or output
// tokens apart, as Anthropic limits them.
type Dimension uint8

const (
	// Requests counts requests: every request costs 1.
	Requests Dimension = iota
	// Tokens counts tokens: a chat completion or a message costs its
	// prompt's tokens plus its completion's (see Handler); other requests
	// cost 0.
	Tokens
	// InputTokens counts a chat completion's or a message's prompt tokens,
	// taken at admission.
	InputTokens
	// OutputTokens counts a chat completion's or a message's completion
	// tokens: its cap is taken at admission, and the part of it the
	// completion does not use given back once the response is written, as
	// Anthropic says it counts output tokens (see Handler).
	OutputTokens
)

// numDims is the number of dimensions; arrays indexed by Dimension have it.
const numDims = 4

// String returns "requests", "tokens", "input_tokens" or "output_tokens":
// the names OpenAI's error bodies and headers use, and sluice's bucket.
func (d Dimension) String() string {
	switch d {
	case Requests:
		return "requests"
	case Tokens:
		return "tokens"
	case InputTokens:
		return "input_tokens"
	case OutputTokens:
		return "output_tokens"
	}
	return "Dimension(" + strconv.Itoa(int(d)) + ")"
}

// algorithm is how a Limit counts.
type algorithm uint8

const (
	unlimited algorithm = iota
	tokenBucket
	fixedWindow
	slidingWindow
	countingWindow
	leakyBucket
)

// Limit is the hidden limit on one dimension, made by TokenBucket,
// LeakyBucket, FixedWindow, SlidingWindow or CountingSlidingWindow. The
// zero Limit limits nothing. Amounts are
// integers and time is counted in nanoseconds, so that admission is exact:
// a test that moves the clock to a boundary knows the answer.
type Limit struct {
	alg    algorithm
	n      int64         // admitted per period, in the long run
	period time.Duration // window, or the time a token bucket takes to refill n
	burst  int64         // a token bucket's capacity; a leaky bucket's burst
}

// TokenBucket returns a token bucket that holds at most burst, starts full
// and refills continuously at n per period: a request is admitted if the
// bucket holds its cost, which it then takes. TokenBucket(500, time.Minute,
// 500) admits 500 at once, then one every 120 ms. It panics if an argument
// is not positive or if the limit is too large to count exactly in int64:
// burst·period/gcd(n, period) must stay below 2^63 ns (about 292 years).
func TokenBucket(n int64, period time.Duration, burst int64) Limit {
	l := Limit{alg: tokenBucket, n: n, period: period, burst: burst}
	if n <= 0 || period <= 0 || burst <= 0 {
		panic(fmt.Sprintf("llmtest: TokenBucket(%d, %v, %d): arguments must be positive", n, period, burst))
	}
	if _, _, ok := bucketScale(l); !ok {
		panic(fmt.Sprintf("llmtest: TokenBucket(%d, %v, %d): too large to count exactly", n, period, burst))
	}
	return l
}

// LeakyBucket returns the limit of nginx's limit_req with burst and
// nodelay (limit_req_zone ... rate=20r/s; limit_req zone=... burst=20
// nodelay): a leaky bucket that drains n per period and refuses, rather
// than queues, what would overflow it. Its level starts at 0 and drains
// continuously, never below 0; a request is admitted if the level,
// drained up to now, plus its cost is at most burst+1, and adds its cost;
// a refused request changes nothing. LeakyBucket(20, time.Second, 20)
// admits 21 at once (the burst and the one being served), then one every
// 50 ms; after 1.05 s idle, 21 again.
//
// For requests of cost 1 this is nginx's law exactly
// (ngx_http_limit_req_lookup). nginx keeps, per key, the "excess" e after
// the last admission, in thousandths of a request, and its time in
// milliseconds; on each request e' = max(e - rate·elapsed + 1, 0), a key's
// first request giving e' = 0; the request is refused if e' > burst, else
// admitted with e = e'. That e is the level here, less the 1 being served.
// The one difference is the clock: this one counts nanoseconds, nginx
// milliseconds read once per event loop, truncating rate·elapsed (and a
// rate per minute) to thousandths; for whole milliseconds and a rate per
// second they agree on every request. It is the same law as TokenBucket(n,
// period, burst+1), named for the limiter it models. It panics if n or
// period is not positive, burst is negative, or the limit is too large to
// count exactly (see TokenBucket).
func LeakyBucket(n int64, period time.Duration, burst int64) Limit {
	l := Limit{alg: leakyBucket, n: n, period: period, burst: burst}
	if n <= 0 || period <= 0 || burst < 0 || burst == math.MaxInt64 {
		panic(fmt.Sprintf("llmtest: LeakyBucket(%d, %v, %d): n and period must be positive, burst not negative", n, period, burst))
	}
	if _, _, ok := bucketScale(l); !ok {
		panic(fmt.Sprintf("llmtest: LeakyBucket(%d, %v, %d): too large to count exactly", n, period, burst))
	}
	return l
}

// FixedWindow returns a limit of n per window, counted in consecutive
// windows aligned to the Unix epoch (a one-minute window runs from :00 to
// the end of :59 of each clock minute): a request is admitted if the
// current window's count plus its cost is at most n. Like providers that
// reset their counters on the minute, it admits up to 2n within one
// window's length across a boundary. It panics if n or window is not
// positive.
func FixedWindow(n int64, window time.Duration) Limit {
	if n <= 0 || window <= 0 {
		panic(fmt.Sprintf("llmtest: FixedWindow(%d, %v): arguments must be positive", n, window))
	}
	return Limit{alg: fixedWindow, n: n, period: window}
}

// SlidingWindow returns a limit of n in any window: an exact log of
// admissions (no approximating counter), by which a request is admitted if
// the cost admitted in the window that ends now, plus its own, is at most
// n. An admission at t counts until t+window, excluded, so no interval
// [t, t+window) is ever admitted more than n. It panics if n or window is
// not positive.
func SlidingWindow(n int64, window time.Duration) Limit {
	if n <= 0 || window <= 0 {
		panic(fmt.Sprintf("llmtest: SlidingWindow(%d, %v): arguments must be positive", n, window))
	}
	return Limit{alg: slidingWindow, n: n, period: window}
}

// CountingSlidingWindow returns a SlidingWindow that counts refused
// requests too, as haproxy's stick tables do (http-request track-sc0 src,
// then deny if sc_http_req_rate(0) gt n) and as OpenAI says its limits
// do: an exact log of every request, admitted or refused by any limit, by
// which a request is admitted if the cost of the requests in the window
// that ends now, plus its own, is at most n. A request at t counts until
// t+window, excluded. So an admitted request and every request of the
// window before it, refused ones included, cost at most n; a client that
// keeps sending more than n per window is refused for as long as it does,
// and only a pause lets the window drain. A request larger than n, which
// never fits, is not counted. A 429's wait counts the refused request
// itself: it is the time until the request fits if it waits and nobody
// else sends. It panics if n or window is not positive.
//
// haproxy's http_req_rate(window) approximates this window: it counts in
// consecutive periods of its length and reads the current period's count
// plus the previous period's, weighted by the share of the previous
// period still inside the window.
func CountingSlidingWindow(n int64, window time.Duration) Limit {
	if n <= 0 || window <= 0 {
		panic(fmt.Sprintf("llmtest: CountingSlidingWindow(%d, %v): arguments must be positive", n, window))
	}
	return Limit{alg: countingWindow, n: n, period: window}
}

// Rate returns the most l admits per second in the long run, the line a
// chart of admissions stays under; 0 for the zero Limit.
func (l Limit) Rate() float64 {
	if l.alg == unlimited {
		return 0
	}
	return float64(l.n) / l.period.Seconds()
}

// String describes l: "token bucket 500 per 1m0s, burst 500", "leaky
// bucket 20 per 1s, burst 20", "fixed window 20 per 1s", "sliding window 20
// per 1s", "counting sliding window 20 per 1s" or "unlimited".
func (l Limit) String() string {
	switch l.alg {
	case tokenBucket:
		return fmt.Sprintf("token bucket %d per %v, burst %d", l.n, l.period, l.burst)
	case leakyBucket:
		return fmt.Sprintf("leaky bucket %d per %v, burst %d", l.n, l.period, l.burst)
	case fixedWindow:
		return fmt.Sprintf("fixed window %d per %v", l.n, l.period)
	case slidingWindow:
		return fmt.Sprintf("sliding window %d per %v", l.n, l.period)
	case countingWindow:
		return fmt.Sprintf("counting sliding window %d per %v", l.n, l.period)
	}
	return "unlimited"
}

// capacity is the most l admits at once: the value of a "limit" header.
func (l Limit) capacity() int64 {
	switch l.alg {
	case tokenBucket:
		return l.burst
	case leakyBucket:
		return l.burst + 1
	}
	return l.n
}

// window is the length of time l's capacity applies to: a window, or the
// time an empty token bucket (a full leaky one) takes to fill (to
// drain), rounded up to a nanosecond.
func (l Limit) window() time.Duration {
	if l.alg == tokenBucket || l.alg == leakyBucket {
		a, b, _ := bucketScale(l)
		return time.Duration(ceilDiv(l.capacity()*b, a))
	}
	return l.period
}

// newMeter returns the state of l, full at now (Unix nanoseconds), or nil
// if l limits nothing.
func (l Limit) newMeter(now int64) meter {
	switch l.alg {
	case tokenBucket, leakyBucket:
		// A leaky bucket's level is the room a token bucket of its
		// capacity lacks: one drains as the other refills, up to the
		// capacity, and a cost fits in one where it fits in the other.
		a, b, _ := bucketScale(l)
		c := l.capacity() * b
		return &bucketMeter{a: a, b: b, capacity: c, level: c, last: now}
	case fixedWindow:
		w := int64(l.period)
		return &fixedMeter{n: l.n, w: w, start: now - floorMod(now, w)}
	case slidingWindow, countingWindow:
		return &slidingMeter{n: l.n, w: int64(l.period), counting: l.alg == countingWindow}
	}
	return nil
}

// meter is the counting state of one Limit. Every method takes now in Unix
// nanoseconds, never before the previous call's, and first brings the
// state up to it.
type meter interface {
	// wait returns how long from now until cost fits, zero if it fits
	// now, and false if it never will: cost exceeds the capacity.
	wait(now, cost int64) (time.Duration, bool)
	// take counts cost, which fits.
	take(now, cost int64)
	// refuse counts cost, which a limit refused (this one or another),
	// if the meter counts refused requests.
	refuse(now, cost int64)
	// give gives back cost of what take counted at the time at: the part
	// of an admission's charge it did not use. What is no longer counted
	// (its window has passed) is not given back.
	give(now, at, cost int64)
	// status returns how much would fit now and how long until the meter
	// is whole again (nothing counted against it).
	status(now int64) (remaining int64, reset time.Duration)
}

// bucketMeter is a token bucket in integers. The rate n per period is
// reduced to a per b nanoseconds (a/b = n/period, in lowest terms); the
// level is counted in units of which one token is b, so that a nanosecond
// adds exactly a units.
type bucketMeter struct {
	a, b     int64
	capacity int64 // burst·b
	level    int64 // units in the bucket, 0..capacity
	last     int64 // time of level
}

// bucketScale returns a and b of a token or leaky bucket's meter, and
// false if its capacity plus a nanosecond's refill would not fit in an
// int64.
func bucketScale(l Limit) (a, b int64, ok bool) {
	p := int64(l.period)
	g := gcd(l.n, p)
	a, b = l.n/g, p/g
	return a, b, b <= (math.MaxInt64-a)/l.capacity()
}

func (m *bucketMeter) advance(now int64) {
	if dt := now - m.last; dt > 0 {
		// Compare before multiplying: dt·a may overflow, missing+a may not.
		if missing := m.capacity - m.level; dt >= ceilDiv(missing, m.a) {
			m.level = m.capacity
		} else {
			m.level += dt * m.a
		}
	}
	m.last = now
}

func (m *bucketMeter) wait(now, cost int64) (time.Duration, bool) {
	m.advance(now)
	if cost > m.capacity/m.b {
		return 0, false
	}
	need := cost*m.b - m.level
	if need <= 0 {
		return 0, true
	}
	return time.Duration(ceilDiv(need, m.a)), true
}

func (m *bucketMeter) take(now, cost int64) {
	m.advance(now)
	m.level -= cost * m.b
}

func (m *bucketMeter) refuse(int64, int64) {}

func (m *bucketMeter) give(now, _, cost int64) {
	m.advance(now)
	m.level = min(m.level+cost*m.b, m.capacity) // cost*b <= capacity: it was taken
}

func (m *bucketMeter) status(now int64) (int64, time.Duration) {
	m.advance(now)
	return m.level / m.b, time.Duration(ceilDiv(m.capacity-m.level, m.a))
}

// fixedMeter counts the window [start, start+w) aligned to the epoch.
type fixedMeter struct {
	n, w  int64
	start int64
	used  int64
}

func (m *fixedMeter) advance(now int64) {
	if now >= m.start+m.w {
		m.start, m.used = now-floorMod(now, m.w), 0
	}
}

func (m *fixedMeter) wait(now, cost int64) (time.Duration, bool) {
	m.advance(now)
	switch {
	case cost > m.n:
		return 0, false
	case m.used+cost <= m.n:
		return 0, true
	}
	return time.Duration(m.start + m.w - now), true
}

func (m *fixedMeter) take(now, cost int64) {
	m.advance(now)
	m.used += cost
}

func (m *fixedMeter) refuse(int64, int64) {}

func (m *fixedMeter) give(now, at, cost int64) {
	m.advance(now)
	if at >= m.start {
		m.used = max(m.used-cost, 0)
	}
}

func (m *fixedMeter) status(now int64) (int64, time.Duration) {
	m.advance(now)
	if m.used == 0 {
		return m.n, 0
	}
	return m.n - m.used, time.Duration(m.start + m.w - now)
}

// slidingMeter logs the admissions of the last w nanoseconds, oldest
// first, and if counting the refusals too.
type slidingMeter struct {
	n, w     int64
	counting bool
	log      []admission
	sum      int64 // of the costs in log
}

// admission is cost admitted at t (Unix nanoseconds).
type admission struct {
	t, cost int64
}

func (m *slidingMeter) advance(now int64) {
	i := 0
	for i < len(m.log) && m.log[i].t <= now-m.w {
		m.sum -= m.log[i].cost
		i++
	}
	m.log = m.log[i:]
}

func (m *slidingMeter) wait(now, cost int64) (time.Duration, bool) {
	m.advance(now)
	if cost > m.n {
		return 0, false
	}
	excess := m.sum + cost - m.n
	if excess <= 0 {
		return 0, true
	}
	// The oldest entries whose expiry frees excess; excess is at most sum
	// since cost is at most n, so the loop ends within the log.
	i := 0
	for ; excess > 0; i++ {
		excess -= m.log[i].cost
	}
	return time.Duration(m.log[i-1].t + m.w - now), true
}

func (m *slidingMeter) take(now, cost int64) {
	m.advance(now)
	if cost > 0 {
		m.log = append(m.log, admission{now, cost})
		m.sum += cost
	}
}

func (m *slidingMeter) refuse(now, cost int64) {
	if m.counting && cost <= m.n {
		m.take(now, cost)
	}
}

// give takes cost off the entries logged at the time at, the latest
// first: entries of one time count alike. An entry left with nothing is
// dropped.
func (m *slidingMeter) give(now, at, cost int64) {
	m.advance(now)
	for i := len(m.log) - 1; i >= 0 && cost > 0 && m.log[i].t >= at; i-- {
		if m.log[i].t != at {
			continue
		}
		g := min(cost, m.log[i].cost)
		m.log[i].cost -= g
		m.sum -= g
		cost -= g
		if m.log[i].cost == 0 {
			m.log = slices.Delete(m.log, i, i+1)
		}
	}
}

func (m *slidingMeter) status(now int64) (int64, time.Duration) {
	m.advance(now)
	if len(m.log) == 0 {
		return m.n, 0
	}
	return max(m.n-m.sum, 0), time.Duration(m.log[len(m.log)-1].t + m.w - now)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ceilDiv returns ⌈a/b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// floorMod returns a mod b in [0, b) for b > 0, a of any sign.
func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
