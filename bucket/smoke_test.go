package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/stretchr/testify/require"
)

const fleetWorkerEnv = "X"

func fleetWorker() int { return 0 }

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	mr.SetTime(time.Unix(1795000000, 123456000))
	for _, rdb := range []*redis.Client{redistest.Client(t), redis.NewClient(&redis.Options{Addr: mr.Addr()})} {
		b := bucket.NewRedis(rdb, bucket.PerSecond(10))
		for i := 0; i < 12; i++ {
			r, err := b.Reserve(ctx, "k", bucket.N(1), time.Second)
			require.NoError(t, err)
			t.Log(i, r)
		}
		tk, err := b.Tokens(ctx, "k")
		t.Log(tk, err)
		t.Log(rdb.HGetAll(ctx, "sluice:{k}:requests").Val(), rdb.PTTL(ctx, "sluice:{k}:requests").Val())
	}
}
