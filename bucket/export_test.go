package bucket

import "context"

// Len returns how many keys l holds state for.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// Queued returns how many callers wait for a slot of key.
func (l *LocalInFlight) Queued(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := l.keys[key]; k != nil {
		return len(k.queue)
	}
	return 0
}

// MaxCalls is how many calls of a key a Redis bucket has under way at
// most before its reservations queue (coalescer).
const MaxCalls = maxCalls

// RedisRates returns what Redis's rate gauge reads of key (the tokens
// script's rates), for TestLocalAgreesWithScripts.
func RedisRates(ctx context.Context, b Bucket, key string) (Cost, error) {
	_, rates, err := b.(*Redis).gauges(ctx, key)
	return rates, err
}
