package bucket

import "context"

// RedisRates returns what Redis's rate gauge reads of key (the tokens
// script's rates), for the review's differential tests.
func RedisRates(ctx context.Context, b Bucket, key string) (Cost, error) {
	_, rates, err := b.(*Redis).gauges(ctx, key)
	return rates, err
}
