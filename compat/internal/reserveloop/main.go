// Command reserveloop makes n reservations of one token on one key that
// always admits, with sluice's Local bucket or x/time/rate's Limiter, and
// nothing else: callgrind counts its instructions at two n, and their
// difference over the difference of n is the instructions per call
// (docs/performance.md gives the commands).
//
//	reserveloop sluice|x/time/rate n
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/bucket"
)

func main() {
	if len(os.Args) != 3 {
		fail("usage: reserveloop sluice|x/time/rate n")
	}
	n, err := strconv.Atoi(os.Args[2])
	if err != nil || n < 0 {
		fail("reserveloop: n must be a whole number >= 0")
	}
	switch os.Args[1] {
	case "sluice":
		ctx := context.Background()
		b := bucket.NewLocal(bucket.Limit{Rate: 1e6, Burst: 1e6})
		cost := bucket.N(1)
		for range n {
			if r, err := b.Reserve(ctx, "bench", cost, 0); err != nil || !r.OK {
				fail(fmt.Sprintf("reserveloop: refused: %+v, %v", r, err))
			}
		}
	case "x/time/rate":
		lim := rate.NewLimiter(1e6, 1e6)
		for range n {
			if !lim.ReserveN(time.Now(), 1).OK() {
				fail("reserveloop: refused")
			}
		}
	default:
		fail("reserveloop: unknown peer " + strconv.Quote(os.Args[1]))
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(2)
}
