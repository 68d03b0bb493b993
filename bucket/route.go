package bucket

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// Routed is a Bucket that charges each key to the bucket of its class: a
// plan of limits by model, say, or by a tenant's tier, behind one
// Transport. Each key is one bucket's, so every call is still one atomic
// decision over all the dimensions and windows of its key. Routed is safe
// for concurrent use if its buckets and its class function are.
type Routed struct {
	class   func(key string) string
	buckets map[string]Bucket
	def     Bucket
	waiting refunds // of its waiters (WaitMax)
}

var _ Bucket = (*Routed)(nil)

// Route returns a Routed bucket: key goes to buckets[class(key)], or to
// def if buckets has no such class. Give the Redis buckets of a plan the
// same Redis and prefix: a key's state is the same whichever process
// charges it, as long as every process routes it to the same limits (see
// NewRedis on processes whose limits differ). Buckets that record through
// one MeterProvider need WithMetricAttributes of their own (the class, say):
// the gauges of buckets with the same attributes overwrite one another. It
// panics if class or def is nil, or a bucket is.
//
//	b := bucket.Route(llmclient.KeyModel, map[string]bucket.Bucket{
//		"gpt-4.1":      bucket.NewRedis(rdb, bucket.PerMinute(500), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(30_000)),
//			bucket.WithWindow(bucket.Requests, bucket.PerDay(10_000))),
//		"gpt-4.1-mini": bucket.NewRedis(rdb, bucket.PerMinute(500), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(200_000))),
//	}, bucket.NewRedis(rdb, bucket.PerMinute(60), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(10_000))))
func Route(class func(key string) string, buckets map[string]Bucket, def Bucket) *Routed {
	if class == nil || def == nil {
		panic("bucket: Route needs a class function and a default bucket")
	}
	m := make(map[string]Bucket, len(buckets))
	for c, b := range buckets {
		if b == nil {
			panic(fmt.Sprintf("bucket: Route: class %q has no bucket", c))
		}
		m[c] = b
	}
	return &Routed{class: class, buckets: m, def: def}
}

// For returns the bucket that key is charged to.
func (r *Routed) For(key string) Bucket {
	if b, ok := r.buckets[r.class(key)]; ok {
		return b
	}
	return r.def
}

// reserveAt implements moveUp on key's bucket.
func (r *Routed) reserveAt(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, slotMove, error) {
	b := r.For(key)
	if m, ok := b.(moveUp); ok {
		return m.reserveAt(ctx, key, cost, maxWait)
	}
	res, err := b.Reserve(ctx, key, cost, maxWait)
	return res, slotMove{}, err
}

// shared implements moveUp: key's bucket's.
func (r *Routed) shared(key string) bool {
	m, ok := r.For(key).(moveUp)
	return !ok || m.shared(key)
}

// waiters implements moveUp: key's bucket's.
func (r *Routed) waiters(key string) *waiters {
	if m, ok := r.For(key).(moveUp); ok {
		return m.waiters(key)
	}
	return nil // its Reserve counts them
}

// earliest implements moveUp on key's bucket, if it can.
func (r *Routed) earliest(ctx context.Context, key string, cost Cost) (queue, error) {
	if m, ok := r.For(key).(moveUp); ok {
		return m.earliest(ctx, key, cost)
	}
	return queue{end: time.Now().Add(Unlimited / 2)}, nil
}

// refunds implements moveUp: the refunds made through the Routed bucket.
func (r *Routed) refunds() *refunds { return &r.waiting }

// Reserve implements Bucket on key's bucket.
func (r *Routed) Reserve(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Reservation, error) {
	return r.For(key).Reserve(ctx, key, cost, maxWait)
}

// Adjust implements Bucket on key's bucket.
func (r *Routed) Adjust(ctx context.Context, key string, delta Cost) error {
	err := r.For(key).Adjust(ctx, key, delta)
	if err == nil {
		r.waiting.fire(key, delta)
	}
	return err
}

// Settle implements Settler on key's bucket.
func (r *Routed) Settle(ctx context.Context, key string, delta Cost) error {
	err := Settle(ctx, r.For(key), key, delta)
	if err == nil {
		r.waiting.fire(key, delta)
	}
	return err
}

// Observe implements Bucket on key's bucket.
func (r *Routed) Observe(ctx context.Context, key string, fb adaptive.Feedback) error {
	err := r.For(key).Observe(ctx, key, fb)
	if err == nil {
		r.waiting.accepted(key, fb)
	}
	return err
}
