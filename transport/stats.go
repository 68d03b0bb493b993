package transport

import (
	"maps"
	"sync"

	"github.com/sluicehq/sluice/bucket"
)

// Stats is what a Transport has charged its bucket since it was made, by
// dimension. What the bucket holds against this Transport's calls is
// Charged − Refunded + Debited.
type Stats struct {
	// Charged is what the attempts' reservations took, sent or not.
	Charged bucket.Cost
	// Refunded is what was given back: the charges of attempts that waited
	// and were not sent, and what calls cost less than their charge once
	// their usage was read (WithUsage).
	Refunded bucket.Cost
	// Debited is what calls cost beyond their charge, once their usage was
	// read. Refunded and Debited are as asked of the bucket, which takes at
	// most a burst at a time and ignores a dimension it does not limit.
	Debited bucket.Cost
}

// ledger keeps a Transport's Stats.
type ledger struct {
	mu sync.Mutex
	s  Stats
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
	return Stats{Charged: maps.Clone(t.ledger.s.Charged), Refunded: maps.Clone(t.ledger.s.Refunded),
		Debited: maps.Clone(t.ledger.s.Debited)}
}
