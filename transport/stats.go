package transport

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/bucket"
)

// Stats is what a Transport has charged its bucket since it was made, by
// dimension, and the attempts it sent. What the bucket holds against this
// Transport's calls is Charged − Refunded + Debited, in the dimensions the
// bucket limits.
type Stats struct {
	// Sent is the attempts sent upstream, retries included: what the
	// server saw.
	Sent int64
	// Charged is what the attempts' reservations took, sent or not: an
	// attempt that waited and was not sent (its context ended, the breaker
	// was open) is charged and refunded; and a slot whose wait a pause
	// (a Retry-After) overtook is reserved again after it, the first slot
	// staying charged, as the bucket counts it spent. So Charged − Refunded
	// may exceed Sent by the slots that pauses overtook. A dimension the
	// cost charges and the bucket does not limit is counted here all the
	// same, though no bucket holds it.
	Charged bucket.Cost
	// Refunded is what was given back: the charges of attempts that waited
	// and were not sent, the charges but for the request of attempts
	// refused for rate or load (see WithUsage), and what calls cost less
	// than their charge once their usage was read (WithUsage).
	Refunded bucket.Cost
	// Debited is what calls cost beyond their charge, once their usage was
	// read. Refunded and Debited are as asked of the bucket, which takes at
	// most a burst at a time, and count only the dimensions the call's
	// cost charged: what a usage reports of another (the total tokens of
	// an Anthropic usage, beside its input and output tokens) goes to the
	// bucket, which ignores a dimension it does not limit, but not here.
	Debited bucket.Cost
}

// ledger keeps a Transport's Stats.
type ledger struct {
	mu   sync.Mutex
	s    Stats
	sent atomic.Int64
}

// add adds c to one of the ledger's columns, chosen by col.
func (l *ledger) add(col func(*Stats) *bucket.Cost, c bucket.Cost) {
	if len(c) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := col(&l.s)
	if *m == nil {
		*m = make(bucket.Cost, len(c))
	}
	for dim, v := range c {
		(*m)[dim] += v
	}
}

func charged(s *Stats) *bucket.Cost  { return &s.Charged }
func refunded(s *Stats) *bucket.Cost { return &s.Refunded }
func debited(s *Stats) *bucket.Cost  { return &s.Debited }

// Stats returns what t has charged, refunded and debited so far: the ledger
// a program prints to see what its calls cost, without a MeterProvider. It
// is safe to call while t is in use; the Costs returned are copies.
func (t *Transport) Stats() Stats {
	t.ledger.mu.Lock()
	defer t.ledger.mu.Unlock()
	return Stats{Sent: t.ledger.sent.Load(), Charged: maps.Clone(t.ledger.s.Charged),
		Refunded: maps.Clone(t.ledger.s.Refunded), Debited: maps.Clone(t.ledger.s.Debited)}
}
