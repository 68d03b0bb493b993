package bucket_test

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// simServer is a provider with a hidden limit of Burst calls per window of
// Burst/Rate, kept as a token bucket, a fixed window or a sliding log, that
// answers a refused request with a Retry-After in whole seconds, as most do.
type simServer struct {
	limit  bucket.Limit
	kind   string // "token bucket", "fixed window" or "sliding window"
	tokens float64
	last   time.Time
	start  time.Time   // fixed window: the start of the current one
	log    []time.Time // sliding window: admissions in the last window
}

func (s *simServer) admit(now time.Time) (ok bool, retryAfter time.Duration) {
	window := time.Duration(s.limit.Burst / s.limit.Rate * float64(time.Second))
	var wait time.Duration
	switch s.kind {
	case "fixed window":
		for !now.Before(s.start.Add(window)) {
			s.start, s.tokens = s.start.Add(window), s.limit.Burst
		}
		if s.tokens >= 1 {
			s.tokens--
			return true, 0
		}
		wait = s.start.Add(window).Sub(now)
	case "sliding window":
		for len(s.log) > 0 && !now.Before(s.log[0].Add(window)) {
			s.log = s.log[1:]
		}
		if float64(len(s.log)) < s.limit.Burst {
			s.log = append(s.log, now)
			return true, 0
		}
		wait = s.log[0].Add(window).Sub(now)
	default:
		s.tokens = math.Min(s.limit.Burst, s.tokens+now.Sub(s.last).Seconds()*s.limit.Rate)
		s.last = now
		if s.tokens >= 1 {
			s.tokens--
			return true, 0
		}
		wait = time.Duration((1 - s.tokens) / s.limit.Rate * float64(time.Second))
	}
	return false, (wait + time.Second - 1).Truncate(time.Second)
}

// simEvent is a worker's next step at a moment of simulated time.
type simEvent struct {
	at     time.Time
	seq    int
	worker int
	step   int // simReserve, simSend, simReply
}

const (
	simReserve = iota
	simSend
	simReply
)

type simQueue []simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// simResult is what one simulated run measured.
type simResult struct {
	accepted, rejected int
	settle             time.Duration // end of the first run of 429s
	settle429          int           // 429s until then
	horizon            time.Duration
	ideal              float64 // what the hidden limit admits in the horizon
}

// simulate runs workers that each make calls back to back through b (one
// key, cost 1 request) against a server with the hidden limit, for horizon
// of simulated time, setting clk for every bucket call. A response comes
// back latency after it is sent; its feedback goes to b.Observe; a 429 is
// retried at once (the bucket does the waiting).
//
// Workers are spread over procs processes; as the transport does, a
// worker waits for the end of a pause its process learnt of from a 429
// before it reserves, and drops a slot that comes due during one to
// reserve another after it.
func simulate(t *testing.T, b bucket.Bucket, setClock func(time.Time), server string, hidden bucket.Limit, procs, workers int, latency, horizon time.Duration) simResult {
	t.Helper()
	ctx := context.Background()
	start := epoch
	srv := &simServer{limit: hidden, kind: server, tokens: hidden.Burst, last: start, start: start}
	type worker struct {
		epoch   uint64
		delayed bool // its slot was not there at once
		ok      bool
		ra      time.Duration
	}
	ws := make([]worker, workers)
	paused := make([]time.Time, procs) // the end of each process's pause
	q := &simQueue{}
	seq := 0
	push := func(at time.Time, w, step int) {
		seq++
		heap.Push(q, simEvent{at: at, seq: seq, worker: w, step: step})
	}
	for w := range workers {
		push(start, w, simReserve)
	}
	var res simResult
	res.horizon = horizon
	res.ideal = hidden.Burst + hidden.Rate*horizon.Seconds()
	window := time.Duration(hidden.Burst / hidden.Rate * float64(time.Second))
	var last429 time.Time
	settled := false
	for q.Len() > 0 {
		e := heap.Pop(q).(simEvent)
		if e.at.Sub(start) > horizon {
			break
		}
		w := &ws[e.worker]
		switch e.step {
		case simReserve:
			if until := paused[e.worker%procs]; until.After(e.at) {
				push(until, e.worker, simReserve)
				continue
			}
			setClock(e.at)
			r, err := b.Reserve(ctx, "sim", bucket.N(1), bucket.Unlimited)
			if err != nil {
				t.Fatal(err)
			}
			w.epoch, w.delayed = r.Epoch, r.Delay > 0
			push(e.at.Add(r.Delay), e.worker, simSend)
		case simSend:
			// As Transport.wait: a slot due during its process's pause is
			// dropped, and another reserved after it.
			if until := paused[e.worker%procs]; w.delayed && until.After(e.at) {
				push(until, e.worker, simReserve)
				continue
			}
			w.ok, w.ra = srv.admit(e.at)
			if w.ok {
				res.accepted++
			} else {
				if !settled && !last429.IsZero() && e.at.Sub(last429) >= 5*window {
					settled = true
					res.settle, res.settle429 = last429.Sub(start), res.rejected
				}
				res.rejected++
				last429 = e.at
			}
			push(e.at.Add(latency), e.worker, simReply)
		case simReply:
			fb := adaptive.Feedback{Epoch: w.epoch}
			if !w.ok {
				fb.Class, fb.RetryAfter = adaptive.RateLimited, w.ra
				if until := e.at.Add(w.ra); until.After(paused[e.worker%procs]) {
					paused[e.worker%procs] = until
				}
			}
			setClock(e.at)
			if err := b.Observe(ctx, "sim", fb); err != nil {
				t.Fatal(err)
			}
			push(e.at, e.worker, simReserve)
		}
	}
	if !settled {
		res.settle, res.settle429 = last429.Sub(start), res.rejected
	}
	return res
}

