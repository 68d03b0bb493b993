package bucket_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
)

// TestShortArrayReplyIsAnError: a reserve reply that is an array of fewer
// than two elements (a proxy's, a server's bug) is an error, not a panic:
// reservation read v[0] and v[1] before it checked the length.
func TestShortArrayReplyIsAnError(t *testing.T) {
	for _, reply := range []string{"*0", "*1\r\n:5"} {
		t.Run(reply[:2], func(t *testing.T) {
			fake := startFakeRedis(t, ":0") // the first contact, then a reservation
			b := bucket.NewRedis(fastClient(t, fake.addr), bucket.PerSecond(10), bucket.WithEvictionAllowed(), bucket.WithFailClosed())
			_, err := b.Reserve(t.Context(), "k", bucket.N(1), time.Second)
			require.NoError(t, err)
			fake.reply.Store(&reply)
			require.NotPanics(t, func() { _, err = b.Reserve(t.Context(), "k", bucket.N(1), time.Second) })
			assert.ErrorContains(t, err, "unexpected reply")
		})
	}
}
