package transport_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
	"github.com/sony/gobreaker/v2"
)

func Example() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello")
	}))
	defer api.Close()

	client := &http.Client{Transport: transport.New(nil,
		transport.WithBucket(bucket.NewLocal(bucket.PerSecond(20))),
		transport.WithRetry(transport.Retry{MaxAttempts: 4}),
		transport.WithBreaker(gobreaker.Settings{Name: "api", Timeout: 30 * time.Second}),
	)}
	resp, err := client.Get(api.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, string(body))
	// Output: 200 OK hello
}

func ExampleCredentialKey() {
	req, _ := http.NewRequest("POST", "https://api.openai.com/v1/chat/completions", nil)
	req.Header.Set("Authorization", "Bearer sk-example")
	fmt.Println(transport.CredentialKey(req))
	// Output: https://api.openai.com#f2d4b279b82a
}

func ExampleWithInFlight() {
	var in, most atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		now := in.Add(1)
		defer in.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		time.Sleep(10 * time.Millisecond)
		io.WriteString(w, "data: done\n\n")
	}))
	defer api.Close()

	// bucket.NewInFlight(rdb, 2) for at most 2 across the fleet.
	client := &http.Client{Transport: transport.New(nil, transport.WithInFlight(bucket.NewLocalInFlight(2)))}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			resp, err := client.Get(api.URL)
			if err != nil {
				fmt.Println(err)
				return
			}
			io.Copy(io.Discard, resp.Body) // the slot is given back at the end of the body
			resp.Body.Close()
		})
	}
	wg.Wait()
	fmt.Println("at most", most.Load(), "in flight")
	// Output: at most 2 in flight
}
