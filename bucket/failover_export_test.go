package bucket

import "time"

// WithMemberID makes a bucket count in its fleet as id instead of as this
// process, so that one test process can play several members.
func WithMemberID(id string) Option {
	return option{"test", forShared, func(c *config) { c.redis.memberID = id }}
}

// Members returns the fleet size that a Redis-backed bucket counted last
// (0: not yet).
func Members(b Bucket) int64 {
	switch b := b.(type) {
	case *Redis:
		return b.fo.members.Load()
	case *FixedWindow:
		return b.fo.members.Load()
	case *SlidingLog:
		return b.fo.members.Load()
	}
	return 0
}

// WithPolicyCheckEvery makes a bucket read the servers' maxmemory-policy
// again every d, not every minute.
func WithPolicyCheckEvery(d time.Duration) Option {
	return option{"test", forShared, func(c *config) { c.redis.policyEvery = d }}
}