// TestAdaptiveSimulation finds, under simulated time, how long a bucket
// whose ceiling is twice the hidden limit takes to stop getting 429s (the
// end of the first run of them: none for 5 windows after), how many it got
// until then, and what it got over the run, with 32 workers in 4
// processes. It prints a table, for Local and for the Lua scripts on
// a redis-server, which must agree.
func TestAdaptiveSimulation(t *testing.T) {
	type scenario struct {
		name    string
		server  string
		hidden  bucket.Limit
		latency time.Duration
		horizon time.Duration
		minOK   float64 // of what the hidden limit allows
	}
	scenarios := []scenario{
		{"20/s", "token bucket", bucket.PerSecond(20), 50 * time.Millisecond, 60 * time.Second, 0.95},
		{"20/s", "fixed window", bucket.PerSecond(20), 50 * time.Millisecond, 60 * time.Second, 0.85},
		{"20/s", "sliding window", bucket.PerSecond(20), 50 * time.Millisecond, 60 * time.Second, 0.8},
		{"60/min", "token bucket", bucket.PerMinute(60), 500 * time.Millisecond, 60 * time.Minute, 0.95},
	}
	policies := []struct {
		name string
		p    adaptive.Policy
	}{
		{"cubic (default)", adaptive.DefaultPolicy()},
		{"cubic, cold", adaptive.Policy{ColdStart: true}},
		{"additive", adaptive.Policy{Recovery: adaptive.Additive}},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-8s %-15s %-16s %-9s %8s %8s %6s %6s %9s\n", "hidden", "server", "policy", "backend", "settled", "429s by", "429s", "ok", "of ideal")
	for _, sc := range scenarios {
		window := time.Duration(sc.hidden.Burst / sc.hidden.Rate * float64(time.Second))
		for _, pol := range policies {
			ceiling := bucket.Limit{Rate: 2 * sc.hidden.Rate, Burst: 2 * sc.hidden.Burst}
			var results []simResult
			for _, be := range simBackends(t) {
				b := be.new(ceiling, bucket.WithPolicy(pol.p))
				r := simulate(t, b, be.set, sc.server, sc.hidden, 4, 32, sc.latency, sc.horizon)
				results = append(results, r)
				fmt.Fprintf(&sb, "%-8s %-15s %-16s %-9s %8v %8d %6d %6d %8.1f%%\n", sc.name, sc.server, pol.name, be.name,
					r.settle.Round(10*time.Millisecond), r.settle429, r.rejected, r.accepted,
					100*float64(r.accepted)/r.ideal)
				// About a refusal per worker until the rate is settled, within
				// 15 windows; under 5% of the calls in all; and most of what
				// the limit allows. Windowed servers refuse any excess at once,
				// and each refusal costs a pause of a whole second (Retry-After
				// in seconds) at 20/s: they get less. The additive law climbs
				// back sooner, into more refusals, and gets less from them.
				assert.LessOrEqual(t, r.settle, 15*window, "%s %s %s %s: settled late", sc.name, sc.server, pol.name, be.name)
				assert.LessOrEqual(t, r.settle429, 40, "%s %s %s %s: 429s before settling", sc.name, sc.server, pol.name, be.name)
				assert.LessOrEqual(t, float64(r.rejected), 0.05*float64(r.accepted), "%s %s %s %s: 429s", sc.name, sc.server, pol.name, be.name)
				assert.GreaterOrEqual(t, float64(r.accepted), sc.minOK*r.ideal, "%s %s %s %s: throughput", sc.name, sc.server, pol.name, be.name)
			}
			// The scripts compute what Local does, up to rounding.
			assert.InEpsilon(t, results[0].accepted, results[1].accepted, 0.02, "%s %s %s: backends disagree", sc.name, sc.server, pol.name)
		}
	}
	t.Log(sb.String())
}

// simBackend is a token bucket whose clock a simulation sets.
type simBackend struct {
	name string
	new  func(l bucket.Limit, opts ...bucket.Option) bucket.Bucket
	set  func(time.Time)
}

func simBackends(t *testing.T) []simBackend {
	clk := &fakeClock{t: epoch}
	srv := newClockedRedis(t, epoch)
	n := 0
	return []simBackend{
		{
			name: "local",
			new: func(l bucket.Limit, opts ...bucket.Option) bucket.Bucket {
				return bucket.NewLocal(l, append(opts, bucket.WithClock(clk))...)
			},
			set: func(at time.Time) { clk.mu.Lock(); clk.t = at; clk.mu.Unlock() },
		},
		{
			name: "redis",
			new: func(l bucket.Limit, opts ...bucket.Option) bucket.Bucket {
				n++ // a fresh prefix: the server's clock goes back for each run
				// Failing over to a Local bucket on the system clock would
				// void the simulation.
				return bucket.NewRedis(srv.rdb, l, append(opts, bucket.WithPrefix(fmt.Sprint("sim", n)),
					bucket.WithFailClosed(), bucket.WithRedisTimeout(time.Minute))...)
			},
			set: srv.clock.Set,
		},
	}
}
