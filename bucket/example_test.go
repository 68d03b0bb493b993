package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// A bucket of 2 requests per second with a burst of 2: the third call
// reserves the slot half a second ahead instead of being refused.
func ExampleBucket_Reserve() {
	b := bucket.NewLocal(bucket.PerSecond(2))
	ctx := context.Background()
	for range 3 {
		r, _ := b.Reserve(ctx, "api", bucket.N(1), time.Second)
		fmt.Println(r.OK, r.Delay.Round(10*time.Millisecond))
	}
	r, _ := b.Reserve(ctx, "api", bucket.N(1), 0)
	fmt.Println(r.OK, r.RetryAfter.Round(10*time.Millisecond))
	// Output:
	// true 0s
	// true 0s
	// true 500ms
	// false 1s
}

// Wait sleeps until the reserved slot, or fails at once when the slot lies
// past the context's deadline.
func ExampleWait() {
	b := bucket.NewLocal(bucket.PerMinute(60), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(10_000)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	_, err := bucket.Wait(ctx, b, "openai", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 9_000})
	fmt.Println(err)
	_, err = bucket.Wait(ctx, b, "openai", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 9_000})
	fmt.Println(errors.Is(err, bucket.ErrDeadline))
	_, err = bucket.Wait(ctx, b, "openai", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 20_000})
	fmt.Println(errors.Is(err, bucket.ErrExceedsBurst))
	// Output:
	// <nil>
	// true
	// true
}
